//! The Proxy-Wasm host: imports, VMs, process-wide shared state, deferred effects,
//! injected faults, and the compiled-module cache.

pub mod abi;
pub mod calls;
pub mod effects;
pub mod faults;
pub mod module;
pub mod shared;
pub mod vm;

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks a process-wide structure (single-threaded: never contended, never poisoned in
/// a way that matters).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
