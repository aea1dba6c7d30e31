//! An LLM-inference endpoint picker that runs inside Envoy as a Proxy-Wasm filter.
//!
//! Two layers (the map: `docs/ARCHITECTURE.md` in the repository):
//! * the **core**, every module but `proxy`, bottom to top: plain data (`endpoint`), the
//!   configuration document (`config`), names and helpers (`headers`, `errors`, `rng`,
//!   `metrics`, `openai`, `model_rewrite`), the shared-data port (`shared_store`), the
//!   cross-worker records (`prefix`, `inflight`, `flow_control`), the latency predictor
//!   and SLO headroom (`latency`), the data layer
//!   (`datalayer`), the scheduler and its plugins (`scheduler`), one request's routing
//!   decision (`routing`), the plugin table (`registry`) and the loader (`runtime`). It
//!   never calls the host, builds natively and is unit-tested natively and as wasm32.
//! * the **proxy** layer (`proxy/`, built only for `wasm32-wasip1`): maps Envoy's
//!   callbacks onto the core and owns every host call. It holds no policy.

pub mod bound;
pub mod classify;
pub mod config;
pub mod datalayer;
pub mod endpoint;
pub mod errors;
pub mod flow_control;
pub mod headers;
pub mod health;
pub mod inflight;
pub mod latency;
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
