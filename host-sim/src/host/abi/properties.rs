//! `proxy_get_property` / `proxy_set_property`: the plugin's names, the effective
//! stream's addresses, request attributes and response code, and properties the filter
//! set on the stream.

use super::memory::{arg, give, read, read_str, C};
use super::status::{NOT_FOUND, OK};
use crate::host::vm::HostState;
use anyhow::Result;
use wasmtime::Val;

/// The listener address every stream arrives on (`destination.address`).
const LISTENER_ADDRESS: &[u8] = b"127.0.0.1:10000";
/// Its port (`destination.port`, an integer as Envoy gives it).
const LISTENER_PORT: u16 = 10000;

/// The value of the property at `path`, if it has one now.
fn property(h: &HostState, path: &[&str]) -> Option<Vec<u8>> {
    let s = h.streams.get(&h.effective);
    let header = |name: &str| -> Option<Vec<u8>> {
        s?.req_headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone().into_bytes())
    };
    match path {
        ["plugin_name"] => Some(h.plugin_name.clone().into_bytes()),
        ["plugin_root_id"] => Some(h.root_id_name.clone().into_bytes()),
        ["plugin_vm_id"] => Some(h.vm_id.clone().into_bytes()),
        ["upstream", "address"] => s?.upstream_address.clone().map(String::into_bytes),
        ["source", "address"] => s.map(|s| s.source_address.clone().into_bytes()),
        ["destination", "address"] => s.map(|_| LISTENER_ADDRESS.to_vec()),
        ["destination", "port"] => s.map(|_| i64::from(LISTENER_PORT).to_le_bytes().to_vec()),
        ["request", "path"] => header(":path"),
        ["request", "method"] => header(":method"),
        ["request", "host"] => header(":authority"),
        ["request", "scheme"] => header(":scheme"),
        ["request", "id"] => header("x-request-id"),
        ["request", "headers", name] => header(name),
        ["response", "code"] => s?
            .response_code
            .map(|c| u64::from(c).to_le_bytes().to_vec()),
        _ => {
            let key = path.join(".");
            s?.props.get(&key).cloned()
        }
    }
}

/// The segments of a property path (NUL-separated in the ABI).
fn segments(raw: &str) -> Vec<&str> {
    raw.split('\0').filter(|s| !s.is_empty()).collect()
}

/// `proxy_get_property(path, path_size, out_ptr, out_size)`.
pub async fn get(c: C<'_, '_>, p: &[Val]) -> Result<u32> {
    let raw = read_str(c, arg(p, 0), arg(p, 1))?;
    match property(c.data(), &segments(&raw)) {
        Some(v) => {
            give(c, &v, arg(p, 2), arg(p, 3)).await?;
            Ok(OK)
        }
        None => Ok(NOT_FOUND),
    }
}

/// `proxy_set_property(path, path_size, value, value_size)`: on the effective stream.
pub fn set(c: C, p: &[Val]) -> Result<u32> {
    let raw = read_str(c, arg(p, 0), arg(p, 1))?;
    let value = read(c, arg(p, 2), arg(p, 3))?;
    let key = segments(&raw).join(".");
    let h = c.data_mut();
    let eff = h.effective;
    match h.streams.get_mut(&eff) {
        Some(s) => {
            s.props.insert(key, value);
            Ok(OK)
        }
        None => Ok(NOT_FOUND),
    }
}
