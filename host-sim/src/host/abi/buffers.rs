//! `proxy_get_buffer_bytes` / `proxy_set_buffer_bytes`: request and response bodies,
//! the callout response body, and the VM and plugin configurations.

use super::memory::{arg, give, read, C};
use super::status::{BAD_ARGUMENT, NOT_FOUND, OK};
use crate::host::vm::HostState;
use anyhow::Result;
use wasmtime::Val;

/// Buffer types of the ABI.
const REQUEST_BODY: u32 = 0;
const RESPONSE_BODY: u32 = 1;
const CALLOUT_RESPONSE_BODY: u32 = 4;
const VM_CONFIGURATION: u32 = 6;
const PLUGIN_CONFIGURATION: u32 = 7;

/// The readable buffer of type `t`, if there is one now.
fn buffer_of(h: &HostState, t: u32) -> Option<&[u8]> {
    match t {
        REQUEST_BODY => h.streams.get(&h.effective).map(|s| s.req_body.as_slice()),
        RESPONSE_BODY => h.streams.get(&h.effective).map(|s| s.resp_body.as_slice()),
        CALLOUT_RESPONSE_BODY => h.callout.as_ref().map(|r| r.body.as_slice()),
        VM_CONFIGURATION => Some(h.vm_config.as_slice()),
        PLUGIN_CONFIGURATION => Some(h.plugin_config.as_slice()),
        _ => None,
    }
}

/// `proxy_get_buffer_bytes(type, start, max_size, out_ptr, out_size)`.
pub async fn get(c: C<'_, '_>, p: &[Val]) -> Result<u32> {
    let (t, start, max) = (arg(p, 0), u64::from(arg(p, 1)), u64::from(arg(p, 2)));
    let Some(buf) = buffer_of(c.data(), t) else {
        return Ok(NOT_FOUND);
    };
    let size = buf.len() as u64;
    if start > size {
        return Ok(BAD_ARGUMENT);
    }
    let len = max.min(size - start);
    if len == 0 {
        return Ok(OK);
    }
    let bytes = buf[start as usize..(start + len) as usize].to_vec();
    give(c, &bytes, arg(p, 3), arg(p, 4)).await?;
    Ok(OK)
}

/// `proxy_set_buffer_bytes(type, start, size, data, data_size)`: replaces `size` bytes
/// from `start` of a body with `data`.
pub fn set(c: C, p: &[Val]) -> Result<u32> {
    let (t, start, len) = (arg(p, 0), arg(p, 1) as usize, arg(p, 2) as usize);
    let data = read(c, arg(p, 3), arg(p, 4))?;
    let h = c.data_mut();
    let eff = h.effective;
    let Some(s) = h.streams.get_mut(&eff) else {
        return Ok(NOT_FOUND);
    };
    let buf = match t {
        REQUEST_BODY => &mut s.req_body,
        RESPONSE_BODY => &mut s.resp_body,
        _ => return Ok(NOT_FOUND),
    };
    if start > buf.len() {
        return Ok(BAD_ARGUMENT);
    }
    let end = (start + len).min(buf.len());
    buf.splice(start..end, data);
    Ok(OK)
}
