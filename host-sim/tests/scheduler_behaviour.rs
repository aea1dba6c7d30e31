//! The scheduler's behaviour as a user of the gateway relies on it: the real
//! filter in a simulated multi-worker Envoy, in front of `vllm-sim` engines
//! (`VllmUpstream`) whose `/metrics` the filter's data layer scrapes through host-sim's
//! callouts. Every figure is deterministic per seed; the assertion messages carry the
//! observed figures.

mod common;

use common::filter::with_scrape_cluster;
use common::*;
use host_sim::world::upstream::{Emit, UpstreamRequest};
use host_sim::{ms, Control, Nanos, RequestSpec, Sim, SimConfig, Upstream, VllmConfig, SEC};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

/// What a server received: arrival time, path and headers of each request (scrapes are
/// answered by the host without reaching `start`).
type Seen = Rc<RefCell<Vec<(Nanos, String, Vec<(String, String)>)>>>;

/// A server that records the requests it receives and can rewrite its `/metrics` text.
struct Recording {
    inner: Box<dyn Upstream>,
    seen: Seen,
    rewrite: Option<Box<dyn Fn(String) -> String>>,
}

impl Upstream for Recording {
    fn start(&mut self, now: Nanos, id: u64, req: &UpstreamRequest) {
        self.seen
            .borrow_mut()
            .push((now, req.path.clone(), req.headers.clone()));
        self.inner.start(now, id, req);
    }
    fn cancel(&mut self, now: Nanos, id: u64) {
        self.inner.cancel(now, id);
    }
    fn next_wake(&self) -> Option<Nanos> {
        self.inner.next_wake()
    }
    fn poll(&mut self, now: Nanos, out: &mut Vec<Emit>) {
        self.inner.poll(now, out);
    }
    fn metrics(&mut self, now: Nanos) -> String {
        let text = self.inner.metrics(now);
        match &self.rewrite {
            Some(f) => f(text),
            None => text,
        }
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A calibrated engine (`h100-llama-8b`) with its own seed.
fn engine(addr: &str, seed: u64) -> VllmConfig {
    VllmConfig::new(addr)
        .profile("h100-llama-8b")
        .max_num_seqs(8)
        .seed(seed)
}

/// A sim with `workers` workers whose filter scrapes its servers' `/metrics`, the
/// ledger invariant installed; no endpoint yet.
fn new_sim(config: String, workers: usize, seed: u64) -> Sim {
    let cfg = with_scrape_cluster(SimConfig::new(&config).workers(workers).seed(seed));
    let mut sim = Sim::new(cfg).expect("sim starts");
    sim.add_invariant(within_ledger());
    sim
}

/// Requests per endpoint among those sent in `[from, to)`.
fn spread(sim: &Sim, from: Nanos, to: Nanos) -> BTreeMap<String, usize> {
    per_endpoint(
        sim.outcomes()
            .iter()
            .filter(|o| (from..to).contains(&o.sent_at)),
    )
}

// ---------------------------------------------------------------------------------------
// Load-aware picks from scraped metrics.

/// Once a scrape shows a server's long queue (`vllm:num_requests_waiting`), new requests
/// go to the two idle servers and none to it.
#[test]
fn a_server_with_a_long_queue_is_avoided_once_its_scrape_shows_it() {
    let eps = endpoints(3);
    let mut sim = new_sim(filter_config(&eps, json!({})), 4, 11);
    let busy = engine(&eps[0], 1).max_num_seqs(2).build().shared();
    sim.add_endpoint(&eps[0], Box::new(busy.clone()));
    for (i, e) in eps.iter().enumerate().skip(1) {
        sim.add_endpoint(e, Box::new(engine(e, 1 + i as u64).build()));
    }
    // 30 long requests pinned to the first server (the subset header), at 10 ms: two run,
    // 28 wait in its engine.
    sim.add_requests((0..30).map(|i| {
        RequestSpec::completion(MODEL, &format!("backlog {i}"), 400, true)
            .header("x-gateway-destination-endpoint-subset", &eps[0])
            .at(ms(10) + i)
    }));
    sim.run_until(ms(300)).unwrap();
    let s = busy.borrow().snapshot();
    assert!(s.waiting >= 20, "the backlog waits in the engine: {s:?}");
    // Then 40 unrelated requests, one every 20 ms, no subset.
    sim.add_requests((0..40).map(|i| {
        RequestSpec::completion(MODEL, &format!("fresh question number {i}"), 16, false)
            .at(ms(300) + i * ms(20))
    }));
    sim.run_until(10 * SEC).unwrap();
    let per = spread(&sim, ms(300), ms(1200));
    let total: usize = per.values().sum();
    let to_busy = per.get(&eps[0]).copied().unwrap_or(0);
    eprintln!("busy server waiting {}; new requests {per:?}", s.waiting);
    assert_eq!(total, 40, "{per:?}");
    assert_eq!(
        to_busy, 0,
        "new requests to the server with {} waiting: {per:?}",
        s.waiting
    );
    assert!(
        per.values().filter(|&&n| n >= 10).count() == 2,
        "the two idle servers share: {per:?}"
    );
}

/// Where requests of a cached prompt go when every server queues: 4 servers with 2 slots
/// each, three of them 9–10 deep, one running 2 and queueing nothing; the prompt's prefix
/// is cached on one of the deep ones (9 waiting).
fn saturated_pool_run(config: String) -> (String, BTreeMap<String, usize>) {
    let eps = endpoints(4);
    let mut sim = new_sim(config, 4, 13);
    for (i, e) in eps.iter().enumerate() {
        sim.add_endpoint(e, Box::new(engine(e, 1 + i as u64).max_num_seqs(2).build()));
    }
    let system: String = (0..500).map(|w| format!("sys{w:03} ")).collect();
    // The prompt's first request, pinned to the second server: cached there, learned.
    sim.add_requests([RequestSpec::completion(
        MODEL,
        &format!("{system} first question"),
        8,
        false,
    )
    .header("x-gateway-destination-endpoint-subset", &eps[1])
    .at(ms(10))]);
    sim.run_until(ms(400)).unwrap();
    // Long backlogs pinned to each server: 12, 11, 12 and 2 requests (2 run, the rest wait).
    let mut backlog = Vec::new();
    for (e, n) in eps.iter().zip([12u64, 11, 12, 2]) {
        backlog.extend((0..n).map(|i| {
            RequestSpec::completion(MODEL, &format!("backlog {e} {i}"), 400, true)
                .header("x-gateway-destination-endpoint-subset", e)
                .at(ms(400) + i)
        }));
    }
    sim.add_requests(backlog);
    sim.run_until(ms(700)).unwrap();
    // Then 10 more of the cached prompt, one every 20 ms.
    sim.add_requests((0..10).map(|i| {
        RequestSpec::completion(MODEL, &format!("{system} question {i}"), 8, false)
            .at(ms(700) + i * ms(20))
    }));
    sim.run_until(30 * SEC).unwrap();
    (eps[1].clone(), spread(&sim, ms(700), ms(1000)))
}

/// Past the pool's capacity most queues are above the utilization detector's bound of 5;
/// with the default profile a cached prompt still goes to its server while that server's
/// queue is within twice the pool's mean, instead of to the one server that scraped below
/// 5, which the reference's absolute bound alone leaves as the only candidate (the short
/// requests it gets keep its queue below 5).
#[test]
fn when_every_server_queues_a_cached_prompt_keeps_its_server() {
    let eps = endpoints(4);
    let (warm, per) = saturated_pool_run(filter_config(&eps, json!({})));
    eprintln!("default profile: {per:?}");
    assert_eq!(per.values().sum::<usize>(), 10, "{per:?}");
    assert!(
        per.get(&warm).copied().unwrap_or(0) >= 9,
        "the cached prompt goes to {warm}, which holds it: {per:?}"
    );
    // The same profile with the reference's absolute bound only.
    let mut absolute: Value = serde_json::from_str(&filter_config(&eps, json!({}))).unwrap();
    absolute["plugins"] = json!([
        {"type": "utilization-detector"},
        {"type": "queue-scorer"},
        {"type": "kv-cache-utilization-scorer"},
        {"type": "prefix-cache-scorer"}
    ]);
    absolute["schedulingProfiles"] = json!([{"name": "default", "plugins": [
        {"pluginRef": "utilization-detector"},
        {"pluginRef": "queue-scorer", "weight": 2},
        {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
        {"pluginRef": "prefix-cache-scorer", "weight": 3}
    ]}]);
    let (_, per) = saturated_pool_run(absolute.to_string());
    eprintln!("absolute bound only: {per:?}");
    assert!(
        per.get(&eps[3]).copied().unwrap_or(0) >= 9,
        "with the absolute bound alone they go to the shortest queue {}: {per:?}",
        eps[3]
    );
}

/// A server whose scrape shows a nearly full KV cache gets at most a quarter of new
/// requests (a third would be its fair share).
#[test]
fn a_server_with_a_full_kv_cache_is_avoided() {
    let eps = endpoints(3);
    let mut sim = new_sim(filter_config(&eps, json!({})), 4, 12);
    // 64 blocks of 16 tokens: eight ~100-token prompts with 400 tokens to write fill it.
    let full = engine(&eps[0], 1)
        .kv_blocks(64)
        .max_num_seqs(8)
        .build()
        .shared();
    sim.add_endpoint(&eps[0], Box::new(full.clone()));
    for (i, e) in eps.iter().enumerate().skip(1) {
        sim.add_endpoint(e, Box::new(engine(e, 1 + i as u64).build()));
    }
    let filler: String = (0..60).map(|i| format!("pad{i:02} ")).collect();
    sim.add_requests((0..8).map(|i| {
        RequestSpec::completion(MODEL, &format!("{i} {filler}"), 1000, true)
            .header("x-gateway-destination-endpoint-subset", &eps[0])
            .at(ms(10) + i)
    }));
    sim.run_until(ms(400)).unwrap();
    let s = full.borrow().snapshot();
    assert!(s.kv_usage > 0.5, "the KV cache fills: {s:?}");
    sim.add_requests((0..30).map(|i| {
        RequestSpec::completion(MODEL, &format!("another question {i}"), 16, false)
            .at(ms(400) + i * ms(20))
    }));
    sim.run_until(10 * SEC).unwrap();
    let per = spread(&sim, ms(400), ms(1000));
    let total: usize = per.values().sum();
    let to_full = per.get(&eps[0]).copied().unwrap_or(0);
    eprintln!("KV usage {:.3}; new requests {per:?}", s.kv_usage);
    assert_eq!(total, 30, "{per:?}");
    assert!(
        to_full * 4 <= total,
        "at most a quarter (fair share a third) to the server whose KV usage is {:.2}: {per:?}",
        s.kv_usage
    );
}

// ---------------------------------------------------------------------------------------
// Prefix-cache affinity.

struct PrefixRun {
    hit_rate: f64,
    per: BTreeMap<String, usize>,
}

/// 8 groups × 12 prompts sharing a ~1k-token system prompt per group, over 4 servers; the
/// hit rate is what the servers report in `usage.prompt_tokens_details.cached_tokens`.
fn shared_prefix_run(config: String, seed: u64) -> PrefixRun {
    let eps = endpoints(4);
    let mut sim = new_sim(config, 4, seed);
    for (i, e) in eps.iter().enumerate() {
        sim.add_endpoint(
            e,
            Box::new(engine(e, 1 + i as u64).max_num_seqs(16).build()),
        );
    }
    let systems: Vec<String> = (0..8)
        .map(|g| {
            (0..570)
                .map(|w| format!("g{g}w{w:03} "))
                .collect::<String>()
        })
        .collect();
    // A deterministic interleaving of the groups, one request every 25 ms.
    let mut order: Vec<usize> = (0..96).map(|k| k % 8).collect();
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    for i in (1..order.len()).rev() {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        order.swap(i, (x >> 33) as usize % (i + 1));
    }
    sim.add_requests(order.iter().enumerate().map(|(k, &g)| {
        RequestSpec::completion(
            MODEL,
            &format!("{} user question {k}", systems[g]),
            8,
            false,
        )
        .at(ms(200) + k as u64 * ms(25))
    }));
    sim.run_until(10 * SEC).unwrap();
    let (mut cached, mut prompt) = (0u64, 0u64);
    for o in sim.outcomes() {
        assert_eq!(o.status, Some(200), "{}", o.text());
        let v = o.json();
        cached += v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        prompt += v["usage"]["prompt_tokens"].as_u64().unwrap();
    }
    PrefixRun {
        hit_rate: cached as f64 / prompt as f64,
        per: per_endpoint(sim.outcomes()),
    }
}

/// With the default profile, a workload of shared system prompts hits the servers' prefix
/// caches over 80% of the time, far more than `random-picker`, without piling more than
/// twice its fair share on any server.
#[test]
fn a_shared_prefix_workload_hits_the_cache_far_more_with_the_default_profile() {
    let eps = endpoints(4);
    let default = shared_prefix_run(filter_config(&eps, json!({})), 5);
    let mut random: Value = serde_json::from_str(&filter_config(&eps, json!({}))).unwrap();
    random["plugins"] = json!([{"type": "random-picker"}]);
    let baseline = shared_prefix_run(random.to_string(), 5);
    eprintln!(
        "hit rate default {:.3} {:?}, random-picker {:.3} {:?}",
        default.hit_rate, default.per, baseline.hit_rate, baseline.per
    );
    assert!(
        default.hit_rate > 0.8,
        "default profile hit rate {:.3} ({:?}); random {:.3} ({:?})",
        default.hit_rate,
        default.per,
        baseline.hit_rate,
        baseline.per
    );
    assert!(
        default.hit_rate > baseline.hit_rate + 0.15,
        "default {:.3} vs random-picker {:.3}",
        default.hit_rate,
        baseline.hit_rate
    );
    // 96 requests over 4 servers: fair share 24, none gets more than twice that.
    assert_eq!(default.per.len(), 4, "{:?}", default.per);
    assert!(
        default.per.values().all(|&n| n <= 48),
        "no server past 2× its fair share: {:?}",
        default.per
    );
}

// ---------------------------------------------------------------------------------------
// LoRA affinity.

/// With `lora-affinity-scorer`, every request for an adapter goes to the server whose
/// `/metrics` says it runs that adapter.
#[test]
fn requests_for_a_lora_adapter_go_to_the_server_running_it() {
    let eps = endpoints(3);
    let mut cfg: Value = serde_json::from_str(&filter_config(&eps, json!({}))).unwrap();
    cfg["plugins"] = json!([
        {"type": "lora-affinity-scorer"}, {"type": "queue-scorer"}, {"type": "max-score-picker"}
    ]);
    cfg["schedulingProfiles"] = json!([{"name": "default", "plugins": [
        {"pluginRef": "lora-affinity-scorer", "weight": 3},
        {"pluginRef": "queue-scorer", "weight": 1},
        {"pluginRef": "max-score-picker"}]}]);
    let mut sim = new_sim(cfg.to_string(), 4, 21);
    // `VllmUpstream` has no way to load an adapter (no `--lora-modules`, no
    // `/v1/load_lora_adapter`), so the second server serves the adapter's name as an alias
    // and its `/metrics` says the adapter runs; the others run another adapter.
    for (i, e) in eps.iter().enumerate() {
        let mut c = engine(e, 1 + i as u64);
        let running = if i == 1 {
            c.served_model_names = vec![MODEL.into(), "sql-lora".into()];
            "sql-lora"
        } else {
            "other-lora"
        };
        let line = format!(
            "vllm:lora_requests_info{{max_lora=\"1\",running_lora_adapters=\"{running}\",waiting_lora_adapters=\"\"}}"
        );
        sim.add_endpoint(
            e,
            Box::new(Recording {
                inner: Box::new(c.build()),
                seen: Seen::default(),
                rewrite: Some(Box::new(move |text: String| {
                    text.lines()
                        .map(|l| {
                            if l.starts_with("vllm:lora_requests_info{") {
                                let v = l.rsplit(' ').next().unwrap_or("1");
                                format!("{line} {v}")
                            } else {
                                l.to_string()
                            }
                        })
                        .collect::<Vec<_>>()
                        .join("\n")
                        + "\n"
                })),
            }),
        );
    }
    sim.add_requests((0..20).map(|i| {
        RequestSpec::completion("sql-lora", &format!("select {i}"), 8, false)
            .at(ms(300) + i * ms(15))
    }));
    sim.run_until(10 * SEC).unwrap();
    let per = spread(&sim, 0, 10 * SEC);
    let statuses: Vec<_> = sim.outcomes().iter().map(|o| o.status).collect();
    assert_eq!(
        per.get(&eps[1]).copied(),
        Some(20),
        "all adapter requests on the server running it: {per:?} {statuses:?}"
    );
    assert!(statuses.iter().all(|s| *s == Some(200)), "{statuses:?}");
}

// ---------------------------------------------------------------------------------------
// Prefill/decode disaggregation.

/// With the prefill and decode filters, a long uncached prompt is sent to a decode
/// server with `x-prefiller-host-port` naming a prefill server; a short prompt is not.
#[test]
fn a_long_uncached_prompt_is_prefilled_on_a_prefill_server_and_decoded_on_a_decode_server() {
    let eps = endpoints(3);
    let cfg = json!({
        "plugins": [
            {"type": "prefill-endpoints-filter"}, {"type": "decode-endpoints-filter"},
            {"type": "prefix-cache-scorer"}, {"type": "queue-scorer"}, {"type": "max-score-picker"},
            {"type": "prefix-based-pd-decider", "parameters": {"nonCachedTokens": 64}},
            {"type": "disagg-profile-handler", "parameters": {"deciders": {"prefill": "prefix-based-pd-decider"}}}
        ],
        "schedulingProfiles": [
            {"name": "prefill", "plugins": [{"pluginRef": "prefill-endpoints-filter"}, {"pluginRef": "queue-scorer"}]},
            {"name": "decode", "plugins": [{"pluginRef": "decode-endpoints-filter"},
                {"pluginRef": "prefix-cache-scorer", "weight": 3}, {"pluginRef": "queue-scorer"}]}
        ],
        "pool": {"endpoints": [
            {"address": eps[0], "labels": {"llm-d.ai/role": "prefill"}},
            {"address": eps[1], "labels": {"llm-d.ai/role": "decode"}},
            {"address": eps[2], "labels": {"llm-d.ai/role": "decode"}}
        ]}
    });
    let mut sim = new_sim(cfg.to_string(), 2, 31);
    let seen: Vec<Seen> = eps.iter().map(|_| Seen::default()).collect();
    for (i, e) in eps.iter().enumerate() {
        sim.add_endpoint(
            e,
            Box::new(Recording {
                inner: Box::new(engine(e, 1 + i as u64).build()),
                seen: seen[i].clone(),
                rewrite: None,
            }),
        );
    }
    let long: String = (0..600).map(|w| format!("doc{w:03} ")).collect();
    sim.add_requests([
        RequestSpec::completion(MODEL, &long, 8, false).at(ms(300)),
        RequestSpec::completion(MODEL, "hi", 8, false).at(ms(900)),
    ]);
    sim.run_until(10 * SEC).unwrap();
    let long_o = sim.outcome(0);
    assert_eq!(long_o.status, Some(200), "{}", long_o.text());
    let dest = long_o.endpoint.clone().unwrap();
    assert!(
        dest == eps[1] || dest == eps[2],
        "decode destination, got {dest}"
    );
    let idx = eps.iter().position(|e| *e == dest).unwrap();
    let got = seen[idx].borrow();
    let (_, _, h) = got
        .iter()
        .find(|(t, _, _)| (ms(300)..ms(900)).contains(t))
        .expect("the decode server received the long prompt");
    assert_eq!(
        header(h, "x-prefiller-host-port"),
        Some(eps[0].as_str()),
        "the decode server is told the prefill endpoint: {h:?}"
    );
    // The short prompt is below `nonCachedTokens`: decode only, no prefiller header.
    let short = sim.outcome(1);
    assert_eq!(short.status, Some(200), "{}", short.text());
    let sdest = short.endpoint.clone().unwrap();
    assert_ne!(sdest, eps[0], "a short prompt goes to a decode server");
    let sidx = eps.iter().position(|e| *e == sdest).unwrap();
    let sgot = seen[sidx].borrow();
    let (_, _, sh) = sgot
        .iter()
        .find(|(t, _, _)| *t >= ms(900))
        .expect("received the short prompt");
    assert_eq!(header(sh, "x-prefiller-host-port"), None, "{sh:?}");
}

/// E/P/D (llm-d-router's `disagg-profile-handler` with an encode decider): a chat request
/// with an image part reaches its decode server with `x-encoder-hosts-ports` naming the
/// encode server; a text-only request does not, and a client's own value is not passed on.
#[test]
fn a_multimodal_request_names_its_encoder_and_a_text_request_does_not() {
    let eps = endpoints(2);
    let cfg = json!({
        "apiVersion": "llm-d.ai/v1alpha1",
        "plugins": [
            {"type": "encode-filter"}, {"type": "decode-filter"}, {"type": "queue-scorer"},
            {"type": "always-disagg-multimodal-decider"},
            {"type": "disagg-profile-handler", "parameters": {"deciders": {"encode": "always-disagg-multimodal-decider"}}}
        ],
        "schedulingProfiles": [
            {"name": "encode", "plugins": [{"pluginRef": "encode-filter"}]},
            {"name": "decode", "plugins": [{"pluginRef": "decode-filter"}, {"pluginRef": "queue-scorer"}]}
        ],
        "pool": {"endpoints": [
            {"address": eps[0], "labels": {"llm-d.ai/role": "encode"}},
            {"address": eps[1], "labels": {"llm-d.ai/role": "decode"}}
        ]}
    });
    let mut sim = new_sim(cfg.to_string(), 2, 37);
    let seen: Vec<Seen> = eps.iter().map(|_| Seen::default()).collect();
    for (i, e) in eps.iter().enumerate() {
        sim.add_endpoint(
            e,
            Box::new(Recording {
                inner: Box::new(engine(e, 1 + i as u64).build()),
                seen: seen[i].clone(),
                rewrite: None,
            }),
        );
    }
    let chat = |content: Value| {
        json!({"model": MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": content}]})
        .to_string()
    };
    let image = chat(json!([
        {"type": "text", "text": "what is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    ]));
    let text = chat(json!("say \"image_url\" twice"));
    sim.add_requests([
        RequestSpec::post("/v1/chat/completions", image).at(ms(300)),
        RequestSpec::post("/v1/chat/completions", text)
            .header("x-encoder-hosts-ports", "6.6.6.6:1")
            .at(ms(600)),
    ]);
    sim.run_until(5 * SEC).unwrap();
    for i in 0..2 {
        assert_eq!(sim.outcome(i).endpoint.as_deref(), Some(eps[1].as_str()));
    }
    let got = seen[1].borrow();
    let at = |from: Nanos, to: Nanos| {
        got.iter()
            .find(|(t, _, _)| (from..to).contains(t))
            .map(|(_, _, h)| h.clone())
            .expect("the decode server received it")
    };
    let h = at(ms(300), ms(600));
    assert_eq!(
        header(&h, "x-encoder-hosts-ports"),
        Some(eps[0].as_str()),
        "{h:?}"
    );
    let h = at(ms(600), 5 * SEC);
    assert_eq!(header(&h, "x-encoder-hosts-ports"), None, "{h:?}");
}

/// `session-affinity-filter` with the `session_id` strategy: every request of a
/// conversation goes to one server whichever worker takes it and however loaded it is,
/// and the conversations spread over the servers.
#[test]
fn the_requests_of_a_session_stay_on_one_server() {
    let eps = endpoints(3);
    let cfg = json!({
        "plugins": [
            {"type": "session-affinity-filter", "parameters": {"strategy": "session_id",
                "sessionIdConfig": {"sources": [{"header": "x-conversation"}]}}},
            {"type": "queue-scorer"}
        ],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": "session-affinity-filter"}, {"pluginRef": "queue-scorer"}]}],
        "pool": {"endpoints": eps}
    });
    let mut sim = new_sim(cfg.to_string(), 4, 43);
    for (i, e) in eps.iter().enumerate() {
        sim.add_endpoint(e, Box::new(engine(e, 1 + i as u64).build()));
    }
    // 8 conversations × 12 turns, interleaved every 10 ms (the queues differ all along).
    sim.add_requests((0..96).map(|i| {
        let conv = i % 8;
        RequestSpec::completion(MODEL, &format!("turn {i}"), 32, false)
            .header("x-conversation", &format!("conversation-{conv}"))
            .label(&format!("c{conv}"))
            .at(ms(200) + i * ms(10))
    }));
    sim.run_until(20 * SEC).unwrap();
    let mut homes: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for o in sim.outcomes() {
        assert_eq!(o.status, Some(200), "{}", o.text());
        homes
            .entry(o.label.clone())
            .or_default()
            .insert(o.endpoint.clone().unwrap());
    }
    assert_eq!(homes.len(), 8);
    assert!(homes.values().all(|h| h.len() == 1), "{homes:?}");
    let used: std::collections::BTreeSet<_> = homes.values().flatten().collect();
    assert!(used.len() >= 2, "sessions spread: {homes:?}");
}

/// `topology-affinity-filter` in the prefill profile: the prefill server named to the
/// decode server is the one in the decode server's zone.
#[test]
fn the_prefill_server_is_chosen_in_the_decode_servers_zone() {
    let eps = endpoints(4);
    let zone =
        |z: &str, role: &str| json!({"llm-d.ai/role": role, "topology.kubernetes.io/zone": z});
    let cfg = json!({
        "plugins": [
            {"type": "prefill-filter"}, {"type": "decode-filter"}, {"type": "queue-scorer"},
            {"type": "topology-extractor"},
            {"type": "topology-affinity-filter", "parameters": {"minAffinity": "zone"}},
            {"type": "always-disagg-pd-decider"},
            {"type": "disagg-profile-handler", "parameters": {"deciders": {"prefill": "always-disagg-pd-decider"}}}
        ],
        "schedulingProfiles": [
            {"name": "prefill", "plugins": [{"pluginRef": "prefill-filter"},
                {"pluginRef": "topology-affinity-filter"}, {"pluginRef": "queue-scorer"}]},
            {"name": "decode", "plugins": [{"pluginRef": "decode-filter"}, {"pluginRef": "queue-scorer"}]}
        ],
        "pool": {"endpoints": [
            {"address": eps[0], "labels": zone("a", "prefill")},
            {"address": eps[1], "labels": zone("b", "prefill")},
            {"address": eps[2], "labels": zone("a", "decode")},
            {"address": eps[3], "labels": zone("b", "decode")}
        ]}
    });
    let mut sim = new_sim(cfg.to_string(), 2, 47);
    let seen: Vec<Seen> = eps.iter().map(|_| Seen::default()).collect();
    for (i, e) in eps.iter().enumerate() {
        sim.add_endpoint(
            e,
            Box::new(Recording {
                inner: Box::new(engine(e, 1 + i as u64).build()),
                seen: seen[i].clone(),
                rewrite: None,
            }),
        );
    }
    sim.add_requests((0..12).map(|i| {
        RequestSpec::completion(MODEL, &format!("q{i}"), 16, false).at(ms(300) + i * ms(20))
    }));
    sim.run_until(5 * SEC).unwrap();
    let mut pairs = 0;
    for (decode, prefill) in [(2, 0), (3, 1)] {
        for (_, _, h) in seen[decode].borrow().iter() {
            assert_eq!(
                header(h, "x-prefiller-host-port"),
                Some(eps[prefill].as_str()),
                "{h:?}"
            );
            pairs += 1;
        }
    }
    assert_eq!(pairs, 12, "both decode servers saw the requests");
}

// ---------------------------------------------------------------------------------------
// Servers leaving and returning.

/// A server that goes away stops receiving requests (its scrapes fail), and receives
/// again once it is back and answers its scrapes.
#[test]
fn a_server_that_leaves_stops_receiving_and_receives_again_when_it_returns() {
    let eps = endpoints(3);
    let mut sim = new_sim(filter_config(&eps, json!({})), 4, 41);
    for (i, e) in eps.iter().enumerate() {
        sim.add_endpoint(e, Box::new(engine(e, 1 + i as u64).build()));
    }
    // Overlapping requests (64 tokens ≈ 0.5 s each) every 15 ms from 100 ms to 3.1 s.
    sim.add_requests((0..200).map(|i| {
        RequestSpec::completion(MODEL, &format!("request {i}"), 64, false).at(ms(100) + i * ms(15))
    }));
    sim.at(SEC, Control::RemoveEndpoint(eps[2].clone()));
    sim.at(
        2 * SEC,
        Control::AddEndpoint(eps[2].clone(), Box::new(engine(&eps[2], 99).build())),
    );
    sim.run_until(10 * SEC).unwrap();
    let before = spread(&sim, ms(100), SEC);
    // A scrape round is 50 ms; give it two.
    let gone = spread(&sim, SEC + ms(100), 2 * SEC);
    let back = spread(&sim, 2 * SEC + ms(100), ms(3100));
    let failed_after: Vec<_> = sim
        .outcomes()
        .iter()
        .filter(|o| o.sent_at >= SEC + ms(100) && o.status != Some(200))
        .map(|o| (o.id, o.status, o.endpoint.clone()))
        .collect();
    eprintln!("before {before:?} gone {gone:?} back {back:?} failed {failed_after:?}");
    assert!(
        before.get(&eps[2]).copied().unwrap_or(0) >= 10,
        "{before:?}"
    );
    assert_eq!(
        gone.get(&eps[2]),
        None,
        "nothing to the removed server once its scrape failed: {gone:?}"
    );
    assert!(failed_after.is_empty(), "{failed_after:?}");
    assert!(
        back.get(&eps[2]).copied().unwrap_or(0) >= 10,
        "the returning server receives again: {back:?}"
    );
}

/// While no scrape callout can be dispatched at all, the filter keeps scoring every
/// server on its last snapshot: no request fails, and all three receive afterwards.
#[test]
fn while_no_scrape_can_be_sent_every_server_stays_a_candidate_on_its_last_snapshot() {
    // host-sim answers every `/metrics` callout to a live endpoint with 200, so one
    // server's scrape fails only when the whole server goes away (the test above: it
    // leaves the candidates until it answers again). Here every callout dispatch fails
    // for one second (`proxy_http_call` → InternalFailure): no scrape is sent, none
    // fails, and the filter keeps scoring on the last snapshots (as the reference's
    // scorers do with stale metrics): nothing is lost, and after the fault all three
    // servers receive again.
    let eps = endpoints(3);
    let mut sim = new_sim(filter_config(&eps, json!({})), 4, 51);
    for (i, e) in eps.iter().enumerate() {
        sim.add_endpoint(e, Box::new(engine(e, 1 + i as u64).build()));
    }
    sim.add_requests((0..150).map(|i| {
        RequestSpec::completion(MODEL, &format!("request {i}"), 16, false).at(ms(100) + i * ms(20))
    }));
    sim.add_fault(
        host_sim::Fault::new("proxy_http_call", host_sim::FaultAction::Status(10))
            .between(SEC, 2 * SEC),
    );
    sim.run_until(10 * SEC).unwrap();
    let during: BTreeMap<Option<u16>, usize> = sim
        .outcomes()
        .iter()
        .filter(|o| (SEC + ms(100)..2 * SEC).contains(&o.sent_at))
        .fold(BTreeMap::new(), |mut m, o| {
            *m.entry(o.status).or_default() += 1;
            m
        });
    let after = spread(&sim, 2 * SEC + ms(200), ms(3100));
    eprintln!(
        "during {during:?} after {after:?} fired {:?}",
        sim.faults_fired()
    );
    assert!(sim.faults_fired()[0] > 0);
    assert_eq!(
        during.get(&Some(200)).copied(),
        Some(45),
        "while no scrape can be sent, the last snapshots stay: {during:?}"
    );
    assert_eq!(after.len(), 3, "{after:?}");
}

// ---------------------------------------------------------------------------------------
// x-request-id.

/// A request without `x-request-id` reaches the server with a generated one (a UUID, one
/// per request), as the reference's EPP adds it; a client's own id is passed on as is.
/// (Here Envoy's connection manager is told not to generate it: `generate_request_id`.)
#[test]
fn a_request_without_an_id_gets_one_and_a_clients_id_is_kept() {
    let eps = endpoints(1);
    let cfg = json!({"pool": {"endpoints": eps}});
    let mut config = with_scrape_cluster(SimConfig::new(&cfg.to_string()).workers(2).seed(5));
    config.generate_request_id = false;
    let mut sim = Sim::new(config).unwrap();
    sim.add_invariant(within_ledger());
    let seen = Seen::default();
    sim.add_endpoint(
        &eps[0],
        Box::new(Recording {
            inner: Box::new(engine(&eps[0], 1).build()),
            seen: seen.clone(),
            rewrite: None,
        }),
    );
    sim.add_requests([
        RequestSpec::completion(MODEL, "one", 2, false).at(ms(100)),
        RequestSpec::completion(MODEL, "two", 2, false).at(ms(110)),
        RequestSpec::completion(MODEL, "three", 2, false)
            .header("x-request-id", "client-chosen-id")
            .at(ms(120)),
    ]);
    sim.run_until(5 * SEC).unwrap();
    let got = seen.borrow();
    let ids: Vec<&str> = got
        .iter()
        .filter(|(_, path, _)| path == "/v1/completions")
        .map(|(_, _, h)| header(h, "x-request-id").expect("every request has an id"))
        .collect();
    assert_eq!(ids.len(), 3);
    assert!(ids.contains(&"client-chosen-id"));
    let generated: Vec<&&str> = ids.iter().filter(|i| **i != "client-chosen-id").collect();
    assert_ne!(generated[0], generated[1]);
    for id in generated {
        assert_eq!(id.len(), 36, "{id}");
        assert_eq!(id.as_bytes()[14], b'4', "a version-4 UUID: {id}");
    }
}
