//! What the host-sim tests share: endpoint addresses, the filter's configuration, sims
//! served by simulated model servers, the invariant that no endpoint has more requests
//! in flight than the filter's ledger allowed, and readings of the Prometheus view.
//! [`filter`] is the one place that reads the filter's internals; [`flow_control`] holds
//! what the flow-control tests share.
#![allow(dead_code)]

pub mod filter;
pub mod flow_control;

pub use filter::ledger;

use host_sim::world::invariants::Invariant;
use host_sim::{Outcome, Sim, SimConfig, Upstream};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The model every simulated server serves (the same as the end-to-end tests').
pub use tests::openai::MODEL;

/// `n` endpoint addresses: `10.0.0.1:8000`, `10.0.0.2:8000`, ...
pub fn endpoints(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("10.0.0.{i}:8000")).collect()
}

/// The filter configuration with `pool` fields merged in and `endpoints` set.
pub fn filter_config(eps: &[String], pool: Value) -> String {
    let mut pool = if pool.is_object() { pool } else { json!({}) };
    pool["endpoints"] = json!(eps);
    json!({ "pool": pool }).to_string()
}

/// A sim with `eps` served by `server(addr)`, no invariant installed.
pub fn sim_serving<U: Upstream + 'static>(
    cfg: SimConfig,
    eps: &[String],
    server: impl Fn(&str) -> U,
) -> Sim {
    let mut sim = Sim::new(cfg).expect("sim starts");
    for e in eps {
        sim.add_endpoint(e, Box::new(server(e)));
    }
    sim
}

/// A sim with `eps` served by `server(addr)`, the ledger invariant installed.
pub fn sim_with<U: Upstream + 'static>(
    cfg: SimConfig,
    eps: &[String],
    server: impl Fn(&str) -> U,
) -> Sim {
    let mut sim = sim_serving(cfg, eps, server);
    sim.add_invariant(within_ledger());
    sim
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

/// The header in which the filter names the endpoint that served a request.
pub const SERVED_HEADER: &str = "x-gateway-destination-endpoint-served";

/// Asserts that `o` was served by the endpoint the router sent it to (its
/// `x-sim-server`) and that the filter named that endpoint in [`SERVED_HEADER`];
/// returns the endpoint.
pub fn assert_served_where_routed(o: &Outcome) -> String {
    let ep = o.endpoint.clone().expect("routed");
    assert_eq!(
        o.header(SERVED_HEADER),
        Some(ep.as_str()),
        "request {}",
        o.id
    );
    assert_eq!(
        o.header("x-sim-server"),
        Some(ep.as_str()),
        "request {} served where the gateway said",
        o.id
    );
    ep
}

/// How many of `outcomes` each endpoint was routed (requests routed nowhere left out).
pub fn per_endpoint<'a>(
    outcomes: impl IntoIterator<Item = &'a Outcome>,
) -> BTreeMap<String, usize> {
    let mut per = BTreeMap::new();
    for o in outcomes {
        if let Some(ep) = &o.endpoint {
            *per.entry(ep.clone()).or_default() += 1;
        }
    }
    per
}

/// The series value in the sim's Prometheus view (panics with the whole text if absent).
pub fn metric(sim: &Sim, series: &str) -> f64 {
    let text = sim.prometheus();
    host_sim::prometheus::value(&text, series)
        .unwrap_or_else(|| panic!("no series `{series}` in:\n{text}"))
}

/// The sum of the series of a Prometheus text whose lines start with `prefix`.
pub fn sum_series(prometheus: &str, prefix: &str) -> f64 {
    prometheus
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Sum of a family's series in the sim's Prometheus view (`prefix` ends with `{`).
pub fn family_sum(sim: &Sim, prefix: &str) -> f64 {
    sum_series(&sim.prometheus(), prefix)
}

/// Scheduling attempts with `status` for the test model, summed over endpoints (the
/// metric has one series per endpoint: `pod_name`, `namespace`, `port`).
pub fn scheduler_attempts(sim: &Sim, status: &str) -> f64 {
    family_sum(
        sim,
        &format!(
            "inference_extension_scheduler_attempts_total{{status=\"{status}\",target_model_name=\"{MODEL}\","
        ),
    )
}

/// Requests of the test model the filter counts as running.
pub fn running_requests(sim: &Sim) -> f64 {
    metric(
        sim,
        &format!("inference_objective_running_requests{{model_name=\"{MODEL}\"}}"),
    )
}

/// `cached_tokens` of request `i` (0 when `prompt_tokens_details` is null, as vLLM writes
/// it then).
pub fn cached_tokens(sim: &Sim, i: usize) -> u64 {
    let usage = &sim.outcome(i).json()["usage"];
    assert!(usage["prompt_tokens"].as_u64().is_some(), "{usage}");
    usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}
