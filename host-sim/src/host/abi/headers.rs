//! The header-map imports: request and response headers of the effective stream (and
//! their trailers, always empty), and the headers of a callout response.

use super::memory::{arg, give, read, read_str, C};
use super::status::{BAD_ARGUMENT, NOT_FOUND, OK};
use super::wire::{deserialize_pairs, serialize_pairs};
use crate::host::vm::HostState;
use anyhow::Result;
use wasmtime::Val;

/// Map types of the ABI.
const REQUEST_HEADERS: u32 = 0;
const RESPONSE_HEADERS: u32 = 2;
const RESPONSE_TRAILERS: u32 = 3;
const CALLOUT_RESPONSE_HEADERS: u32 = 6;
const CALLOUT_RESPONSE_TRAILERS: u32 = 7;

/// A header map as a host call sees it.
enum MapRef<'a> {
    /// The pairs, and whether the filter may still change them (false once they have
    /// passed on, or for a callout response).
    Map(&'a mut Vec<(String, String)>, bool),
    /// A map that exists but is always empty (trailers).
    Empty,
}

/// The map of type `t`, or the status to answer with.
fn map_of(h: &mut HostState, t: u32) -> Result<MapRef<'_>, u32> {
    match t {
        CALLOUT_RESPONSE_HEADERS | CALLOUT_RESPONSE_TRAILERS => match &mut h.callout {
            Some(r) if t == CALLOUT_RESPONSE_HEADERS => Ok(MapRef::Map(&mut r.headers, false)),
            Some(_) => Ok(MapRef::Empty),
            None => Err(BAD_ARGUMENT),
        },
        REQUEST_HEADERS..=RESPONSE_TRAILERS => {
            let eff = h.effective;
            let s = h.streams.get_mut(&eff).ok_or(BAD_ARGUMENT)?;
            match t {
                REQUEST_HEADERS => Ok(MapRef::Map(&mut s.req_headers, s.req_headers_writable)),
                RESPONSE_HEADERS => match &mut s.resp_headers {
                    Some(m) => Ok(MapRef::Map(m, s.resp_headers_writable)),
                    None => Err(BAD_ARGUMENT),
                },
                _ => Ok(MapRef::Empty),
            }
        }
        _ => Err(BAD_ARGUMENT),
    }
}

/// Runs `edit` on the map of type `t` if the filter may change it; BadArgument if not.
fn edit_map(c: C, t: u32, edit: impl FnOnce(&mut Vec<(String, String)>)) -> u32 {
    match map_of(c.data_mut(), t) {
        Ok(MapRef::Map(m, true)) => {
            edit(m);
            OK
        }
        Ok(_) => BAD_ARGUMENT,
        Err(s) => s,
    }
}

/// `proxy_get_header_map_pairs(type, out_ptr, out_size)`.
pub async fn get_pairs(c: C<'_, '_>, p: &[Val]) -> Result<u32> {
    let bytes = match map_of(c.data_mut(), arg(p, 0)) {
        Ok(MapRef::Map(m, _)) => serialize_pairs(m),
        Ok(MapRef::Empty) => serialize_pairs(&[]),
        Err(s) => return Ok(s),
    };
    give(c, &bytes, arg(p, 1), arg(p, 2)).await?;
    Ok(OK)
}

/// `proxy_set_header_map_pairs(type, pairs, pairs_size)`: replaces the whole map.
pub fn set_pairs(c: C, p: &[Val]) -> Result<u32> {
    let bytes = read(c, arg(p, 1), arg(p, 2))?;
    let Some(pairs) = deserialize_pairs(&bytes) else {
        return Ok(BAD_ARGUMENT);
    };
    Ok(edit_map(c, arg(p, 0), |m| {
        *m = pairs
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect();
    }))
}

/// `proxy_get_header_map_value(type, key, key_size, out_ptr, out_size)`: the first
/// value of `key`.
pub async fn get_value(c: C<'_, '_>, p: &[Val]) -> Result<u32> {
    let key = read_str(c, arg(p, 1), arg(p, 2))?.to_ascii_lowercase();
    let value = match map_of(c.data_mut(), arg(p, 0)) {
        Ok(MapRef::Map(m, _)) => m.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone()),
        Ok(MapRef::Empty) => None,
        Err(s) => return Ok(s),
    };
    match value {
        Some(v) => {
            give(c, v.as_bytes(), arg(p, 3), arg(p, 4)).await?;
            Ok(OK)
        }
        None => Ok(NOT_FOUND),
    }
}

/// The key (lower-cased) and value of the `*_header_map_value` setters.
fn key_value(c: C, p: &[Val]) -> Result<(String, String)> {
    let key = read_str(c, arg(p, 1), arg(p, 2))?.to_ascii_lowercase();
    let value = read_str(c, arg(p, 3), arg(p, 4))?;
    Ok((key, value))
}

/// `proxy_replace_header_map_value(type, key, key_size, value, value_size)`: sets the
/// first value of `key` and drops the others, or adds it.
pub fn replace_value(c: C, p: &[Val]) -> Result<u32> {
    let (key, value) = key_value(c, p)?;
    Ok(edit_map(c, arg(p, 0), |m| {
        match m.iter().position(|(k, _)| *k == key) {
            Some(i) => {
                m[i].1 = value;
                let mut j = i + 1;
                while j < m.len() {
                    if m[j].0 == key {
                        m.remove(j);
                    } else {
                        j += 1;
                    }
                }
            }
            None => m.push((key, value)),
        }
    }))
}

/// `proxy_add_header_map_value(type, key, key_size, value, value_size)`: appends a pair.
pub fn add_value(c: C, p: &[Val]) -> Result<u32> {
    let (key, value) = key_value(c, p)?;
    Ok(edit_map(c, arg(p, 0), |m| m.push((key, value))))
}

/// `proxy_remove_header_map_value(type, key, key_size)`: drops every value of `key`.
pub fn remove_value(c: C, p: &[Val]) -> Result<u32> {
    let key = read_str(c, arg(p, 1), arg(p, 2))?.to_ascii_lowercase();
    Ok(edit_map(c, arg(p, 0), |m| m.retain(|(k, _)| *k != key)))
}
