//! `precise-prefix-cache-scorer` in virtual time: `vllm-sim` engines publish their
//! KV-cache events, host-sim runs `kv-relay`'s state beside them
//! (`Sim::add_kv_relay`), and the real filter polls it. What a user relies on:
//!
//! * a gateway that starts while the servers' caches are warm (a restarted pod, a new
//!   replica) routes each known prefix to the server that holds it from its first
//!   snapshot of the relay, where the approximate index, empty, can only guess;
//! * under cache pressure (evictions), the blocks the picker credits the chosen server with
//!   are what that server then reports cached, where the approximate index, which cannot
//!   see evictions, over-predicts;
//! * a burst of requests for one new prefix, faster than the relay can report the first
//!   one's blocks, goes to one server (speculative entries), not across the servers that
//!   report holding the part they share.

mod common;

use common::*;
use host_sim::world::kv_relay::KvRelayConfig;
use host_sim::{ms, RequestSpec, Sim, SimConfig, VllmConfig, MS, SEC};
use serde_json::{json, Value};

/// A prompt of `blocks` blocks of 16 tokens (64 characters: vllm-sim's tokenizer reads 4
/// characters per token) unique to the 3-character `tag`.
fn prompt(tag: &str, blocks: usize) -> String {
    assert_eq!(tag.len(), 3);
    (0..blocks * 8).map(|i| format!("{tag}{i:04} ")).collect()
}

/// The filter with the approximate index (cached-token feedback on or off), or with the
/// KV events (`precise`).
fn config(eps: &[String], precise: bool, feedback: bool) -> String {
    let mut cfg: Value = serde_json::from_str(&filter_config(eps, json!({}))).unwrap();
    let scorer = if precise {
        json!({"type": "precise-prefix-cache-scorer",
               "parameters": {"relayCluster": "kv-relay", "pollIntervalMs": 100}})
    } else {
        json!({"type": "prefix-cache-scorer"})
    };
    let name = scorer["type"].clone();
    cfg["plugins"] = json!([
        {"type": "approx-prefix-cache-producer", "parameters": {"cachedTokensFeedback": feedback}},
        {"type": "queue-scorer"},
        scorer,
        {"type": "max-score-picker"}
    ]);
    cfg["schedulingProfiles"] = json!([{"name": "default", "plugins": [
        {"pluginRef": "queue-scorer", "weight": 1},
        {"pluginRef": name, "weight": 3},
        {"pluginRef": "max-score-picker"}]}]);
    cfg.to_string()
}

const GROUPS: usize = 8;
const BLOCKS: usize = 40;

/// Gateway 0 sends each of 8 prefixes to a server the test chooses (the subset header),
/// twice; gateway 1 starts at 5 s, empty, and is then sent each prefix once more.
/// Returns the sim and, per prefix, the server holding it.
fn restarted(precise: bool) -> (Sim, Vec<String>) {
    let eps = endpoints(8);
    let mut cfg = SimConfig::new(&config(&eps, precise, true))
        .workers(2)
        .replicas(2)
        .seed(11);
    cfg.replica_start = vec![0, 5 * SEC];
    // (The ledger invariant reads one gateway's ledger: not with two.)
    let mut sim = sim_serving(cfg, &eps, |addr| {
        let i: u64 = addr[7..addr.len() - 5].parse().unwrap();
        VllmConfig::new(addr).seed(i).kv_events(true).build()
    });
    sim.add_kv_relay(KvRelayConfig::new("kv-relay").lag(5 * MS));
    // Not where the rendezvous prior would put them: 3 is coprime with 8, a permutation.
    let home: Vec<String> = (0..GROUPS).map(|g| eps[(3 * g + 1) % 8].clone()).collect();
    let mut requests = Vec::new();
    for round in 0..2 {
        for (g, ep) in home.iter().enumerate() {
            let at = SEC + (round * GROUPS + g) as u64 * 150 * MS;
            let text = format!("{} q{round}", prompt(&format!("g{g:02}"), BLOCKS));
            requests.push(
                RequestSpec::completion(MODEL, &text, 4, false)
                    .at(at)
                    .to_replica(0)
                    .header("x-gateway-destination-endpoint-subset", ep),
            );
        }
    }
    for g in 0..GROUPS {
        let text = format!("{} again", prompt(&format!("g{g:02}"), BLOCKS));
        requests.push(
            RequestSpec::completion(MODEL, &text, 4, false)
                .at(6 * SEC + g as u64 * 150 * MS)
                .to_replica(1),
        );
    }
    sim.add_requests(requests);
    // (`run` would wait for the relay polls, which never stop.)
    assert!(sim.run_until_answered(60 * SEC).unwrap());
    for o in sim.outcomes() {
        assert_eq!(o.status, Some(200), "{}", o.text());
        assert_served_where_routed(o);
    }
    (sim, home)
}

#[test]
fn a_restarted_gateway_routes_known_prefixes_to_their_server_through_the_relay() {
    let (sim, home) = restarted(true);
    let relay_state = 2 * GROUPS;
    for (g, home) in home.iter().enumerate() {
        let i = relay_state + g;
        let o = sim.outcome(i);
        assert_eq!(o.replica, 1);
        assert_eq!(
            o.endpoint.as_deref(),
            Some(home.as_str()),
            "prefix {g}: the relay reports it on {home}"
        );
        assert!(
            cached_tokens(&sim, i) >= (BLOCKS as u64 - 1) * 16,
            "prefix {g}: {} cached tokens",
            cached_tokens(&sim, i)
        );
    }
    // The same with the approximate index only: the restarted gateway has seen none of
    // these prefixes, so it finds their server only by chance.
    let (blind, home) = restarted(false);
    let found = (0..GROUPS)
        .filter(|&g| blind.outcome(2 * GROUPS + g).endpoint.as_deref() == Some(home[g].as_str()))
        .count();
    assert!(
        found <= GROUPS / 2,
        "without the relay {found} of {GROUPS} prefixes found their server"
    );
}

/// 4 servers of 160 KV blocks (2,560 tokens each, 10,240 in all) and 24 prefixes of 640
/// tokens (15,360), asked for in a seeded order at 4 requests/s: servers evict. Returns
/// (predicted ÷ reported hit tokens, share of requests whose prediction held) from the
/// filter's feedback counters (counted with or without correction), and the hit rate.
fn under_pressure(precise: bool, feedback: bool) -> (f64, f64, f64) {
    let eps = endpoints(4);
    let cfg = SimConfig::new(&config(&eps, precise, feedback))
        .workers(2)
        .seed(5);
    let mut sim = sim_with(cfg, &eps, |addr| {
        let i: u64 = addr[7..addr.len() - 5].parse().unwrap();
        VllmConfig::new(addr)
            .seed(i)
            .kv_blocks(160)
            .max_num_seqs(8)
            .kv_events(true)
            .build()
    });
    sim.add_kv_relay(KvRelayConfig::new("kv-relay"));
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let requests: Vec<RequestSpec> = (0..240u64)
        .map(|i| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let g = (x >> 33) % 24;
            let text = format!("{} r{i:03}", prompt(&format!("p{g:02}"), BLOCKS));
            RequestSpec::completion(MODEL, &text, 8, false).at(ms(500) + i * 250 * MS)
        })
        .collect();
    let n = requests.len();
    sim.add_requests(requests);
    assert!(sim.run_until_answered(300 * SEC).unwrap());
    let (mut hit, mut prompt_tokens) = (0u64, 0u64);
    for i in 0..n {
        let o = sim.outcome(i);
        assert_eq!(o.status, Some(200), "{}", o.text());
        hit += cached_tokens(&sim, i);
        prompt_tokens += o.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    }
    let text = sim.prometheus();
    let m = |s: &str| host_sim::prometheus::value(&text, s).unwrap_or(0.0);
    let outcome = |o: &str| {
        m(&format!(
            "inference_extension_prefix_cache_feedback_total{{outcome=\"{o}\"}}"
        ))
    };
    let predicted = m("inference_extension_prefix_cache_predicted_hit_tokens_total{}");
    let reported = m("inference_extension_prefix_cache_reported_hit_tokens_total{}");
    assert_eq!(reported as u64, hit, "the counter sums the responses");
    let judged = outcome("confirmed") + outcome("evicted") + outcome("grown");
    assert!(judged > n as f64 / 2.0, "{judged} of {n} judged");
    (
        predicted / reported,
        outcome("confirmed") / judged,
        hit as f64 / prompt_tokens as f64,
    )
}

#[test]
fn under_evictions_kv_events_predict_the_servers_hits_better_than_the_index() {
    let (index_ratio, index_held, index_hits) = under_pressure(false, false);
    let (fed_ratio, fed_held, fed_hits) = under_pressure(false, true);
    let (events_ratio, events_held, events_hits) = under_pressure(true, true);
    eprintln!(
        "index {index_ratio:.2} {index_held:.2} {index_hits:.3}; feedback {fed_ratio:.2} {fed_held:.2} {fed_hits:.3}; events {events_ratio:.2} {events_held:.2} {events_hits:.3}"
    );
    assert!(
        index_ratio > 1.3,
        "the index credits evicted prefixes: predicted {index_ratio:.2}× the reported hits"
    );
    assert!(
        (events_ratio - 1.0).abs() < 0.15,
        "KV events: predicted {events_ratio:.2}× the reported hits"
    );
    assert!(
        events_held > index_held && events_held > fed_held,
        "predictions that held: events {events_held:.2}, index {index_held:.2}, feedback {fed_held:.2}"
    );
}

/// Two servers report holding a system prompt (each was sent it once); then, 2 s later,
/// 6 requests extending it with one new document arrive 10 ms apart on a 2-worker
/// gateway, within one relay poll. Returns the servers the burst went to and the cached
/// tokens the servers reported for it.
fn burst(speculative: bool) -> (Vec<String>, u64) {
    let eps = endpoints(4);
    let mut cfg: Value = serde_json::from_str(&config(&eps, true, true)).unwrap();
    cfg["plugins"][2]["parameters"] = json!({"relayCluster": "kv-relay",
        "pollIntervalMs": 200, "speculativeIndexing": speculative});
    let cfg = SimConfig::new(&cfg.to_string()).workers(2).seed(3);
    let mut sim = sim_with(cfg, &eps, |addr| {
        let i: u64 = addr[7..addr.len() - 5].parse().unwrap();
        VllmConfig::new(addr).seed(i).kv_events(true).build()
    });
    sim.add_kv_relay(KvRelayConfig::new("kv-relay").lag(5 * MS));
    let system = prompt("sys", 16);
    let mut requests: Vec<RequestSpec> = eps[..2]
        .iter()
        .enumerate()
        .map(|(i, ep)| {
            RequestSpec::completion(MODEL, &format!("{system} warm {i}"), 4, false)
                .at(SEC + i as u64 * 100 * MS)
                .header("x-gateway-destination-endpoint-subset", ep)
        })
        .collect();
    let document = prompt("doc", BLOCKS);
    let burst = 6;
    for i in 0..burst {
        let text = format!("{system}{document} question {i}");
        requests.push(RequestSpec::completion(MODEL, &text, 4, false).at(3 * SEC + i * 10 * MS));
    }
    sim.add_requests(requests);
    assert!(sim.run_until_answered(60 * SEC).unwrap());
    let mut went = Vec::new();
    let mut cached = 0;
    for i in 0..sim.outcomes().len() {
        let o = sim.outcome(i);
        assert_eq!(o.status, Some(200), "{}", o.text());
        assert_served_where_routed(o);
        if i >= 2 {
            went.push(o.endpoint.clone().unwrap());
            cached += cached_tokens(&sim, i);
        }
    }
    (went, cached)
}

#[test]
fn a_burst_for_a_new_prefix_goes_to_one_server_before_the_relay_reports_it() {
    let (went, cached) = burst(true);
    assert!(
        went.iter().all(|e| *e == went[0]),
        "the burst was spread over {went:?}"
    );
    // Without speculative entries both holders of the system prompt score the same until
    // the relay reports the document's blocks, and the load scorer spreads the burst.
    let (spread, cached_spread) = burst(false);
    eprintln!("speculative: {went:?} {cached} cached; without: {spread:?} {cached_spread} cached");
    assert!(
        spread.iter().any(|e| *e != spread[0]),
        "without speculation: {spread:?}"
    );
    assert!(
        cached > cached_spread,
        "{cached} vs {cached_spread} cached tokens"
    );
}
