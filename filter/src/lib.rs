//! An LLM-inference endpoint picker that runs inside Envoy as a Proxy-Wasm filter.
//!
//! The crate has two layers:
//! * the **core** (every module but `proxy`): configuration (`config`, `registry`),
//!   request parsing (`openai`), the scheduler (`scheduler`: profiles, filters, scorers,
//!   pickers, profile handlers), the prefix index (`prefix`), the data layer
//!   (`datalayer`: metrics parsing, snapshots, scrape lease, discovery), the cross-worker
//!   in-flight ledger (`inflight`), error bodies and metric names. It never calls
//!   `proxy_wasm`, builds natively and is unit-tested natively and as wasm32.
//! * the **proxy** layer (`proxy/`, built only for `wasm32-wasip1`): maps Envoy's
//!   callbacks onto the core and owns every host call. It holds no policy.

pub mod config;
pub mod datalayer;
pub mod endpoint;
pub mod errors;
pub mod flow_control;
pub mod headers;
pub mod inflight;
pub mod metrics;
pub mod model_rewrite;
pub mod openai;
pub mod prefix;
pub mod registry;
pub mod rng;
pub mod routing;
pub mod runtime;
pub mod scheduler;
pub mod shared_store;

#[cfg(target_os = "wasi")]
mod proxy;
