//! What the flow-control scenarios share: the filter configuration with the
//! `flowControl` gate and the concurrency detector, the global flow-control record
//! decoded from shared data, the queue gauges, and an invariant that the pool never
//! holds more than the detector's capacity.
#![allow(dead_code)]

use epp_filter::flow_control::state::{FlowState, STATE_KEY};
use host_sim::world::invariants::Invariant;
use host_sim::{ms, Nanos, Outcome, RequestSpec, Sim, SimConfig, SimpleUpstream};
use prost::Message;
use serde_json::{json, Value};

pub const MODEL: &str = "sim-model";
pub const OBJECTIVE: &str = "x-gateway-inference-objective";
pub const FAIRNESS: &str = "x-gateway-inference-fairness-id";
pub const QUEUE_SIZE: &str = "inference_extension_flow_control_queue_size{";
pub const QUEUE_BYTES: &str = "inference_extension_flow_control_queue_bytes{";

/// Seeds run without preemption and with `.preempt(0.3)`.
pub const PLAIN_SEEDS: [u64; 3] = [1, 2, 3];
pub const PREEMPT_SEEDS: [u64; 3] = [11, 12, 13];

/// `n` endpoint addresses.
pub fn endpoints(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("10.0.0.{i}:8000")).collect()
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
    let mut c = SimConfig::new(config)
        .workers(4)
        .seed(seed)
        .preempt(preempt);
    c.check_invariants = true;
    c
}

/// A sim with `eps` served by `server(addr)` and the capacity invariant installed.
pub fn fc_sim(
    cfg: SimConfig,
    eps: &[String],
    capacity: u64,
    server: impl Fn(&str) -> SimpleUpstream,
) -> Sim {
    let mut sim = Sim::new(cfg).expect("sim starts");
    for e in eps {
        sim.add_endpoint(e, Box::new(server(e)));
    }
    sim.add_invariant(within_capacity(capacity));
    sim
}

/// The global flow-control record (empty if never written).
pub fn flow_state(sim: &Sim) -> FlowState {
    sim.shared_data(STATE_KEY)
        .map(|b| FlowState::decode(b.as_slice()).expect("flow state decodes"))
        .unwrap_or_default()
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

/// Sum of a family's series in the Prometheus view (`prefix` ends with `{`).
pub fn family_sum(sim: &Sim, prefix: &str) -> f64 {
    sim.prometheus()
        .lines()
        .filter(|l| l.starts_with(prefix))
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
