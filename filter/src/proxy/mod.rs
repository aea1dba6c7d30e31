//! The proxy layer: Envoy's Proxy-Wasm callbacks mapped onto the core.
//!
//! * `root` — one per plugin per VM: configuration, ticks, inbox messages, HTTP contexts.
//! * `http` — one per request: the request's path through the filter.
//! * `flow` — flow control on callbacks: admit, park, wake, expire, shut down.
//! * `route` — send the current stream to an endpoint, or answer it.
//! * `vm` — this VM's state shared by its contexts.
//! * `abi` — the callbacks Envoy calls (only those the filter handles are exported),
//!   the context table, the logger: our own export layer, no SDK (see `abi/mod.rs`).
//! * `host` — every host call, fallible.
//! * `scrape` — the lease holder's metrics scrapes, discovery and pool gauges (root tick).
//! * `state` — this VM's view of shared state (prefix index, snapshots, discovered endpoints).
//! * `store`, `stats` — shared data and metrics as the core needs them.
//! * `latency` — the latency predictor's inputs at a pick, its ground truth on the
//!   response path, its samples and training on the tick.
//! * `feedback` — cached-token feedback: a request's `usage` read from the end of its
//!   response chunks, judged against the prefix index's prediction when it ends.
//! * `kv_events` — `precise-prefix-cache-scorer`: each VM polls `kv-relay` for the blocks
//!   the servers report (root tick and callout answers).

mod abi;
mod feedback;
mod flow;
mod host;
mod http;
mod kv_events;
mod latency;
mod root;
mod route;
mod scrape;
mod state;
mod stats;
mod store;
mod vm;

/// The module's entry point (a WASI reactor's): Envoy calls it once per VM, before
/// anything else.
#[no_mangle]
pub extern "C" fn _initialize() {
    abi::initialize(log::LevelFilter::Info, |id| Box::new(root::Root::new(id)));
}
