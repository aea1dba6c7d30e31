//! The real filter in a simulated Envoy in front of `vllm-sim` engines (calibrated
//! `h100-llama-8b` profile) in virtual time: what a user of the gateway sees.

mod common;

use common::*;
use host_sim::{ms, Final, Nanos, Poisson, RequestSpec, SimConfig, Upstream, VllmConfig, SEC};
use serde_json::json;
use std::collections::BTreeMap;

fn ttft(o: &host_sim::Outcome) -> Nanos {
    o.first_token_at.expect("a first token") - o.sent_at
}

fn poisson(seed: u64, count: usize, rate: f64) -> Vec<RequestSpec> {
    let mut w = Poisson::new(rate, count, MODEL);
    w.start = ms(10);
    w.prefix_groups = 4;
    w.max_tokens = (8, 24);
    w.generate(&mut host_sim::world::clock::Rng::new(seed, 9))
}

#[test]
fn engine_backed_servers_answer_through_the_filter_with_realistic_timing() {
    let eps = endpoints(4);
    let cfg = SimConfig::new(&filter_config(&eps, json!({})))
        .workers(4)
        .seed(3);
    let mut sim = sim_with(cfg, &eps, |a| {
        let i: u64 = a[7..8].parse().unwrap();
        VllmConfig::new(a)
            .profile("h100-llama-8b")
            .max_num_seqs(16)
            .seed(100 + i)
            .build()
    });
    sim.add_requests(poisson(3, 80, 40.0));
    sim.run().unwrap();
    let mut ttfts = Vec::new();
    for o in sim.outcomes() {
        assert_eq!(o.fin, Final::Response);
        assert_eq!(o.status, Some(200), "{}", o.text());
        assert_served_where_routed(o);
        assert_eq!(o.header("x-inference-port"), Some("8000"));
        let text = o.text();
        if o.header("content-type") == Some("text/event-stream; charset=utf-8") {
            assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
            ttfts.push(ttft(o));
        } else {
            let v = o.json();
            assert_eq!(v["object"], "text_completion");
            let n = v["usage"]["completion_tokens"].as_u64().unwrap();
            assert!((1..=24).contains(&n), "{v}");
        }
    }
    let per_ep = per_endpoint(sim.outcomes());
    assert_eq!(per_ep.len(), 4, "{per_ep:?}");
    assert!(per_ep.values().all(|&n| n >= 10), "spread: {per_ep:?}");
    // 30 ms prefill overhead + 250 µs per uncached prompt token (~50) + a decode step
    // or two of the running batch, with 15 % jitter.
    ttfts.sort_unstable();
    assert!(ttfts.len() >= 25, "{}", ttfts.len());
    let median = ttfts[ttfts.len() / 2];
    assert!(
        (ms(30)..ms(90)).contains(&median),
        "median TTFT {median} ns"
    );
    assert!(ttfts[0] >= ms(20), "{ttfts:?}");
    assert!(*ttfts.last().unwrap() < ms(150), "{ttfts:?}");
    assert_eq!(running_requests(&sim), 0.0);
}

#[test]
fn a_repeated_prefix_comes_back_with_cached_tokens_through_the_filter() {
    let eps = endpoints(1);
    let cfg = SimConfig::new(&filter_config(&eps, json!({}))).workers(2);
    let mut sim = sim_with(cfg, &eps, |a| VllmConfig::new(a).build());
    let prefix: String = (0..100).map(|i| format!("ctx{i:03} ")).collect();
    sim.add_requests([
        RequestSpec::completion(MODEL, &format!("{prefix}first"), 4, false).at(ms(10)),
        RequestSpec::completion(MODEL, &format!("{prefix}second"), 4, false).at(SEC),
    ]);
    sim.run().unwrap();
    let cached = |i: usize| {
        sim.outcome(i).json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64()
    };
    assert_eq!(
        cached(0),
        None,
        "nothing cached: prompt_tokens_details is null"
    );
    assert_eq!(
        cached(1),
        Some(160),
        "the 10 full blocks of the shared 175-token prefix"
    );
    // The cached prefill (160 tokens × 250 µs) is time saved.
    let took = |i: usize| {
        let o = sim.outcome(i);
        o.finished_at.unwrap() - o.sent_at
    };
    assert!(took(1) + ms(30) < took(0), "{} vs {}", took(1), took(0));
}

#[test]
fn an_overloaded_server_queues_and_its_429s_reach_the_client() {
    let eps = endpoints(1);
    let cfg = SimConfig::new(&filter_config(&eps, json!({})))
        .workers(2)
        .seed(5);
    let server = VllmConfig::new(&eps[0])
        .max_num_seqs(2)
        .max_waiting(3)
        .seed(1)
        .build()
        .shared();
    let mut sim = sim_with(cfg, &eps, |_| server.clone());
    sim.add_requests((0..12).map(|i| {
        RequestSpec::completion(MODEL, &format!("busy {i}"), 32, i % 2 == 0).at(ms(10) + i as u64)
    }));
    // All twelve reach the server at about 10 ms: the first is admitted by the engine's
    // first step (a ~30 ms prefill), three wait, the queue is then full.
    sim.run_until(ms(20)).unwrap();
    let text = server.clone().metrics(sim.now());
    let gauge = |name: &str| {
        host_sim::prometheus::value(&text, &format!("vllm:{name}{{model_name=\"{MODEL}\"}}"))
            .unwrap_or_else(|| panic!("{name} in {text}"))
    };
    assert_eq!(gauge("num_requests_running"), 1.0);
    assert_eq!(gauge("num_requests_waiting"), 3.0);
    sim.run().unwrap();
    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    for o in sim.outcomes() {
        let status = o.status.expect("answered");
        *by_status.entry(status).or_default() += 1;
        if status == 429 {
            assert_eq!(o.json()["error"]["type"], "RateLimitError", "{}", o.text());
            assert_eq!(
                o.json()["error"]["message"],
                "Failed to enqueue request, waiting requests queue is full"
            );
            assert_eq!(o.header("x-sim-server"), Some(eps[0].as_str()));
        }
    }
    assert_eq!(by_status.get(&200), Some(&4), "{by_status:?}");
    assert_eq!(by_status.get(&429), Some(&8), "{by_status:?}");
    let s = server.borrow().snapshot();
    assert_eq!((s.running, s.waiting), (0, 0));
    assert_eq!(running_requests(&sim), 0.0);
}

/// Status, body and end time of every request.
type Answers = Vec<(Option<u16>, Vec<u8>, Option<Nanos>)>;

fn run_once(seed: u64) -> (u64, Answers) {
    let eps = endpoints(3);
    let cfg = SimConfig::new(&filter_config(&eps, json!({})))
        .workers(2)
        .seed(seed);
    let mut sim = sim_with(cfg, &eps, |a| VllmConfig::new(a).seed(seed).build());
    sim.add_requests(poisson(seed, 30, 60.0));
    sim.run().unwrap();
    let out = sim
        .outcomes()
        .iter()
        .map(|o| (o.status, o.body.clone(), o.finished_at))
        .collect();
    (sim.trace_hash(), out)
}

#[test]
fn the_same_seed_replays_the_same_run_with_engine_backed_servers() {
    let a = run_once(21);
    assert!(a.1.iter().all(|(s, ..)| *s == Some(200)));
    assert_eq!(a, run_once(21));
    assert_ne!(a.0, run_once(22).0);
}
