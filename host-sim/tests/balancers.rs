//! Stand-in balancers (`Sim::set_balancer`): the same world behind Envoy's own load
//! balancers or a model of sglang-router, for the virtual-time quality bench. What a
//! user of those numbers relies on: the requests really skip the filter, each policy
//! routes as its namesake does, and a run with the filter's scrapes on ends once every
//! request is answered.

mod common;

use common::filter::with_scrape_cluster;
use common::*;
use host_sim::world::balancers::{CacheAware, LeastRequest, RoundRobin};
use host_sim::{ms, RequestSpec, Sim, SimConfig, SimpleUpstream, VllmConfig, SEC};
use serde_json::json;
use std::collections::BTreeMap;

/// Two workers, `eps` served by simple servers (TTFT 40 ms, ITL 5 ms). No ledger
/// invariant: with a stand-in balancer the filter counts nothing.
fn balanced_sim(eps: &[String], seed: u64) -> Sim {
    let cfg = SimConfig::new(&filter_config(eps, json!({})))
        .workers(2)
        .seed(seed);
    sim_serving(cfg, eps, |e| SimpleUpstream::new(e).ttft(ms(40)).itl(ms(5)))
}

#[test]
fn round_robin_spreads_evenly_and_the_filter_is_not_in_the_path() {
    let eps = endpoints(4);
    let mut sim = balanced_sim(&eps, 3);
    sim.set_balancer(Box::new(RoundRobin::new(3)));
    // One connection: one worker, one cursor.
    sim.add_requests((0..40).map(|i| {
        RequestSpec::completion(MODEL, &format!("q{i}"), 4, false)
            .on_connection(1)
            .at(ms(5) + i * ms(1))
    }));
    sim.run().unwrap();
    let per = per_endpoint(sim.outcomes());
    assert_eq!(
        per.values().copied().collect::<Vec<_>>(),
        vec![10; 4],
        "{per:?}"
    );
    for o in sim.outcomes() {
        assert_eq!(o.status, Some(200));
        assert!(
            o.header(SERVED_HEADER).is_none(),
            "the filter saw request {}: {:?}",
            o.id,
            o.headers
        );
    }
}

#[test]
fn least_request_steers_away_from_a_slow_server() {
    let eps = endpoints(2);
    let mut sim = Sim::new(SimConfig::new(&filter_config(&eps, json!({}))).seed(5)).unwrap();
    sim.add_endpoint(
        &eps[0],
        Box::new(SimpleUpstream::new(&eps[0]).ttft(ms(400))),
    );
    sim.add_endpoint(&eps[1], Box::new(SimpleUpstream::new(&eps[1]).ttft(ms(10))));
    sim.set_balancer(Box::new(LeastRequest::new(5)));
    sim.add_requests(
        (0..100).map(|i| RequestSpec::completion(MODEL, "q", 4, false).at(ms(5) + i * ms(5))),
    );
    sim.run().unwrap();
    let slow = per_endpoint(sim.outcomes())
        .get(&eps[0])
        .copied()
        .unwrap_or(0);
    // Two random choices, fewer active requests wins: the slow server's requests pile up
    // and it only wins when both draws land on it.
    assert!(slow < 40, "the slow server got {slow} of 100");
}

#[test]
fn cache_aware_keeps_each_shared_prefix_on_one_server() {
    let eps = endpoints(4);
    let mut sim = balanced_sim(&eps, 7);
    sim.set_balancer(Box::new(CacheAware::new()));
    let system: Vec<String> = (0..4)
        .map(|g| format!("group {g} system prompt ").repeat(40))
        .collect();
    sim.add_requests((0..80).map(|i| {
        RequestSpec::completion(
            MODEL,
            &format!("{}question {i}", system[i as usize % 4]),
            4,
            true,
        )
        .label(&format!("g{}", i % 4))
        .at(ms(5) + i * ms(20))
    }));
    sim.run().unwrap();
    let mut servers: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for o in sim.outcomes() {
        servers
            .entry(o.label.as_str())
            .or_default()
            .push(o.endpoint.as_deref().unwrap_or("none"));
    }
    for (group, eps) in &servers {
        let mut distinct = eps.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 1, "{group} went to {distinct:?}");
    }
}

#[test]
fn a_run_with_scrapes_on_ends_when_every_request_is_answered() {
    let eps = endpoints(2);
    let cfg = with_scrape_cluster(SimConfig::new(&filter_config(&eps, json!({}))).seed(9));
    let mut sim = Sim::new(cfg).unwrap();
    for (i, e) in eps.iter().enumerate() {
        sim.add_endpoint(e, Box::new(VllmConfig::new(e).seed(i as u64).build()));
    }
    sim.add_requests(
        (0..10).map(|i| RequestSpec::completion(MODEL, "hello", 8, true).at(ms(100) + i * ms(10))),
    );
    assert!(sim.run_until_answered(60 * SEC).unwrap());
    assert!(
        sim.now() < 5 * SEC,
        "stopped at {} ms although the scrapes go on forever",
        sim.now() / ms(1)
    );
    assert!(sim.outcomes().iter().all(|o| o.status == Some(200)));
}
