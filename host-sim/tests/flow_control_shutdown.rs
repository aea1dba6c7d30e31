//! Removing the plugin (`Control::RemovePlugin`) with flow control holding requests, 4
//! simulated Envoy workers, seeded, with and without preemption: Envoy calls
//! `proxy_on_done` on every VM's root; the filter answers up to 64 parked requests per
//! callback with 500, says "not done", finishes on its tick and calls `proxy_done`.

mod common;

use common::endpoints;
use common::filter::flow_state;
use common::flow_control::*;
use host_sim::{ms, Nanos, Outcome, Sim, SimpleUpstream};
use serde_json::json;

const SHUTDOWN_MESSAGE: &str =
    "internal flow control error: the gateway is shutting down; the request was not sent";

/// What one run looked like.
struct Run {
    sim: Sim,
    running: std::ops::Range<usize>,
    parked: std::ops::Range<usize>,
    late: std::ops::Range<usize>,
    removed_at: Nanos,
}

/// 2 endpoints × maxConcurrency 4 = 8 slots, filled by 8 requests at 10–17 ms that the
/// servers answer after `ttft`; then `parked` requests at 20 ms + 0.2 ms × i that all
/// wait (TTL 60 s); the plugin is removed at `removed_at` (the VMs' 20 ms ticks fall
/// just after 200 ms, 220 ms, ...); 4 more requests 5 ms after the removal.
fn shutdown_run(seed: u64, preempt: f64, parked: usize, ttft: Nanos, removed_at: Nanos) -> Run {
    let eps = endpoints(2);
    let flow = json!({"defaultRequestTTL": "60s"});
    let cfg = sim_config(&fc_config(&eps, 4, flow, &[]), seed, preempt);
    let mut sim = fc_sim(cfg, &eps, 8, |a| {
        SimpleUpstream::new(a).ttft(ttft).itl(ms(1)).tokens(2)
    });
    sim.add_requests((0..8).map(|i| request(i, "standard", "t0", 2).at(ms(10 + i as u64))));
    sim.add_requests((8..8 + parked).map(|i| {
        let obj = ["standard", "premium", "best-effort"][i % 3];
        request(i, obj, &format!("t{}", i % 5), 2).at(ms(20) + ms(1) * (i as u64 - 8) / 5)
    }));
    let late = 8 + parked..8 + parked + 4;
    sim.add_requests(
        late.clone()
            .map(|i| request(i, "standard", "t0", 2).at(removed_at + ms(5))),
    );
    sim.at(removed_at, host_sim::Control::RemovePlugin);
    sim.run_until(removed_at - ms(1)).unwrap();
    assert_eq!(
        queued_gauge(&sim),
        parked as f64,
        "seed {seed}: all {parked} wait before the removal"
    );
    assert_eq!(flow_state(&sim).queued(None), parked as u64);
    assert_eq!(flow_state(&sim).in_flight(), 8);
    sim.run()
        .unwrap_or_else(|e| panic!("seed {seed} preempt {preempt}: {e}"));
    Run {
        sim,
        running: 0..8,
        parked: 8..8 + parked,
        late,
        removed_at,
    }
}

fn message(o: &Outcome) -> String {
    o.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// What a clean removal looks like: requests already upstream complete with 200; every
/// parked one gets the shutdown 500 (never sent upstream) soon after the removal, and
/// counts as an `EvictedOther` queue outcome; requests after the removal bypass the
/// filter; every root is deleted (after `proxy_done` if it said "not done"); no crash,
/// no held stream, no flow-control residue. Returns (parked per worker, last 500 after
/// the removal in ms, (slot, proxy_done ms after the removal) of roots that said "not
/// done").
fn assert_clean_shutdown(r: &Run, what: &str) -> (Vec<usize>, f64, Vec<(usize, f64)>) {
    let sim = &r.sim;
    // Requests already upstream complete normally.
    for o in &sim.outcomes()[r.running.clone()] {
        assert_eq!(o.status, Some(200), "{what}: running request {o:?}");
        assert!(o.endpoint.is_some(), "{what}: {o:?}");
    }
    // Every parked one is answered with the shutdown 500, never sent upstream.
    let mut per_worker = vec![0usize; 4];
    let mut last = 0;
    for o in &sim.outcomes()[r.parked.clone()] {
        assert_eq!(
            o.status,
            Some(500),
            "{what}: root shutdowns {:?}; parked request {} dispatched at {:?} ({:?})",
            sim.root_shutdowns(),
            o.id,
            o.dispatched_at,
            o.worker,
        );
        assert_eq!(
            o.status,
            Some(500),
            "{what}: parked request {} ({}) got {:?}, endpoint {:?}, body {}",
            o.id,
            o.label,
            o.status,
            o.endpoint,
            o.text()
        );
        assert_eq!(message(o), SHUTDOWN_MESSAGE, "{what}: {}", o.text());
        let j = o.json();
        assert_eq!(j["error"]["type"], "internal_error", "{what}");
        assert_eq!(j["error"]["code"], 500, "{what}");
        assert_eq!(o.header("content-type"), Some("application/json"), "{what}");
        assert_eq!(o.dispatched_at, None, "{what}: {o:?}");
        assert_eq!(
            o.endpoint, None,
            "{what}: parked request sent upstream: {o:?}"
        );
        let fin = o.finished_at.unwrap();
        assert!(fin >= r.removed_at, "{what}: answered before the removal");
        last = last.max(fin - r.removed_at);
        per_worker[o.worker.unwrap()] += 1;
    }
    // Requests after the removal bypass the filter: the router has no destination.
    for o in &sim.outcomes()[r.late.clone()] {
        assert_eq!(o.status, Some(503), "{what}: late request {o:?}");
        assert_eq!(o.text(), "no healthy upstream", "{what}");
        assert_eq!(o.endpoint, None, "{what}");
    }
    // Every live VM's root got on_done and was deleted; the roots that said "not done"
    // signalled proxy_done.
    let shut = sim.root_shutdowns();
    let mut slots: Vec<usize> = shut.iter().map(|s| s.slot).collect();
    slots.sort_unstable();
    assert_eq!(slots, vec![0, 1, 2, 3, 4, 5], "{what}: {shut:?}");
    let mut late_done = Vec::new();
    for s in &shut {
        // With preemption the clock may have moved on by other threads' events while an
        // earlier root's on_done was suspended.
        assert!(
            s.on_done_at >= r.removed_at && s.on_done_at - r.removed_at < ms(1),
            "{what}: {s:?}"
        );
        let deleted = s
            .deleted_at
            .unwrap_or_else(|| panic!("{what}: never deleted: {s:?}"));
        if s.not_done {
            let d = s
                .proxy_done_at
                .unwrap_or_else(|| panic!("{what}: no proxy_done: {s:?}"));
            assert_eq!(deleted, d, "{what}: deleted after its proxy_done callback");
            late_done.push((s.slot, in_ms(d - r.removed_at)));
        } else {
            assert!(deleted - s.on_done_at < ms(1), "{what}: {s:?}");
            assert_eq!(s.proxy_done_at, None, "{what}: {s:?}");
        }
    }
    assert!(sim.crashes().is_empty(), "{what}: {:?}", sim.crashes());
    // Each 500 is recorded as an EvictedOther queue outcome.
    let evicted = queue_outcomes(sim, "EvictedOther");
    assert_eq!(
        evicted,
        r.parked.len() as f64,
        "{what}: EvictedOther outcomes"
    );
    // sim.run() already failed on a stream left paused or held (the invariant checker),
    // a request without an outcome or a root that never called proxy_done.
    assert!(sim.open_streams().is_empty(), "{what}");
    assert_no_residue(sim, what);
    (per_worker, in_ms(last), late_done)
}

/// Removing the plugin with 300 requests parked over 4 workers (more than the 64 a root
/// answers per callback on some): every parked request gets the shutdown 500 within a
/// tick, the roots with more than 64 say "not done" and call `proxy_done` on their next
/// tick, and the removal is clean (see `assert_clean_shutdown`).
#[test]
fn removing_the_plugin_answers_every_parked_request_with_500_across_workers() {
    for (seed, preempt) in all_seeds() {
        let what = format!("seed {seed} preempt {preempt}");
        // 300 parked: about 75 per worker, more than the 64 answered per callback.
        let r = shutdown_run(seed, preempt, 300, ms(400), ms(201));
        let (per_worker, last, late_done) = assert_clean_shutdown(&r, &what);
        assert!(
            per_worker.iter().any(|&n| n > 64),
            "{what}: no worker had more than 64 parked: {per_worker:?}"
        );
        // Those workers' roots said "not done" and finished on their next 20 ms tick.
        let over: Vec<usize> = (0..4).filter(|&w| per_worker[w] > 64).collect();
        for w in &over {
            assert!(
                late_done.iter().any(|(slot, _)| *slot == w + 2),
                "{what}: worker {w} had {} parked but its root said done at once: {late_done:?}",
                per_worker[*w]
            );
        }
        assert!(last <= 21.0, "{what}: last 500 after {last} ms");
        eprintln!(
            "{what}: parked per worker {per_worker:?}; 500s within {last:.2} ms; \
             proxy_done (slot, ms) {late_done:?}"
        );
    }
}

/// With 40 parked (at most 64 per worker), every root answers its parked requests in
/// `on_done` itself and says done at once; the removal is clean.
#[test]
fn a_removal_with_few_parked_requests_is_done_in_on_done() {
    for (seed, preempt) in all_seeds() {
        let what = format!("seed {seed} preempt {preempt}");
        let r = shutdown_run(seed, preempt, 40, ms(400), ms(201));
        let (_, last, late_done) = assert_clean_shutdown(&r, &what);
        assert!(late_done.is_empty(), "{what}: {late_done:?}");
        assert!(last < 0.2, "{what}: last 500 after {last} ms");
    }
}

/// The plugin is removed at 201 ms, just after the VMs' ticks, and the 8 running
/// requests finish 5–12 ms later, while the workers with more than 64 parked are still
/// draining (their next tick, which answers the rest, is about 19 ms away): the capacity
/// they free must not send a parked request upstream.
#[test]
fn capacity_freed_while_draining_does_not_send_parked_requests_upstream() {
    for (seed, preempt) in all_seeds() {
        let what = format!("seed {seed} preempt {preempt}");
        let r = shutdown_run(seed, preempt, 300, ms(195), ms(201));
        let sent: Vec<(usize, usize, f64)> = r.sim.outcomes()[r.parked.clone()]
            .iter()
            .filter_map(|o| Some((o.id, o.worker?, in_ms(o.dispatched_at?))))
            .collect();
        eprintln!(
            "{what}: {} parked request(s) sent upstream after the removal at 201 ms \
             (id, worker, ms): {sent:?}; roots {:?}",
            sent.len(),
            r.sim.root_shutdowns()
        );
        assert_clean_shutdown(&r, &what);
    }
}

/// The checker sees a root that said "not done" and never finished: `proxy_done` fails
/// (an injected NotFound) on every VM, the filter logs it and does not retry, so
/// `Sim::run` reports the roots still draining.
#[test]
fn a_root_that_never_calls_proxy_done_fails_the_run() {
    let eps = endpoints(2);
    let flow = json!({"defaultRequestTTL": "60s"});
    let mut cfg = sim_config(&fc_config(&eps, 4, flow, &[]), 1, 0.0);
    // Draining roots keep ticking: stop the run at 1 s of virtual time.
    cfg.max_time = ms(1000);
    let mut sim = fc_sim(cfg, &eps, 8, |a| {
        SimpleUpstream::new(a).ttft(ms(400)).itl(ms(1)).tokens(2)
    });
    sim.add_requests((0..8).map(|i| request(i, "standard", "t0", 2).at(ms(10 + i as u64))));
    sim.add_requests(
        (8..308).map(|i| request(i, "standard", "t1", 2).at(ms(20) + ms(1) * (i as u64 - 8) / 5)),
    );
    sim.add_fault(host_sim::Fault::new(
        "proxy_done",
        host_sim::FaultAction::Status(1),
    ));
    sim.at(ms(201), host_sim::Control::RemovePlugin);
    let err = sim.run().expect_err("the run must fail").to_string();
    assert!(
        err.contains("answered on_done with false and never called proxy_done"),
        "{err}"
    );
    // The parked requests were answered all the same, and the roots are not deleted.
    for o in &sim.outcomes()[8..308] {
        assert_eq!(o.status, Some(500), "{o:?}");
    }
    let draining: Vec<_> = sim
        .root_shutdowns()
        .into_iter()
        .filter(|s| s.not_done)
        .collect();
    assert!(!draining.is_empty());
    assert!(
        draining.iter().all(|s| s.deleted_at.is_none()),
        "{draining:?}"
    );
    eprintln!("{err}");
}
