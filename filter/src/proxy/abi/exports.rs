//! The functions Envoy calls: the ABI version marker, the allocator, and the callbacks the
//! filter handles, each mapped onto its context. Not exported, so never entered:
//! `proxy_on_vm_start` (Envoy then starts the VM as if it returned true),
//! `proxy_on_log` and `proxy_on_delete` (a request's context ends in `proxy_on_done`,
//! which Envoy calls right after the access log), the trailers, metadata, gRPC,
//! foreign-function and TCP callbacks.
//!
//! The ABI passes every argument as an i32: booleans arrive as 0 or 1 and are read as
//! `!= 0`; a `bool` result is returned as 0 or 1.

use super::super::host;
use super::contexts;
use super::traits::Action;

extern "C" {
    fn __wasm_call_ctors();
}

/// Runs the module's static constructors (a reactor's `_initialize` must).
pub fn call_ctors() {
    // SAFETY: called once, from `_initialize`, before anything else runs in the module.
    unsafe { __wasm_call_ctors() }
}

/// Tells Envoy which ABI the module speaks (it refuses a module with no known version).
#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

/// Envoy copies every buffer it hands the module (headers, bodies, shared data, property
/// values) into memory allocated here; `host.rs` takes ownership of it. Exactly `size`
/// bytes, uninitialized (Envoy writes them all).
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    Box::into_raw(Box::<[u8]>::new_uninit_slice(size)).cast::<u8>()
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(context_id: u32, parent_context_id: u32) {
    contexts::create(context_id, parent_context_id);
}

#[no_mangle]
pub extern "C" fn proxy_on_configure(root_id: u32, configuration_size: usize) -> u32 {
    let ok = on_root(root_id, |root| root.on_configure(configuration_size));
    u32::from(ok.unwrap_or(false))
}

#[no_mangle]
pub extern "C" fn proxy_on_tick(root_id: u32) {
    on_root(root_id, |root| root.on_tick());
}

#[no_mangle]
pub extern "C" fn proxy_on_queue_ready(root_id: u32, queue_id: u32) {
    on_root(root_id, |root| root.on_queue_ready(queue_id));
}

/// Envoy delivers a callout's response to the context that sent it (and makes that
/// context current): only root contexts send callouts here.
#[no_mangle]
pub extern "C" fn proxy_on_http_call_response(
    context_id: u32,
    token: u32,
    num_headers: usize,
    body_size: usize,
    num_trailers: usize,
) {
    on_root(context_id, |root| {
        root.on_http_call_response(token, num_headers, body_size, num_trailers);
    });
}

/// A request's end (its context is dropped), or a root's shutdown (`1`: done; `0`: the
/// root calls `proxy_done` later).
#[no_mangle]
pub extern "C" fn proxy_on_done(context_id: u32) -> u32 {
    if let Some(mut http) = contexts::take_http(context_id) {
        return u32::from(http.on_done());
    }
    match on_root(context_id, |root| root.on_done()) {
        Some(false) => 0,
        Some(true) => {
            contexts::remove_root(context_id);
            1
        }
        None => 1,
    }
}

/// A callback on root context `id`; the root is forgotten when it called `proxy_done`
/// (Envoy calls it no more). `None` when there is no such root.
fn on_root<R>(id: u32, f: impl FnOnce(&mut dyn super::RootContext) -> R) -> Option<R> {
    let r = contexts::with_root(id, f);
    if host::take_done() {
        contexts::remove_root(id);
    }
    r
}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(context_id: u32, num_headers: usize, eos: u32) -> u32 {
    stream(context_id, |http| {
        http.on_http_request_headers(num_headers, eos != 0)
    })
}

#[no_mangle]
pub extern "C" fn proxy_on_request_body(context_id: u32, body_size: usize, eos: u32) -> u32 {
    stream(context_id, |http| {
        http.on_http_request_body(body_size, eos != 0)
    })
}

#[no_mangle]
pub extern "C" fn proxy_on_response_headers(context_id: u32, num_headers: usize, eos: u32) -> u32 {
    stream(context_id, |http| {
        http.on_http_response_headers(num_headers, eos != 0)
    })
}

#[no_mangle]
pub extern "C" fn proxy_on_response_body(context_id: u32, body_size: usize, eos: u32) -> u32 {
    stream(context_id, |http| {
        http.on_http_response_body(body_size, eos != 0)
    })
}

/// A stream callback on HTTP context `id`; Continue when there is none.
fn stream(id: u32, f: impl FnOnce(&mut dyn super::HttpContext) -> Action) -> u32 {
    contexts::with_http(id, f).unwrap_or(Action::Continue) as u32
}
