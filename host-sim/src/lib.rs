//! host-sim: runs the real filter `.wasm` in a simulated Envoy, in virtual time.
//!
//! Not built yet (issue #4): this crate will hold a Proxy-Wasm host on wasmtime with
//! Envoy 1.40's semantics and a discrete-event world driving it. Its simulated model
//! servers are the [`vllm_sim`] engine, re-exported here.

pub use vllm_sim;
