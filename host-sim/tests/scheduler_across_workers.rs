//! The scheduler in host-sim's simulated 4-worker Envoy (virtual time, the real .wasm):
//! the prefix index is shared by all workers, so a request routed by one worker steers
//! the next pick on any other worker a few milliseconds later; bursts still spread.

mod common;

use common::{endpoints, filter_config, per_endpoint, sim_serving, MODEL};
use host_sim::{ms, RequestSpec, Sim, SimConfig, SimpleUpstream};
use serde_json::json;
use std::collections::BTreeSet;

/// Four workers, `eps` served by simple servers (TTFT 20 ms).
fn sim(seed: u64, eps: &[String]) -> Sim {
    let cfg = SimConfig::new(&filter_config(eps, json!({})))
        .workers(4)
        .seed(seed);
    sim_serving(cfg, eps, |e| SimpleUpstream::new(e).ttft(ms(20)))
}

#[test]
fn a_pick_on_one_worker_steers_the_next_pick_on_another_within_milliseconds() {
    let eps = endpoints(3);
    let prompt = "You are a careful assistant. Answer in French. ".repeat(12);
    for seed in 1..=5 {
        let mut sim = sim(seed, &eps);
        // One conversation prefix, a request every 2 ms on fresh connections (each lands on
        // a random worker), while the earlier ones are still in flight (TTFT 20 ms).
        sim.add_requests((0..16).map(|i| {
            RequestSpec::completion(MODEL, &format!("{prompt} question {i}"), 2, false)
                .at(ms(100 + 2 * i))
        }));
        sim.run().unwrap();
        let outcomes = sim.outcomes();
        let first = outcomes[0].endpoint.clone().expect("routed");
        let workers: BTreeSet<usize> = outcomes.iter().filter_map(|o| o.worker).collect();
        assert!(
            workers.len() >= 2,
            "seed {seed}: one worker only: {workers:?}"
        );
        for o in outcomes {
            assert_eq!(o.status, Some(200), "{}", o.text());
            assert_eq!(
                o.endpoint.as_deref(),
                Some(first.as_str()),
                "seed {seed}: request {} (worker {:?}) left the endpoint holding its prefix",
                o.id,
                o.worker
            );
        }
    }
}

#[test]
fn a_burst_of_unrelated_requests_spreads_across_workers_and_endpoints() {
    let eps = endpoints(3);
    let mut sim = sim(7, &eps);
    // 12 different short prompts at once: no prefix to follow, equal metrics; the
    // in-flight counts shared by all workers break the ties.
    sim.add_requests(
        (0..12).map(|i| RequestSpec::completion(MODEL, &format!("q{i}"), 2, false).at(ms(100))),
    );
    sim.run().unwrap();
    for o in sim.outcomes() {
        assert_eq!(o.status, Some(200), "{}", o.text());
    }
    let per_ep = per_endpoint(sim.outcomes());
    assert_eq!(
        per_ep.values().copied().collect::<Vec<_>>(),
        vec![4, 4, 4],
        "{per_ep:?}"
    );
}
