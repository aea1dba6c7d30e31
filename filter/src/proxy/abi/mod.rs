//! The module's side of the proxy-wasm ABI 0.2.1: the callbacks Envoy calls into.
//!
//! Envoy enters the VM for every `proxy_on_*` function a module exports and skips one it
//! does not (a missing `proxy_on_request_trailers` is treated as Continue, a missing
//! `proxy_on_done` as done, a missing `proxy_on_log` / `proxy_on_delete` as nothing to
//! do). So this layer exports only the callbacks the filter uses (`exports`), and each one
//! finds its context in a table (`contexts`) and calls it through the traits the proxy
//! layer implements (`traits`). `logger` sends the `log` crate's lines to Envoy's log.
//!
//! Host calls (the imports) are in `super::host`.

mod contexts;
mod exports;
mod logger;
mod traits;

pub use traits::{Action, Context, ContextType, HttpContext, NewRoot, RootContext};

/// Once per VM, from `_initialize`: runs the module's static constructors, installs the
/// logger at `level` and the constructor of root contexts.
pub fn initialize(level: log::LevelFilter, new_root: NewRoot) {
    exports::call_ctors();
    logger::install(level);
    contexts::set_new_root(new_root);
}
