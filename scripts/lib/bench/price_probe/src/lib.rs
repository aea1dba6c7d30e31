//! Benchmark only (`scripts/bench prices`), never shipped: a bare Proxy-Wasm module (no
//! SDK, no dependencies) whose request-headers callback makes `count` host calls of one
//! kind. Envoy's CPU per request with it, minus the same module making none, divided by
//! `count`, is what one such call costs in Envoy's V8.
//!
//! The plugin configuration is the JSON the bench renders, e.g.
//! `{"call": "clock", "count": 40, "pool": {...}}`; only `call`, `count` and `stage` are read.
//!
//! Built with the `body` feature it also exports the request-body callback, and `stage`
//! takes it one step at a time toward what any filter that routes on the body must do
//! (`scripts/bench prices --stages`): `continue` (the body callback returns at once),
//! `pause` (the headers wait for the whole body, which is not read), `read` (the body is
//! read at its end), `set` (and one request header is set from the body callback).

use std::cell::Cell;

extern "C" {
    fn proxy_get_current_time_nanoseconds(time: *mut u64) -> u32;
    fn proxy_define_metric(kind: u32, name: *const u8, name_len: usize, id: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
    fn proxy_record_metric(id: u32, value: u64) -> u32;
    fn proxy_get_header_map_value(
        map: u32,
        key: *const u8,
        key_len: usize,
        value: *mut *mut u8,
        value_len: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(map: u32, data: *mut *mut u8, len: *mut usize) -> u32;
    fn proxy_replace_header_map_value(
        map: u32,
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map: u32, key: *const u8, key_len: usize) -> u32;
    fn proxy_get_shared_data(
        key: *const u8,
        key_len: usize,
        value: *mut *mut u8,
        value_len: *mut usize,
        cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
        cas: u32,
    ) -> u32;
    fn proxy_get_property(
        path: *const u8,
        path_len: usize,
        value: *mut *mut u8,
        value_len: *mut usize,
    ) -> u32;
    #[cfg(feature = "body")]
    fn proxy_get_buffer_status(kind: u32, len: *mut usize, flags: *mut u32) -> u32;
    fn proxy_get_buffer_bytes(
        kind: u32,
        start: usize,
        max: usize,
        value: *mut *mut u8,
        value_len: *mut usize,
    ) -> u32;
}

/// The kinds of host call, by the name the configuration gives them.
const CALLS: [&str; 10] = [
    "clock",
    "counter",
    "histogram",
    "header-value",
    "header-pairs",
    "header-replace",
    "header-remove",
    "shared-get",
    "shared-set",
    "property",
];

/// Bytes of the shared-data value read and written (about the filter's in-flight record).
const SHARED_BYTES: usize = 700;
const SHARED_KEY: &[u8] = b"price-probe";
const PLUGIN_CONFIGURATION: u32 = 7;
const REQUEST_HEADERS: u32 = 0;
#[cfg(feature = "body")]
const REQUEST_BODY: u32 = 0;

/// How far the request path goes toward a filter that routes on the body (`body` builds).
#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Stage {
    Continue,
    Pause,
    Read,
    Set,
}

const STAGES: [(&str, Stage); 4] = [
    ("continue", Stage::Continue),
    ("pause", Stage::Pause),
    ("read", Stage::Read),
    ("set", Stage::Set),
];

thread_local! {
    static CALL: Cell<Option<usize>> = const { Cell::new(None) };
    static COUNT: Cell<u32> = const { Cell::new(0) };
    static COUNTER: Cell<u32> = const { Cell::new(0) };
    static HISTOGRAM: Cell<u32> = const { Cell::new(0) };
    static SINK: Cell<u64> = const { Cell::new(0) };
    static STAGE: Cell<Stage> = const { Cell::new(Stage::Continue) };
}

#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    Box::into_raw(vec![0u8; size].into_boxed_slice()).cast::<u8>()
}

/// Frees what Envoy allocated through `proxy_on_memory_allocate`.
fn release(data: *mut u8, len: usize) {
    if !data.is_null() {
        // SAFETY: `data` came from `proxy_on_memory_allocate(len)`, a boxed slice of `len`.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(data, len)) });
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(_context: u32, _parent: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_configure(_root: u32, size: usize) -> u32 {
    let (mut data, mut len) = (std::ptr::null_mut(), 0usize);
    // SAFETY: host call with valid out-pointers.
    unsafe { proxy_get_buffer_bytes(PLUGIN_CONFIGURATION, 0, size, &mut data, &mut len) };
    let text = if data.is_null() {
        String::new()
    } else {
        // SAFETY: Envoy wrote `len` bytes at `data`.
        String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(data, len) }).into_owned()
    };
    release(data, len);
    let call = string_field(&text, "call").and_then(|c| CALLS.iter().position(|k| *k == c));
    let count = number_field(&text, "count").unwrap_or(0);
    let stage = string_field(&text, "stage")
        .and_then(|name| STAGES.iter().find(|(n, _)| *n == name))
        .map_or(Stage::Continue, |(_, stage)| *stage);
    STAGE.with(|s| s.set(stage));
    CALL.with(|c| c.set(call));
    COUNT.with(|c| c.set(count));
    let (mut counter, mut histogram) = (0, 0);
    // SAFETY: host calls with valid pointers.
    unsafe {
        proxy_define_metric(0, b"price_probe_counter".as_ptr(), 19, &mut counter);
        proxy_define_metric(2, b"price_probe_histogram".as_ptr(), 21, &mut histogram);
        let value = [7u8; SHARED_BYTES];
        proxy_set_shared_data(
            SHARED_KEY.as_ptr(),
            SHARED_KEY.len(),
            value.as_ptr(),
            value.len(),
            0,
        );
    }
    COUNTER.with(|c| c.set(counter));
    HISTOGRAM.with(|c| c.set(histogram));
    u32::from(call.is_some() || count == 0)
}

/// `"name": "value"` in the configuration's JSON text.
fn string_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let rest = after_key(text, name)?.strip_prefix('"')?;
    rest.split('"').next()
}

/// `"name": 123` in the configuration's JSON text.
fn number_field(text: &str, name: &str) -> Option<u32> {
    let rest = after_key(text, name)?;
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn after_key<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("\"{name}\"");
    let rest = &text[text.find(&key)? + key.len()..];
    Some(rest.trim_start().strip_prefix(':')?.trim_start())
}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(_context: u32, _headers: u32, end: u32) -> u32 {
    let pause = cfg!(feature = "body") && end == 0 && STAGE.with(Cell::get) >= Stage::Pause;
    let Some(call) = CALL.with(Cell::get) else {
        return u32::from(pause);
    };
    let mut sink = 0u64;
    for i in 0..COUNT.with(Cell::get) {
        sink ^= one_call(call, i);
    }
    SINK.with(|s| s.set(s.get() ^ sink));
    u32::from(pause)
}

/// `body` builds: buffer the body until its end (from `pause` on), read it (`read`), set
/// one request header (`set`), then let the request go.
#[cfg(feature = "body")]
#[no_mangle]
pub extern "C" fn proxy_on_request_body(_context: u32, size: usize, end: u32) -> u32 {
    let stage = STAGE.with(Cell::get);
    if stage == Stage::Continue {
        return 0;
    }
    if end == 0 {
        return 1; // StopIterationAndBuffer: wait for the rest
    }
    if stage >= Stage::Read {
        let (mut data, mut len, mut flags) = (std::ptr::null_mut(), 0usize, 0u32);
        let mut buffered = size;
        // SAFETY: host calls with valid out-pointers; what Envoy allocates is released.
        unsafe {
            proxy_get_buffer_status(REQUEST_BODY, &mut buffered, &mut flags);
            proxy_get_buffer_bytes(REQUEST_BODY, 0, buffered, &mut data, &mut len);
        }
        let first = if data.is_null() || len == 0 {
            0
        } else {
            // SAFETY: Envoy wrote `len` bytes at `data`.
            u64::from(unsafe { *data })
        };
        SINK.with(|s| s.set(s.get() ^ first));
        release(data, len);
    }
    if stage == Stage::Set {
        let key = b"x-price-probe-destination";
        let value = b"127.0.0.1:1";
        // SAFETY: valid pointers and lengths.
        unsafe {
            proxy_replace_header_map_value(
                REQUEST_HEADERS,
                key.as_ptr(),
                key.len(),
                value.as_ptr(),
                value.len(),
            )
        };
    }
    0
}

/// One host call of kind `call` (an index into `CALLS`); something of its result.
fn one_call(call: usize, i: u32) -> u64 {
    let (mut data, mut len) = (std::ptr::null_mut(), 0usize);
    // SAFETY: every host call gets valid pointers and lengths; what Envoy allocates is
    // released below.
    unsafe {
        match call {
            0 => {
                let mut t = 0u64;
                proxy_get_current_time_nanoseconds(&mut t);
                return t;
            }
            1 => {
                proxy_increment_metric(COUNTER.with(Cell::get), 1);
            }
            2 => {
                proxy_record_metric(HISTOGRAM.with(Cell::get), u64::from(i) * 1000);
            }
            3 => {
                proxy_get_header_map_value(
                    REQUEST_HEADERS,
                    b":path".as_ptr(),
                    5,
                    &mut data,
                    &mut len,
                );
            }
            4 => {
                proxy_get_header_map_pairs(REQUEST_HEADERS, &mut data, &mut len);
            }
            5 => {
                let value = [b'0' + (i % 10) as u8];
                let key = b"x-price-probe";
                proxy_replace_header_map_value(
                    REQUEST_HEADERS,
                    key.as_ptr(),
                    key.len(),
                    value.as_ptr(),
                    1,
                );
            }
            6 => {
                let key = b"x-price-probe-absent";
                proxy_remove_header_map_value(REQUEST_HEADERS, key.as_ptr(), key.len());
            }
            7 => {
                let mut cas = 0;
                proxy_get_shared_data(
                    SHARED_KEY.as_ptr(),
                    SHARED_KEY.len(),
                    &mut data,
                    &mut len,
                    &mut cas,
                );
            }
            8 => {
                let value = [i as u8; SHARED_BYTES];
                proxy_set_shared_data(
                    SHARED_KEY.as_ptr(),
                    SHARED_KEY.len(),
                    value.as_ptr(),
                    value.len(),
                    0,
                );
            }
            _ => {
                let path = b"request\0path";
                proxy_get_property(path.as_ptr(), path.len(), &mut data, &mut len);
            }
        }
    }
    release(data, len);
    len as u64
}

#[no_mangle]
pub extern "C" fn proxy_on_done(_context: u32) -> u32 {
    1
}
