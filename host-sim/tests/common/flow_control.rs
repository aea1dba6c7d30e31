//! What the flow-control tests share: the filter configuration with the `flowControl`
//! gate and the concurrency detector, the seeds every test runs with, the queue gauges,
//! and an invariant that the pool never holds more than the detector's capacity.

use super::filter::flow_state;
use super::{family_sum, sim_serving, MODEL};
use host_sim::world::invariants::Invariant;
use host_sim::{ms, Nanos, Outcome, RequestSpec, Sim, SimConfig, SimpleUpstream};
use serde_json::{json, Value};

pub use host_sim::world::workload::{FAIRNESS_HEADER as FAIRNESS, OBJECTIVE_HEADER as OBJECTIVE};

/// The queue-size gauges (requests parked, per flow).
pub const QUEUE_SIZE: &str = "inference_extension_flow_control_queue_size{";
/// The queue-bytes gauges (bytes parked, per flow).
pub const QUEUE_BYTES: &str = "inference_extension_flow_control_queue_bytes{";

/// Seeds run without preemption.
pub const PLAIN_SEEDS: [u64; 3] = [1, 2, 3];
/// Seeds run with workers preempted inside shared-data host calls (`.preempt(0.3)`).
pub const PREEMPT_SEEDS: [u64; 3] = [11, 12, 13];

/// Every (seed, preemption probability) a flow-control test runs with.
pub fn all_seeds() -> impl Iterator<Item = (u64, f64)> {
    PLAIN_SEEDS
        .iter()
        .map(|s| (*s, 0.0))
        .chain(PREEMPT_SEEDS.iter().map(|s| (*s, 0.3)))
}

/// A flow-control configuration: `concurrency-detector` with `max_concurrency` per
/// endpoint, `round-robin-fairness-policy` declared, the objectives `premium` (100),
/// `standard` (0) and `best-effort` (-10), `flow` as the `flowControl` section and
/// `plugins` declared in addition.
pub fn fc_config(eps: &[String], max_concurrency: u64, flow: Value, plugins: &[Value]) -> String {
    let mut all = vec![
        json!({"type": "concurrency-detector",
               "parameters": {"maxConcurrency": max_concurrency, "concurrencyMode": "requests"}}),
        json!({"type": "round-robin-fairness-policy"}),
    ];
    all.extend(plugins.iter().cloned());
    json!({
        "featureGates": ["flowControl"],
        "plugins": all,
        "saturationDetector": {"pluginRef": "concurrency-detector"},
        "flowControl": flow,
        "pool": {
            "endpoints": eps,
            "objectives": [
                {"name": "premium", "priority": 100},
                {"name": "standard", "priority": 0},
                {"name": "best-effort", "priority": -10}
            ]
        }
    })
    .to_string()
}

/// 4 workers, `seed`, invariants checked after every event, preemption `preempt`.
pub fn sim_config(config: &str, seed: u64, preempt: f64) -> SimConfig {
    SimConfig::new(config)
        .workers(4)
        .seed(seed)
        .preempt(preempt)
}

/// A sim with `eps` served by `server(addr)` and the capacity invariant installed.
pub fn fc_sim(
    cfg: SimConfig,
    eps: &[String],
    capacity: u64,
    server: impl Fn(&str) -> SimpleUpstream,
) -> Sim {
    let mut sim = sim_serving(cfg, eps, server);
    sim.add_invariant(within_capacity(capacity));
    sim
}

/// The model servers never hold more requests together than the concurrency detector's
/// capacity (`maxConcurrency` × endpoints): flow control's gate holds across workers.
/// Also, the record's pool-wide in-flight count covers what the servers hold (a request
/// is counted before it is sent and released only after its response is over).
pub fn within_capacity(capacity: u64) -> Invariant {
    Invariant::new(
        "the pool never holds more than the detector's capacity",
        move |sim| {
            let actual: u64 = sim
                .endpoint_addresses()
                .iter()
                .map(|e| sim.in_flight(e))
                .sum();
            if actual > capacity {
                return Err(format!(
                    "{actual} in flight at the servers, capacity {capacity}"
                ));
            }
            Ok(())
        },
    )
}

/// Requests that left the queues with `outcome` (`Dispatched`, `EvictedTTL`,
/// `EvictedOther`, ...), from the queue-duration histogram's counts.
pub fn queue_outcomes(sim: &Sim, outcome: &str) -> f64 {
    sim.prometheus()
        .lines()
        .filter(|l| l.starts_with("inference_extension_flow_control_request_queue_duration"))
        .filter(|l| l.contains("_count{") && l.contains(&format!("outcome=\"{outcome}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Requests parked right now according to the queue-size gauges.
pub fn queued_gauge(sim: &Sim) -> f64 {
    family_sum(sim, QUEUE_SIZE)
}

/// A completion with an objective and a tenant, labelled `objective`.
pub fn request(i: usize, objective: &str, tenant: &str, max_tokens: u32) -> RequestSpec {
    RequestSpec::completion(
        MODEL,
        &format!("request {i:05}"),
        max_tokens,
        i.is_multiple_of(2),
    )
    .header(OBJECTIVE, objective)
    .header(FAIRNESS, tenant)
    .label(objective)
}

/// Nothing of flow control is left behind: no parked request in the gauges, nothing
/// queued, granted or in flight in the global record.
pub fn assert_no_residue(sim: &Sim, what: &str) {
    assert_eq!(queued_gauge(sim), 0.0, "{what}: queue-size gauges");
    assert_eq!(
        family_sum(sim, QUEUE_BYTES),
        0.0,
        "{what}: queue-bytes gauges"
    );
    let s = flow_state(sim);
    assert_eq!(s.in_flight(), 0, "{what}: in flight in the record: {s:?}");
    assert_eq!(s.queued(None), 0, "{what}: queued in the record: {s:?}");
    assert!(
        s.queues.iter().all(|q| q.granted == 0),
        "{what}: grants left in the record: {s:?}"
    );
}

/// Time in ms, for messages.
pub fn in_ms(t: Nanos) -> f64 {
    t as f64 / ms(1) as f64
}

/// Statuses of outcomes, for messages.
pub fn statuses(o: &[Outcome]) -> Vec<Option<u16>> {
    o.iter().map(|o| o.status).collect()
}
