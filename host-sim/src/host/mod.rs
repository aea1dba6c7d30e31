//! The Proxy-Wasm host: imports, VMs, process-wide shared state, deferred effects,
//! injected faults, and the compiled-module cache.

pub mod abi;
pub mod effects;
pub mod faults;
pub mod module;
pub mod shared;
pub mod vm;
