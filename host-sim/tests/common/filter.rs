//! What the tests read of the filter's internals: the shared-data records it keeps (the
//! in-flight ledger, the flow-control record, the latency model), its staleness bound, the name of the
//! cluster it scrapes through, and the name of its HTTP context type in backtraces.
//! The one place to update if the filter moves them.

use epp_filter::flow_control::state::{FlowState, STATE_KEY};
use epp_filter::inflight::{Ledger, LEDGER_KEY};
use epp_filter::latency::shared::MODEL_KEY;
use epp_filter::latency::Model;
use host_sim::host::vm::Cluster;
use host_sim::{Sim, SimConfig};
use prost::Message;

/// How long the flow-control record trusts a silent VM's row, in milliseconds.
pub const VM_STALE_MS: u64 = epp_filter::flow_control::state::VM_STALE_MS;

/// The filter's HTTP context type, as its demangled frames in a wasm backtrace name it.
pub const HTTP_CONTEXT_TYPE: &str = "epp_filter::proxy::http::Http";

/// The filter's in-flight ledger, decoded from shared data.
pub fn ledger(sim: &Sim) -> Ledger {
    sim.shared_data(LEDGER_KEY)
        .map(|b| Ledger::decode(&b).expect("ledger decodes"))
        .unwrap_or_default()
}

/// The global flow-control record (empty if never written).
pub fn flow_state(sim: &Sim) -> FlowState {
    sim.shared_data(STATE_KEY)
        .map(|b| FlowState::decode(b.as_slice()).expect("flow state decodes"))
        .unwrap_or_default()
}

/// The latency predictor's published model (empty if never trained).
pub fn latency_model(sim: &Sim) -> Model {
    sim.shared_data(MODEL_KEY)
        .map(|b| Model::decode(b.as_slice()).expect("latency model decodes"))
        .unwrap_or_default()
}

/// `cfg` with the cluster the filter scrapes `/metrics` through (its default, as in
/// `envoy/bootstrap.yaml.in`). host-sim's default clusters are named `pool` and
/// `scrape`, so without this one every scrape callout is refused and the data layer
/// sees nothing.
pub fn with_scrape_cluster(mut cfg: SimConfig) -> SimConfig {
    cfg.clusters.push(Cluster {
        name: epp_filter::datalayer::DEFAULT_CLUSTER.into(),
        dst_header: "x-envoy-original-dst-host".into(),
    });
    cfg
}
