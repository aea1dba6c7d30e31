//! The checker itself: a violated invariant stops the run and says where; a stream the
//! filter pauses forever is reported as leaked.

mod common;

use common::*;
use host_sim::world::invariants::Invariant;
use host_sim::{ms, RequestSpec, SimConfig, SimpleUpstream, SEC};
use serde_json::json;

#[test]
fn a_violated_invariant_stops_the_run_naming_it_and_the_event() {
    let eps = endpoints(2);
    let mut sim = sim_with(
        SimConfig::new(&filter_config(&eps, json!({}))),
        &eps,
        SimpleUpstream::new,
    );
    // Deliberately too strict: at most 1 request in flight per endpoint.
    sim.add_invariant(Invariant::new("at most one in flight", |sim| {
        for ep in sim.endpoint_addresses() {
            if sim.in_flight(&ep) > 1 {
                return Err(format!("{ep} has {}", sim.in_flight(&ep)));
            }
        }
        Ok(())
    }));
    sim.add_requests(
        (0..6).map(|i| RequestSpec::completion(MODEL, &format!("{i}"), 2, false).at(ms(5))),
    );
    let err = sim.run().unwrap_err().to_string();
    assert!(
        err.contains("invariant `at most one in flight` violated"),
        "{err}"
    );
    assert!(
        err.contains("upstream-arrive") || err.contains("request-"),
        "{err}"
    );
}

#[test]
fn every_run_checks_its_invariants_unless_turned_off_explicitly() {
    // Whatever the build profile: a release test run checks as much as a debug one.
    let broken = |cfg: SimConfig| {
        let eps = endpoints(1);
        let mut sim = sim_with(cfg, &eps, SimpleUpstream::new);
        sim.add_invariant(Invariant::new("never", |_| Err("broken".into())));
        sim.add_requests([RequestSpec::completion(MODEL, "a", 2, false).at(ms(5))]);
        sim.run().map_err(|e| e.to_string())
    };
    let eps = endpoints(1);
    let on = broken(SimConfig::new(&filter_config(&eps, json!({})))).unwrap_err();
    assert!(on.contains("invariant `never` violated"), "{on}");
    // On: the run stops at the first event; off: only the end-of-run check sees it.
    assert!(on.contains("at t=0 ns"), "{on}");
    let off = broken(SimConfig::new(&filter_config(&eps, json!({}))).checks(false)).unwrap_err();
    assert!(off.contains("invariant `never` violated"), "{off}");
    assert!(!off.contains("at t=0 ns"), "{off}");
}

#[test]
fn without_allow_on_headers_stop_iteration_a_post_hangs_and_is_reported_as_leaked() {
    // Envoy turns Pause in the request headers into StopAllIteration: the filter never
    // sees the body, the request hangs until the stream idle timeout.
    let eps = endpoints(1);
    let mut cfg = SimConfig::new(&filter_config(&eps, json!({})));
    cfg.allow_on_headers_stop_iteration = false;
    cfg.stream_idle_timeout = 5 * SEC;
    let mut sim = sim_with(cfg, &eps, SimpleUpstream::new);
    sim.add_requests([RequestSpec::completion(MODEL, "hang", 2, false).at(ms(5))]);
    let err = sim.run().unwrap_err().to_string();
    assert!(
        err.contains("paused by the filter and never released"),
        "{err}"
    );
    assert_eq!(sim.outcome(0).status, Some(408));
    assert!(sim.outcome(0).finished_at.unwrap() >= 5 * SEC);
}
