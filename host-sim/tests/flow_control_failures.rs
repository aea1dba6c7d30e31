//! Flow control when things go wrong, across 4 simulated Envoy workers:
//! clients leaving while parked (also while their grant is on its way to their worker),
//! a worker VM crashing while others hold parked requests, and a pool with no endpoint.
//! Seeded, invariant checker on, each also run with preemption.

mod common;

use common::endpoints;
use common::filter::{flow_state, with_scrape_cluster, VM_STALE_MS};
use common::flow_control::*;
use host_sim::{
    ms, Control, FailurePolicy, Fault, FaultAction, Final, Nanos, Sim, SimpleUpstream, SEC, US,
};
use serde_json::json;

// ---------------------------------------------------------------------------------------
// Clients leaving while parked.

const CANCEL_REQUESTS: usize = 160;
const LATE: usize = 8;

/// One endpoint with 4 slots (~25 ms per request, ~160/s), 160 requests offered at
/// 2,000/s over the workers; every other client gives up after a spread of times
/// (10–290 ms, µs apart), most of them while parked. Then 8 late requests at 3 s.
fn cancel_run(seed: u64, preempt: f64) -> Sim {
    let eps = endpoints(1);
    let cfg = sim_config(
        &fc_config(&eps, 4, json!({"defaultRequestTTL": "60s"}), &[]),
        seed,
        preempt,
    );
    let mut sim = fc_sim(cfg, &eps, 4, |a| {
        SimpleUpstream::new(a).ttft(ms(20)).itl(ms(2)).tokens(3)
    });
    sim.add_requests((0..CANCEL_REQUESTS).map(|i| {
        let at = ms(5) + 500 * US * i as u64;
        let spec = request(i, "standard", &format!("t{}", i % 5), 3).at(at);
        if i % 2 == 1 {
            spec.disconnect_after(ms(10) + US * ((i as u64 * 7_919 + seed * 131) % 280_000))
        } else {
            spec
        }
    }));
    sim.add_requests(
        (0..LATE).map(|i| request(1000 + i, "standard", "late", 3).at(3 * SEC + ms(i as u64))),
    );
    sim.run_until(2 * SEC)
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    sim
}

/// Clients that give up while parked (or while running) leave nothing of theirs in the
/// queue gauges or the record, are never answered, and the requests after them are
/// served.
#[test]
fn clients_leaving_while_parked_leave_no_residue_and_later_requests_are_served() {
    for (seed, preempt) in all_seeds() {
        let mut sim = cancel_run(seed, preempt);
        let out = &sim.outcomes()[..CANCEL_REQUESTS];
        let gone = out.iter().filter(|o| o.fin == Final::Disconnected).count();
        let gone_parked = out
            .iter()
            .filter(|o| o.fin == Final::Disconnected && o.dispatched_at.is_none())
            .count();
        for o in out {
            match o.fin {
                Final::Response => assert_eq!(o.status, Some(200), "seed {seed}: {o:?}"),
                Final::Disconnected => assert_eq!(o.id % 2, 1, "seed {seed}: {o:?}"),
                _ => panic!("seed {seed}: {o:?}"),
            }
        }
        eprintln!(
            "seed {seed} preempt {preempt}: {gone} clients left, {gone_parked} of them while parked"
        );
        assert!(
            gone_parked >= 30,
            "seed {seed}: {gone_parked} left while parked"
        );
        // Everything is over by 2 s: nothing is left of them.
        assert_no_residue(&sim, &format!("seed {seed} at 2 s"));
        sim.run().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        for o in &sim.outcomes()[CANCEL_REQUESTS..] {
            assert_eq!(
                o.status,
                Some(200),
                "seed {seed}: later requests are served"
            );
        }
        assert_no_residue(&sim, &format!("seed {seed} at the end"));
    }
}

const RACE_REQUESTS: usize = 12;
/// When a client that does not leave early would leave (after everything is over).
const STAYS: Nanos = 2 * SEC;

/// One endpoint, one slot (~32 ms per request): 12 requests 3 ms apart over the
/// workers, each its own flow (`r<i>`: the record's queue of that flow on its VM is that
/// request alone), client `i` leaving `leave[i]` after sending; 4 late requests at 1 s.
fn race_sim(seed: u64, preempt: f64, leave: &[Nanos]) -> Sim {
    let eps = endpoints(1);
    let cfg = sim_config(
        &fc_config(&eps, 1, json!({"defaultRequestTTL": "60s"}), &[]),
        seed,
        preempt,
    );
    let mut sim = fc_sim(cfg, &eps, 1, |a| {
        SimpleUpstream::new(a).ttft(ms(30)).itl(ms(1)).tokens(2)
    });
    sim.add_requests((0..RACE_REQUESTS).map(|i| {
        request(i, "standard", &format!("r{i}"), 2)
            .at(race_at(i))
            .disconnect_after(leave[i])
    }));
    sim.add_requests(
        (0..4).map(|i| request(100 + i, "standard", "late", 2).at(SEC + ms(i as u64))),
    );
    sim
}

fn race_at(i: usize) -> Nanos {
    ms(10) + ms(3) * i as u64
}

fn granted(sim: &Sim, i: usize) -> bool {
    let flow = format!("r{i}");
    flow_state(sim)
        .queues
        .iter()
        .any(|q| q.fairness_id == flow && q.granted > 0)
}

/// A client leaves while its grant is on the way to its worker (granted in the record,
/// the inbox message not yet handled). First a run where nobody leaves finds, for each
/// parked request granted by another worker, when its grant was made (stepping 10 µs
/// through the millisecond before its resume). Then, per such request, the same seed
/// again with that client leaving 10 µs after its grant (plus the client hop, 50–100
/// µs: the grant hop is at least 150 µs); the run is the same up to then, which the test
/// checks by seeing the grant still pending just before the disconnect can arrive.
/// The returned grant must go to the next request: everyone else is served, nothing is
/// left, and later requests are served.
#[test]
fn a_client_leaving_while_its_grant_is_in_flight_returns_the_slot_and_leaves_no_residue() {
    let mut raced = 0;
    for (seed, preempt) in all_seeds() {
        let stays = [STAYS; RACE_REQUESTS];
        let mut probe = race_sim(seed, preempt, &stays);
        probe.run().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let resumes: Vec<(usize, Nanos)> = probe.outcomes()[..RACE_REQUESTS]
            .iter()
            .filter(|o| o.enqueued_at.is_some())
            .map(|o| (o.id, o.dispatched_at.unwrap()))
            .collect();
        let mut probe = race_sim(seed, preempt, &stays);
        let mut grants: Vec<(usize, Nanos)> = Vec::new();
        for (i, resumed) in resumes {
            let mut t = resumed.saturating_sub(ms(1)).max(probe.now() + 1);
            while t < resumed {
                probe.run_until(t).unwrap();
                if granted(&probe, i) {
                    if resumed - t >= 200 * US {
                        grants.push((i, t));
                    }
                    break;
                }
                t += 10 * US;
            }
        }
        assert!(
            grants.len() >= 3,
            "seed {seed}: grants through the inbox {grants:?}"
        );
        for &(i, granted_at) in grants.iter().take(3) {
            let mut leave = stays;
            leave[i] = granted_at + 10 * US - race_at(i);
            let mut sim = race_sim(seed, preempt, &leave);
            sim.run_until(granted_at + 49 * US).unwrap();
            // Without preemption the run is the same up to the disconnect; with it, a
            // suspended callback may run the disconnect (or other events) earlier, so
            // the grant may be gone already.
            let hit = granted(&sim, i);
            assert!(
                hit || preempt > 0.0,
                "seed {seed}: request {i}'s grant is still on its way when its client leaves"
            );
            sim.run()
                .unwrap_or_else(|e| panic!("seed {seed}, request {i}: {e}"));
            let o = sim.outcome(i);
            assert_eq!(o.fin, Final::Disconnected, "seed {seed}: {o:?}");
            if hit {
                assert_eq!(o.dispatched_at, None, "seed {seed}: never sent upstream");
                raced += 1;
            }
            for o in sim.outcomes().iter().filter(|o| o.id != i) {
                assert_eq!(o.status, Some(200), "seed {seed}, request {i} left: {o:?}");
            }
            assert_no_residue(&sim, &format!("seed {seed}, request {i} left"));
        }
    }
    eprintln!("{raced} clients left while their grant was in flight");
    assert!(raced >= 9, "{raced}");
}

// ---------------------------------------------------------------------------------------
// A worker VM crashes while the others hold parked requests.

/// 40 requests over 80 ms on one endpoint with 2 slots (100 ms each): 2 run, the rest
/// park over the 4 workers. Worker 0's next shared-data read after 150 ms (its tick)
/// traps: FAIL_RELOAD.
fn crash_run(seed: u64, preempt: f64) -> Sim {
    let eps = endpoints(1);
    let flow = json!({"defaultRequestTTL": "60s"});
    let cfg = sim_config(&fc_config(&eps, 2, flow, &[]), seed, preempt)
        .failure_policy(FailurePolicy::FailReload);
    let mut sim = fc_sim(cfg, &eps, 2, |a| {
        SimpleUpstream::new(a).ttft(ms(100)).itl(ms(2)).tokens(2)
    });
    sim.add_requests((0..40).map(|i| {
        request(i, ["standard", "premium"][i % 2], &format!("t{}", i % 3), 2)
            .at(ms(10) + ms(2) * i as u64)
    }));
    sim.add_fault(
        Fault::new("proxy_get_shared_data", FaultAction::Trap)
            .in_slot(host_sim::slot_of_worker(0))
            .between(ms(150), Nanos::MAX)
            .times(1),
    );
    // Later requests on every worker (worker 0's reloaded VM included).
    sim.add_requests((0..12).map(|i| {
        request(100 + i, "standard", "late", 2)
            .label("late")
            .at(20 * SEC + ms(150) * i as u64)
    }));
    // Not `run()`: the dead VM's parked streams stay paused until Envoy's stream idle
    // timeout (300 s), which the end-of-run check reports; they are checked below.
    sim.run_until(30 * SEC)
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    assert_eq!(sim.crashes().len(), 1, "seed {seed}");
    assert_eq!(sim.crashes()[0].callback, "proxy_on_tick");
    sim
}

/// Requests parked on the other workers when the crash happened.
fn parked_elsewhere(sim: &Sim) -> Vec<&host_sim::Outcome> {
    let crash_at = sim.crashes()[0].at;
    sim.outcomes()
        .iter()
        .filter(|o| o.worker != Some(0) && o.enqueued_at.is_some())
        .filter(|o| o.dispatched_at.is_none_or(|d| d > crash_at))
        .collect()
}

/// A worker's VM crashes (FAIL_RELOAD) while the other workers hold parked requests:
/// every request of the surviving workers is served once (none lost with the dead VM's
/// grants, none dispatched twice), the last within `VM_STALE_MS` + 3 s; those parked in
/// the dead VM stay paused (for Envoy's idle timeout); the record forgets the dead VM.
#[test]
fn a_worker_crash_loses_and_duplicates_none_of_the_requests_parked_on_the_others() {
    for (seed, preempt) in all_seeds() {
        let sim = crash_run(seed, preempt);
        let crash_at = sim.crashes()[0].at;
        let out = sim.outcomes();
        let elsewhere = parked_elsewhere(&sim);
        assert!(
            elsewhere.len() >= 10,
            "seed {seed}: {} parked on the other workers at the crash",
            elsewhere.len()
        );
        // Every request of the surviving workers completes, once (each stream has one
        // outcome and one dispatch; the capacity invariant held all along).
        for o in out
            .iter()
            .filter(|o| o.worker != Some(0) || o.label == "late")
        {
            assert_eq!(o.fin, Final::Response, "seed {seed}: {o:?}");
            assert_eq!(o.status, Some(200), "seed {seed}: {o:?}");
        }
        // Worker 0's: finished before the crash, failed with it (503), or — parked in
        // the dead VM — left paused (Envoy's stream idle timeout ends them).
        let mut hung = Vec::new();
        for o in out
            .iter()
            .filter(|o| o.worker == Some(0) && o.label != "late")
        {
            if o.fin == Final::Pending {
                assert!(o.enqueued_at.is_some_and(|e| e < crash_at) && o.dispatched_at.is_none());
                hung.push(o.id);
            } else {
                assert!(
                    o.status == Some(503) || o.finished_at.is_some_and(|f| f <= crash_at),
                    "seed {seed}: {o:?}"
                );
            }
        }
        assert_eq!(sim.open_streams(), hung, "seed {seed}");
        // The dead VM's grants and in-flight reservations hold the pool's capacity
        // until its row goes stale (10 s), then the survivors go.
        let slowest = elsewhere
            .iter()
            .map(|o| o.dispatched_at.unwrap() - crash_at)
            .max()
            .unwrap();
        eprintln!(
            "seed {seed} preempt {preempt}: crash at {:.1} ms, {} parked elsewhere, all 200, \
             the last dispatched {:.1} ms after the crash; {} parked in the dead VM left paused",
            in_ms(crash_at),
            elsewhere.len(),
            in_ms(slowest),
            hung.len()
        );
        assert!(
            slowest <= ms(VM_STALE_MS) + 3 * SEC,
            "seed {seed}: {} ms",
            in_ms(slowest)
        );
        let late: Vec<_> = out.iter().filter(|o| o.label == "late").collect();
        assert!(
            late.iter().all(|o| o.status == Some(200)),
            "seed {seed}: {late:?}"
        );
        if late.iter().any(|o| o.worker == Some(0)) {
            assert_eq!(sim.reloads(), 1, "seed {seed}");
        }
        // The record forgot the dead VM; nothing else is left in it.
        let s = flow_state(&sim);
        assert!(
            s.vms.is_empty() && s.queues.is_empty(),
            "seed {seed}: {s:?}"
        );
    }
}

/// The pool does not stall because one worker died: the dead VM's row (its running
/// request, whose end it can no longer report) expires after `VM_STALE_MS` (1 s), and no
/// grant goes to a VM silent for `VM_SUSPECT_MS`, so the survivors are served at once.
#[test]
fn after_a_worker_crash_the_survivors_are_not_stalled_for_the_stale_timeout() {
    let sim = crash_run(1, 0.0);
    let crash_at = sim.crashes()[0].at;
    // Without the crash all 40 are served by 40 × 100 ms / 2 slots ≈ 2 s.
    for o in parked_elsewhere(&sim) {
        let d = o.dispatched_at.unwrap();
        assert!(
            d < crash_at + 3 * SEC,
            "request {} dispatched {:.1} ms after the crash",
            o.id,
            in_ms(d - crash_at)
        );
    }
}

// ---------------------------------------------------------------------------------------
// A pool with no endpoint.

fn empty_pool_run(seed: u64, preempt: f64) -> Sim {
    let flow = json!({"defaultRequestTTL": "1s"});
    let cfg = sim_config(&fc_config(&[], 4, flow, &[]), seed, preempt);
    let mut sim = fc_sim(cfg, &[], 4, SimpleUpstream::new);
    let ep = endpoints(1)[0].clone();
    sim.at(
        ms(300),
        Control::AddEndpoint(ep.clone(), Box::new(SimpleUpstream::new(&ep))),
    );
    sim.add_requests((0..6).map(|i| request(i, "standard", "t", 2).at(ms(10) + ms(5) * i as u64)));
    sim
}

/// With the concurrency detector an empty pool is saturated: requests wait, none is
/// sent anywhere, and they leave at their TTL with 503 (the filter's pool is static, so
/// a server coming up at `ip:port` it was not configured with changes nothing).
#[test]
fn with_an_empty_pool_requests_wait_within_their_ttl_instead_of_failing_at_once() {
    for (seed, preempt) in all_seeds() {
        let mut sim = empty_pool_run(seed, preempt);
        sim.run_until(ms(500)).unwrap();
        assert_eq!(queued_gauge(&sim), 6.0, "seed {seed}: all six wait");
        assert!(sim.outcomes().iter().all(|o| o.fin == Final::Pending));
        sim.run().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        for o in sim.outcomes() {
            assert_eq!(o.status, Some(503), "seed {seed}: {o:?}");
            assert!(o.text().contains("queue TTL of 1000 ms"), "{}", o.text());
            let waited = o.finished_at.unwrap() - o.enqueued_at.unwrap();
            assert!(waited >= ms(999) && waited <= ms(1021), "seed {seed}");
        }
        assert_no_residue(&sim, &format!("seed {seed}"));
    }
}

/// `noEndpointRequestTTL` is the queue-wait budget while the pool has no endpoint (a cold
/// start), `defaultRequestTTL` while it has one: requests on an empty pool wait the longer
/// budget and leave as `EvictedNoEndpoints` (503, `rejected-no-endpoints`).
#[test]
fn an_empty_pool_holds_requests_for_the_no_endpoint_budget() {
    let flow = json!({"defaultRequestTTL": "1s", "noEndpointRequestTTL": "3s"});
    let cfg = sim_config(&fc_config(&[], 4, flow, &[]), 1, 0.0);
    let mut sim = fc_sim(cfg, &[], 4, SimpleUpstream::new);
    sim.add_requests((0..4).map(|i| request(i, "standard", "t", 2).at(ms(10) + ms(5) * i as u64)));
    sim.run().unwrap();
    for o in sim.outcomes() {
        assert_eq!(o.status, Some(503), "{o:?}");
        assert_eq!(
            o.header("x-llm-d-request-dropped-reason"),
            Some("rejected-no-endpoints")
        );
        assert!(o.text().contains("noEndpointRequestTTL"), "{}", o.text());
        let waited = o.finished_at.unwrap() - o.enqueued_at.unwrap();
        assert!(
            waited >= ms(2999) && waited <= ms(3021),
            "waited {:.0} ms",
            in_ms(waited)
        );
    }
    assert!(sim.prometheus().contains("outcome=\"EvictedNoEndpoints\""));
    assert_no_residue(&sim, "no-endpoint budget");
}

/// Scale from zero: requests waiting on an empty pool are dispatched once an endpoint
/// appears. The filter's endpoints are only `pool.endpoints` of its configuration and
/// host-sim cannot change them mid-run (no data layer, no plugin reconfiguration), so
/// they expire with 503 instead.
#[test]
#[ignore = "the filter's pool is static: an endpoint added mid-run is never seen (no endpoint discovery); host-sim cannot reconfigure the plugin"]
fn requests_waiting_on_an_empty_pool_are_dispatched_when_an_endpoint_is_added() {
    let mut sim = empty_pool_run(1, 0.0);
    sim.run().unwrap();
    for o in sim.outcomes() {
        assert_eq!(o.status, Some(200), "{o:?}");
    }
}

/// All endpoints gone: the configured server goes away and comes back 200 ms later.
/// Its failed scrape takes it out of the candidates, so the pool has no endpoint: flow
/// control holds the requests (whatever the detector, here the concurrency detector,
/// which only counts the gateway's own requests) and dispatches them when a scrape
/// succeeds again.
#[test]
fn requests_during_an_outage_of_every_endpoint_wait_and_are_served_when_one_returns() {
    for (seed, preempt) in all_seeds() {
        let eps = endpoints(1);
        let flow = json!({"defaultRequestTTL": "2s"});
        let cfg = with_scrape_cluster(sim_config(&fc_config(&eps, 4, flow, &[]), seed, preempt));
        let mut sim = fc_sim(cfg, &eps, 4, SimpleUpstream::new);
        sim.at(ms(100), Control::RemoveEndpoint(eps[0].clone()));
        sim.at(
            ms(300),
            Control::AddEndpoint(eps[0].clone(), Box::new(SimpleUpstream::new(&eps[0]))),
        );
        sim.add_requests(
            // From 200 ms: a scrape (every 50 ms) has seen the server gone by then; a request
            // sent before any scrape notices goes to the dead address (the router's 503).
            (0..6).map(|i| request(i, "standard", "t", 2).at(ms(200) + ms(10) * i as u64)),
        );
        sim.run_until(ms(3_000)).unwrap();
        for o in sim.outcomes() {
            assert_eq!(o.status, Some(200), "seed {seed}: {} {o:?}", o.text());
            let waited = o.dispatched_at.unwrap() - o.enqueued_at.expect("it waited");
            assert!(o.dispatched_at.unwrap() >= ms(300), "seed {seed}: {o:?}");
            assert!(
                waited < ms(400),
                "seed {seed}: dispatched soon after the return"
            );
        }
    }
}
