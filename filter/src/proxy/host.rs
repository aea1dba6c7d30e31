//! Fallible host calls: the proxy-wasm ABI 0.2.1 imports the filter uses.
//!
//! Every host call the filter makes goes through here: the raw ABI import, its status
//! checked, an `Err(status)` returned on failure (a panic would kill the worker's VM).
//! The other half of the ABI, the callbacks the module exports, is in `abi/`.

#![allow(clashing_extern_declarations)]

use std::ptr::{null, null_mut};

/// A proxy-wasm status code other than Ok.
pub type Status = u32;

pub const OK: Status = 0;
pub const NOT_FOUND: Status = 1;
pub const EMPTY: Status = 7;
pub const CAS_MISMATCH: Status = 8;

/// Header maps (proxy-wasm `MapType`), named as in the ABI.
#[allow(clippy::enum_variant_names)]
#[derive(Clone, Copy)]
pub enum Map {
    RequestHeaders = 0,
    ResponseHeaders = 2,
    HttpCallResponseHeaders = 6,
}

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_get_current_time_nanoseconds(return_time: *mut u64) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(
        map_type: u32,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map_type: u32, key_data: *const u8, key_size: usize) -> u32;
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_get_shared_data(
        key_data: *const u8,
        key_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
        return_cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    fn proxy_send_local_response(
        status_code: u32,
        details_data: *const u8,
        details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_define_metric(
        metric_type: u32,
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> u32;
    fn proxy_increment_metric(metric_id: u32, offset: i64) -> u32;
    fn proxy_record_metric(metric_id: u32, value: u64) -> u32;
    fn proxy_continue_stream(stream_type: u32) -> u32;
    fn proxy_done() -> u32;
    fn proxy_set_buffer_bytes(
        buffer_type: u32,
        start: usize,
        size: usize,
        data: *const u8,
        data_size: usize,
    ) -> u32;
    fn proxy_set_effective_context(context_id: u32) -> u32;
    fn proxy_register_shared_queue(
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> u32;
    fn proxy_resolve_shared_queue(
        vm_id_data: *const u8,
        vm_id_size: usize,
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> u32;
    fn proxy_enqueue_shared_queue(queue_id: u32, value_data: *const u8, value_size: usize) -> u32;
    fn proxy_dequeue_shared_queue(
        queue_id: u32,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_log(level: u32, message_data: *const u8, message_size: usize) -> u32;
    #[allow(clippy::too_many_arguments)]
    fn proxy_http_call(
        upstream_data: *const u8,
        upstream_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        body_data: *const u8,
        body_size: usize,
        trailers_data: *const u8,
        trailers_size: usize,
        timeout_ms: u32,
        return_token: *mut u32,
    ) -> u32;
}

fn check(status: u32) -> Result<(), Status> {
    if status == OK {
        Ok(())
    } else {
        Err(status)
    }
}

/// Takes ownership of a buffer the host allocated in our memory (through
/// `proxy_on_memory_allocate`, `abi/exports.rs`, which allocates exactly that size).
///
/// # Safety
/// `data` must be null or a pointer the host returned for `size` bytes.
unsafe fn owned(data: *mut u8, size: usize) -> Vec<u8> {
    if data.is_null() {
        Vec::new()
    } else {
        // SAFETY: the host obtained `data` from our allocator for exactly `size` bytes.
        unsafe { Vec::from_raw_parts(data, size, size) }
    }
}

/// Host clock in nanoseconds since the Unix epoch.
pub fn now_ns() -> Result<u64, Status> {
    let mut ns: u64 = 0;
    // SAFETY: the out-pointer is valid for the call.
    check(unsafe { proxy_get_current_time_nanoseconds(&mut ns) })?;
    Ok(ns)
}

/// Host clock in milliseconds since the Unix epoch.
pub fn now_ms() -> Result<i64, Status> {
    let mut ns: u64 = 0;
    // SAFETY: the out-pointer is valid for the call.
    check(unsafe { proxy_get_current_time_nanoseconds(&mut ns) })?;
    Ok(i64::try_from(ns / 1_000_000).unwrap_or(i64::MAX))
}

thread_local! {
    /// The last clock reading that succeeded (ns).
    static LAST_CLOCK_NS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The host clock (ns since the Unix epoch). A failed read is logged and gives the last
/// good reading (never the epoch, which would make every deadline and lease look
/// decades old).
pub fn clock_ns() -> u64 {
    match now_ns() {
        Ok(ns) => {
            LAST_CLOCK_NS.with(|c| c.set(ns));
            ns
        }
        Err(status) => {
            log::warn!("cannot read the host clock (status {status}); using the last reading");
            LAST_CLOCK_NS.with(std::cell::Cell::get)
        }
    }
}

/// [`clock_ns`] in microseconds.
pub fn clock_us() -> u64 {
    clock_ns() / 1_000
}

/// [`clock_ns`] in milliseconds.
pub fn clock_ms() -> i64 {
    i64::try_from(clock_ns() / 1_000_000).unwrap_or(i64::MAX)
}

/// Sets this VM's root tick period.
pub fn set_tick_period_ms(ms: u32) -> Result<(), Status> {
    // SAFETY: plain value argument.
    check(unsafe { proxy_set_tick_period_milliseconds(ms) })
}

fn get_buffer(buffer_type: u32, start: usize, max: usize) -> Result<Vec<u8>, Status> {
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: out-pointers are valid; the returned buffer is ours (see `owned`).
    unsafe {
        match proxy_get_buffer_bytes(buffer_type, start, max, &mut data, &mut size) {
            OK => Ok(owned(data, size)),
            NOT_FOUND => Ok(Vec::new()),
            status => Err(status),
        }
    }
}

/// The buffered request body, bytes `0..size`.
pub fn request_body(size: usize) -> Result<Vec<u8>, Status> {
    get_buffer(0, 0, size)
}

/// The response body chunk being delivered, bytes `0..size`.
pub fn response_body(size: usize) -> Result<Vec<u8>, Status> {
    get_buffer(1, 0, size)
}

/// Bytes `start..start + len` of the response body chunk being delivered.
pub fn response_body_range(start: usize, len: usize) -> Result<Vec<u8>, Status> {
    get_buffer(1, start, len)
}

/// Replaces the response body chunk being delivered.
pub fn set_response_body(current_size: usize, body: &[u8]) -> Result<(), Status> {
    // SAFETY: the slice is valid for the call.
    check(unsafe { proxy_set_buffer_bytes(1, 0, current_size, body.as_ptr(), body.len()) })
}

/// The body of the HTTP callout response being delivered.
pub fn http_call_body(size: usize) -> Result<Vec<u8>, Status> {
    get_buffer(4, 0, size)
}

/// Sends an HTTP callout (GET, no body) from the current (root) context; the response
/// arrives in that context's `on_http_call_response` with the returned token.
pub fn http_call(cluster: &str, headers: &[(&str, &str)], timeout_ms: u64) -> Result<u32, Status> {
    let serialized = serialize_headers(headers);
    let no_trailers = serialize_headers(&[]);
    let mut token = 0u32;
    // SAFETY: slices and the out-pointer are valid for the call.
    check(unsafe {
        proxy_http_call(
            cluster.as_ptr(),
            cluster.len(),
            serialized.as_ptr(),
            serialized.len(),
            null(),
            0,
            no_trailers.as_ptr(),
            no_trailers.len(),
            u32::try_from(timeout_ms).unwrap_or(u32::MAX),
            &mut token,
        )
    })?;
    Ok(token)
}

/// Writes a line to Envoy's log at a proxy-wasm level (0 trace .. 5 critical).
pub fn log(level: u32, message: &str) -> Result<(), Status> {
    // SAFETY: the slice is valid for the call.
    check(unsafe { proxy_log(level, message.as_ptr(), message.len()) })
}

/// The plugin configuration (the `configuration` string of the Envoy filter).
pub fn plugin_configuration() -> Result<Vec<u8>, Status> {
    get_buffer(7, 0, usize::MAX)
}

/// Every header of a map in one call, in the host's encoding
/// (`crate::headers::HeaderMap::decode` reads it).
pub fn header_pairs(map: Map) -> Result<Vec<u8>, Status> {
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: out-pointers are valid; the returned buffer is ours (see `owned`).
    unsafe {
        match proxy_get_header_map_pairs(map as u32, &mut data, &mut size) {
            OK => Ok(owned(data, size)),
            NOT_FOUND => Ok(Vec::new()),
            status => Err(status),
        }
    }
}

/// One header value; `None` when absent.
pub fn header(map: Map, name: &str) -> Result<Option<String>, Status> {
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: key slice and out-pointers are valid for the call.
    unsafe {
        match proxy_get_header_map_value(
            map as u32,
            name.as_ptr(),
            name.len(),
            &mut data,
            &mut size,
        ) {
            OK => Ok(Some(
                // The host's buffer becomes the string (a copy only when not UTF-8).
                String::from_utf8(owned(data, size))
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
            )),
            NOT_FOUND => Ok(None),
            status => Err(status),
        }
    }
}

/// Sets (replaces) a header.
pub fn set_header(map: Map, name: &str, value: &str) -> Result<(), Status> {
    // SAFETY: slices are valid for the call.
    check(unsafe {
        proxy_replace_header_map_value(
            map as u32,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

/// Removes a header (absent is fine).
pub fn remove_header(map: Map, name: &str) -> Result<(), Status> {
    // SAFETY: slice is valid for the call.
    match unsafe { proxy_remove_header_map_value(map as u32, name.as_ptr(), name.len()) } {
        OK | NOT_FOUND => Ok(()),
        status => Err(status),
    }
}

/// A property such as `["upstream", "address"]`; `None` when not available.
pub fn property(path: &[&str]) -> Result<Option<Vec<u8>>, Status> {
    property_at(&path.join("\0"))
}

/// [`property`] by its path already serialized, the segments NUL-separated
/// (`"upstream\0address"`): no allocation for a constant path.
pub fn property_at(serialized: &str) -> Result<Option<Vec<u8>>, Status> {
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: path slice and out-pointers are valid; the returned buffer is ours.
    unsafe {
        match proxy_get_property(serialized.as_ptr(), serialized.len(), &mut data, &mut size) {
            OK => Ok(Some(owned(data, size))),
            NOT_FOUND => Ok(None),
            status => Err(status),
        }
    }
}

/// Reads shared data: `None` when the key was never written, else bytes and CAS token.
pub fn get_shared(key: &str) -> Result<Option<(Vec<u8>, u32)>, Status> {
    let mut data = null_mut();
    let mut size = 0usize;
    let mut cas = 0u32;
    // SAFETY: key slice and out-pointers are valid; the returned buffer is ours.
    unsafe {
        match proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) {
            OK => Ok(Some((owned(data, size), cas))),
            NOT_FOUND => Ok(None),
            status => Err(status),
        }
    }
}

/// Writes shared data; with `cas != 0` only if unchanged since that token (else `CAS_MISMATCH`).
pub fn set_shared(key: &str, value: &[u8], cas: u32) -> Result<(), Status> {
    // SAFETY: slices are valid for the call.
    check(unsafe {
        proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas)
    })
}

/// Answers the current stream locally (runs after the callback returns).
pub fn send_local_response(
    status: u16,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(), Status> {
    let serialized = serialize_headers(headers);
    // SAFETY: slices are valid for the call.
    check(unsafe {
        proxy_send_local_response(
            u32::from(status),
            null(),
            0,
            body.as_ptr(),
            body.len(),
            serialized.as_ptr(),
            serialized.len(),
            -1,
        )
    })
}

/// Header pairs in the ABI's wire format: count, then (key len, value len) pairs, then
/// NUL-terminated keys and values.
fn serialize_headers(headers: &[(&str, &str)]) -> Vec<u8> {
    let len32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes();
    let mut out = Vec::new();
    out.extend_from_slice(&len32(headers.len()));
    for (k, v) in headers {
        out.extend_from_slice(&len32(k.len()));
        out.extend_from_slice(&len32(v.len()));
    }
    for (k, v) in headers {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// Defines (or finds) a process-wide metric; returns this VM's id for it.
pub fn define_metric(kind: u32, name: &str) -> Result<u32, Status> {
    let mut id = 0u32;
    // SAFETY: slice and out-pointer are valid for the call.
    check(unsafe { proxy_define_metric(kind, name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

/// Adds `delta` to a counter or gauge.
pub fn increment_metric(id: u32, delta: i64) -> Result<(), Status> {
    // SAFETY: plain value arguments.
    check(unsafe { proxy_increment_metric(id, delta) })
}

/// Records a histogram observation, or sets a gauge.
pub fn record_metric(id: u32, value: u64) -> Result<(), Status> {
    // SAFETY: plain value arguments.
    check(unsafe { proxy_record_metric(id, value) })
}

/// Lets the current stream's request go on (takes effect after the callback returns).
pub fn resume_request() -> Result<(), Status> {
    // SAFETY: plain value argument.
    check(unsafe { proxy_continue_stream(0) })
}

/// Makes `context_id` the current stream for the following calls; `Err(BAD_ARGUMENT)`
/// when that stream is gone.
pub fn set_effective_context(context_id: u32) -> Result<(), Status> {
    // SAFETY: plain value argument.
    check(unsafe { proxy_set_effective_context(context_id) })
}

/// While alive, another stream is the current one; dropping it makes `restore` current
/// again (so host calls in between act on that stream, and nothing forgets to switch back).
pub struct OnStream {
    restore: u32,
}

/// Makes stream `ctx` current until the returned guard drops, then `restore`. `Err` when
/// the stream is gone (then `restore` is current again at once).
pub fn on_stream(ctx: u32, restore: u32) -> Result<OnStream, Status> {
    let guard = OnStream { restore };
    set_effective_context(ctx)?;
    Ok(guard)
}

impl Drop for OnStream {
    fn drop(&mut self) {
        if let Err(status) = set_effective_context(self.restore) {
            log::warn!("cannot restore context {}: status {status}", self.restore);
        }
    }
}

/// Registers (and takes over) the shared queue `name` for this VM; returns its id.
pub fn register_queue(name: &str) -> Result<u32, Status> {
    let mut id = 0u32;
    // SAFETY: slice and out-pointer are valid for the call.
    check(unsafe { proxy_register_shared_queue(name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

/// Finds another VM's shared queue; `None` when nobody registered it.
pub fn resolve_queue(vm_id: &str, name: &str) -> Result<Option<u32>, Status> {
    let mut id = 0u32;
    // SAFETY: slices and out-pointer are valid for the call.
    match unsafe {
        proxy_resolve_shared_queue(
            vm_id.as_ptr(),
            vm_id.len(),
            name.as_ptr(),
            name.len(),
            &mut id,
        )
    } {
        OK => Ok(Some(id)),
        NOT_FOUND => Ok(None),
        status => Err(status),
    }
}

/// Appends a message to a shared queue.
pub fn enqueue(queue_id: u32, message: &[u8]) -> Result<(), Status> {
    // SAFETY: slice is valid for the call.
    check(unsafe { proxy_enqueue_shared_queue(queue_id, message.as_ptr(), message.len()) })
}

/// Takes the next message of a queue this VM registered; `None` when empty.
pub fn dequeue(queue_id: u32) -> Result<Option<Vec<u8>>, Status> {
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: out-pointers are valid; the returned buffer is ours.
    unsafe {
        match proxy_dequeue_shared_queue(queue_id, &mut data, &mut size) {
            OK => Ok(Some(owned(data, size))),
            EMPTY | NOT_FOUND => Ok(None),
            status => Err(status),
        }
    }
}

thread_local! {
    /// Set when [`done`] succeeded, until [`take_done`] reads it.
    static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Tells the host a root context that returned "not done" from `on_done` is now done
/// (Envoy calls that context no more; [`take_done`] says so to the context table).
pub fn done() -> Result<(), Status> {
    // SAFETY: no arguments.
    check(unsafe { proxy_done() })?;
    DONE.with(|d| d.set(true));
    Ok(())
}

/// Whether [`done`] succeeded since the last call (then the current root context is
/// finished).
pub fn take_done() -> bool {
    DONE.with(std::cell::Cell::take)
}

/// Replaces the whole buffered request body (of `old_size` bytes) with `body`.
pub fn replace_request_body(old_size: usize, body: &[u8]) -> Result<(), Status> {
    // SAFETY: the slice is valid for the call.
    check(unsafe { proxy_set_buffer_bytes(0, 0, old_size, body.as_ptr(), body.len()) })
}
