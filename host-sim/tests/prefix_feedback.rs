//! Cached-token feedback: the real filter in a simulated Envoy in front of `vllm-sim`
//! engines in virtual time. A server that reports (in `usage.prompt_tokens_details`) a miss
//! on a prefix the filter's approximate index credited it with has evicted it, and with it
//! everything it was sent before: the picker stops crediting it.

mod common;

use common::*;
use host_sim::{RequestSpec, Sim, SimConfig, VllmConfig, SEC};
use serde_json::{json, Value};

/// A prompt of `blocks` blocks of 16 tokens (64 characters) unique to `tag`.
fn prompt(tag: &str, blocks: usize) -> String {
    (0..blocks * 8).map(|i| format!("{tag}{i:04} ")).collect()
}

fn config(eps: &[String], feedback: bool) -> String {
    let mut cfg: Value = serde_json::from_str(&filter_config(eps, json!({}))).unwrap();
    cfg["plugins"] = json!([
        {"type": "approx-prefix-cache-producer", "parameters": {
            "autoTune": false, "lruCapacityPerServer": 10000, "cachedTokensFeedback": feedback}},
        {"type": "prefix-cache-scorer"},
        {"type": "max-score-picker"}
    ]);
    cfg["schedulingProfiles"] = json!([{"name": "default", "plugins": [
        {"pluginRef": "prefix-cache-scorer", "weight": 1},
        {"pluginRef": "max-score-picker"}]}]);
    cfg.to_string()
}

/// Server A (64 KV blocks) is sent prompts P1 then P2 (twice: a hit, so the filter knows A
/// reports cached tokens — vLLM leaves them out when there are none), then enough other
/// prompts to evict both; server B holds the first half of P1. A request for P2 on A
/// reports the miss. Then a request for P1 goes wherever the picker thinks it is cached.
fn run(feedback: bool) -> Sim {
    let eps = endpoints(2);
    let (a, b) = (eps[0].clone(), eps[1].clone());
    let cfg = SimConfig::new(&config(&eps, feedback)).workers(2).seed(7);
    let mut sim = sim_with(cfg, &eps, |addr| {
        let c = VllmConfig::new(addr).seed(1);
        if addr == a {
            c.kv_blocks(64).build()
        } else {
            c.build()
        }
    });
    let (p1, p2) = (prompt("pa", 20), prompt("pb", 20));
    let on = |ep: &str, text: String, k: u64| {
        RequestSpec::completion(MODEL, &text, 4, false)
            .at(k * SEC)
            .header("x-gateway-destination-endpoint-subset", ep)
    };
    let mut requests = vec![
        on(&b, format!("{} half", &p1[..p1.len() / 2]), 1),
        on(&a, format!("{p1} one"), 2),
        on(&a, format!("{p2} one"), 3),
        on(&a, format!("{p2} again"), 4),
    ];
    for f in 0..6 {
        requests.push(on(&a, prompt(&format!("f{f}"), 20), 5 + f));
    }
    requests.push(on(&a, format!("{p2} two"), 11));
    requests.push(RequestSpec::completion(MODEL, &format!("{p1} two"), 4, false).at(12 * SEC));
    sim.add_requests(requests);
    sim.run().unwrap();
    for o in sim.outcomes() {
        assert_eq!(o.status, Some(200), "{}", o.text());
        assert_served_where_routed(o);
    }
    sim
}

#[test]
fn an_eviction_reported_by_a_server_stops_the_picker_from_crediting_it() {
    let eps = endpoints(2);
    // Without feedback the index still credits A with P1: the request goes there, and
    // A has nothing of it.
    let blind = run(false);
    assert!(cached_tokens(&blind, 3) > 0, "A reported a hit");
    assert_eq!(
        cached_tokens(&blind, 10),
        0,
        "A evicted P2 under the other prompts"
    );
    assert_eq!(blind.outcome(11).endpoint.as_deref(), Some(eps[0].as_str()));
    assert_eq!(cached_tokens(&blind, 11), 0);
    // With feedback, A's miss on P2 drops P2 and everything older (P1) from A: the
    // request goes to B, which holds half of P1.
    let fed = run(true);
    assert_eq!(fed.outcome(11).endpoint.as_deref(), Some(eps[1].as_str()));
    assert!(
        cached_tokens(&fed, 11) >= 100,
        "B's half of P1: {}",
        cached_tokens(&fed, 11)
    );
    assert_eq!(
        metric(
            &fed,
            "inference_extension_prefix_cache_feedback_total{outcome=\"evicted\"}"
        ),
        1.0
    );
    let predicted = metric(
        &fed,
        "inference_extension_prefix_cache_predicted_hit_tokens_total{}",
    );
    let reported = metric(
        &fed,
        "inference_extension_prefix_cache_reported_hit_tokens_total{}",
    );
    assert!(
        predicted > reported,
        "P2 was predicted on A and missed: {predicted} vs {reported}"
    );
    let reported_total: u64 = (0..fed.outcomes().len())
        .map(|i| cached_tokens(&fed, i))
        .sum();
    assert_eq!(reported as u64, reported_total);
}
