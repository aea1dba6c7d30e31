//! Client-chosen keys do not grow the shared data: 10,000 requests (`FLOOD_REQUESTS`
//! to change it, e.g. 100,000 in release for the figure in BENCHMARKS.md), every one with its
//! own fairness id (300 bytes before the filter cuts it to 128) and its own model name,
//! through flow control on 4 workers with the pool saturated (queues build, 429s at
//! `maxRequests`). The flow-control record and the ledger hold only what is queued or in
//! flight now — bounded by `maxRequests`, not by the ids ever seen — and idle flows are
//! evicted: at the end the record holds no queue and the whole shared data is back to
//! its idle size.

mod common;

use common::filter::flow_state;
use common::flow_control::*;
use common::*;
use epp_filter::flow_control::state::STATE_KEY;
use epp_filter::inflight::LEDGER_KEY;
use host_sim::world::invariants::Invariant;
use host_sim::{ms, RequestSpec, SimpleUpstream};
use serde_json::json;
use std::cell::Cell;
use std::rc::Rc;

/// The default flood.
const REQUESTS: usize = 10_000;
const MAX_REQUESTS: usize = 500;
/// The bound asserted on the flow-control record plus the ledger: 512 bytes per request
/// that may be queued (a queue row with its fairness id and up to 8 heads is about 250).
const RECORD_BOUND: usize = MAX_REQUESTS * 512;

#[test]
fn distinct_tenants_and_models_by_the_ten_thousand_leave_the_shared_data_bounded_and_idle_flows_evicted(
) {
    let requests: usize = std::env::var("FLOOD_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(REQUESTS);
    let eps = endpoints(4);
    let config = fc_config(&eps, 4, json!({"maxRequests": MAX_REQUESTS}), &[]);
    let mut sim = fc_sim(sim_config(&config, 5, 0.0), &eps, 16, |a| {
        SimpleUpstream::new(a).ttft(ms(5)).itl(ms(2)).tokens(4)
    });
    let peak = Rc::new(Cell::new(0usize));
    let seen = peak.clone();
    sim.add_invariant(Invariant::new("records bounded", move |sim| {
        let size = |k: &str| sim.shared_data(k).map_or(0, |v| v.len());
        let now = size(STATE_KEY) + size(LEDGER_KEY);
        seen.set(seen.get().max(now));
        if now > RECORD_BOUND {
            return Err(format!("flow-control record + ledger = {now} bytes"));
        }
        Ok(())
    }));
    // 2,000 requests/s (5 s for 10,000) against about 1,200/s of capacity.
    let long = "x".repeat(300);
    sim.add_requests((0..requests).map(|i| {
        RequestSpec::completion(&format!("model-{i}"), &format!("prompt {i}"), 4, false)
            .header(FAIRNESS, &format!("tenant-{i}-{long}"))
            .at(ms(10) + (i as u64) * ms(1) / 2)
    }));
    sim.run().unwrap();
    let out = sim.outcomes();
    let ok = out.iter().filter(|o| o.status == Some(200)).count();
    let limited = out.iter().filter(|o| o.status == Some(429)).count();
    assert_eq!(
        ok + limited,
        requests,
        "every request served or refused at the limit"
    );
    assert!(ok > requests / 2, "{ok} served");
    assert!(limited > 0, "the queues reached maxRequests");
    let (keys, bytes) = sim.shared_data_footprint();
    println!(
        "{requests} distinct fairness ids and models: peak flow-control record + ledger {} bytes \
         (bound {RECORD_BOUND}); at the end {keys} shared-data keys, {bytes} bytes; VM linear \
         memory {:?} bytes",
        peak.get(),
        sim.vm_memory_bytes()
    );
    // Queues were really used, and emptied: no flow is left behind.
    assert!(peak.get() > 10_000, "{}", peak.get());
    assert!(flow_state(&sim).queues.is_empty());
    assert_eq!(family_sum(&sim, QUEUE_SIZE), 0.0);
    assert!(ledger(&sim).workers.is_empty());
    // The ids never reach a shared key: what is left is the protocol's fixed keys and
    // the prefix log ring (at most 4,096 slots).
    assert!(keys <= 4_096 + 16, "{keys} keys");
}
