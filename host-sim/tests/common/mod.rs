//! What the host-sim tests share: pools of simulated servers, the filter's configuration,
//! and the invariant that no endpoint has more requests in flight than the filter's
//! ledger allowed.
#![allow(dead_code)]

use host_sim::world::invariants::Invariant;
use host_sim::{Sim, SimConfig, SimpleUpstream};
use prost::Message;
use serde_json::{json, Value};

pub const MODEL: &str = "sim-model";

/// `n` endpoint addresses.
pub fn endpoints(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("10.0.0.{i}:8000")).collect()
}

/// The filter configuration with `pool` fields merged in and `endpoints` set.
pub fn filter_config(eps: &[String], pool: Value) -> String {
    let mut pool = if pool.is_object() { pool } else { json!({}) };
    pool["endpoints"] = json!(eps);
    json!({ "pool": pool }).to_string()
}

/// The filter's in-flight ledger, decoded from shared data.
pub fn ledger(sim: &Sim) -> epp_filter::inflight::Ledger {
    sim.shared_data(epp_filter::inflight::LEDGER_KEY)
        .map(|b| epp_filter::inflight::Ledger::decode(b.as_slice()).expect("ledger decodes"))
        .unwrap_or_default()
}

/// No model server has more requests in flight than the filter's ledger counts for it:
/// the filter counts a request before the router sends it, and releases it only after
/// the response is over.
pub fn within_ledger() -> Invariant {
    Invariant::new(
        "no endpoint gets more in flight than the filter allowed",
        |sim| {
            let l = ledger(sim);
            for ep in sim.endpoint_addresses() {
                let actual = sim.in_flight(&ep);
                let allowed = l.in_flight(&ep);
                if actual > allowed {
                    return Err(format!(
                        "{ep}: {actual} in flight, the ledger allows {allowed}"
                    ));
                }
            }
            Ok(())
        },
    )
}

/// A sim with `eps` served by `server(addr)`, the ledger invariant installed.
pub fn sim_with(cfg: SimConfig, eps: &[String], server: impl Fn(&str) -> SimpleUpstream) -> Sim {
    let mut sim = Sim::new(cfg).expect("sim starts");
    for e in eps {
        sim.add_endpoint(e, Box::new(server(e)));
    }
    sim.add_invariant(within_ledger());
    sim
}

/// The series value in the sim's Prometheus view (panics with the whole text if absent).
pub fn metric(sim: &Sim, series: &str) -> f64 {
    let text = sim.prometheus();
    host_sim::prometheus::value(&text, series)
        .unwrap_or_else(|| panic!("no series `{series}` in:\n{text}"))
}

/// Scheduling attempts with `status` for the test model, summed over endpoints (the
/// metric has one series per endpoint: `pod_name`, `namespace`, `port`).
pub fn scheduler_attempts(sim: &Sim, status: &str) -> f64 {
    let prefix = format!(
        "inference_extension_scheduler_attempts_total{{status=\"{status}\",target_model_name=\"{MODEL}\","
    );
    sim.prometheus()
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn running_requests(sim: &Sim) -> f64 {
    metric(
        sim,
        &format!("inference_objective_running_requests{{model_name=\"{MODEL}\"}}"),
    )
}
