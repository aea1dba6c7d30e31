//! Stream control from the filter: `proxy_continue_stream`, `proxy_close_stream` and
//! `proxy_send_local_response`. Each is deferred ([`Effect`]) on the effective stream
//! and run by the world when the callback returns, as Envoy does.

use super::memory::{arg, read, read_str, C};
use super::status::{BAD_ARGUMENT, OK};
use super::wire::deserialize_pairs;
use crate::host::effects::{Effect, StreamDir};
use anyhow::Result;
use wasmtime::Val;

/// The effective context if it is a live stream.
fn effective_stream(c: C) -> Option<u32> {
    let h = c.data();
    h.streams.contains_key(&h.effective).then_some(h.effective)
}

/// The direction argument of `proxy_continue_stream` / `proxy_close_stream`.
fn direction(p: &[Val]) -> Option<StreamDir> {
    match arg(p, 0) {
        0 => Some(StreamDir::Request),
        1 => Some(StreamDir::Response),
        _ => None,
    }
}

/// `proxy_continue_stream(direction)`: resume filter iteration.
pub fn continue_stream(c: C, p: &[Val]) -> Result<u32> {
    let Some(ctx) = effective_stream(c) else {
        return Ok(BAD_ARGUMENT);
    };
    let Some(dir) = direction(p) else {
        return Ok(BAD_ARGUMENT);
    };
    c.data_mut().effects.push(Effect::Continue { ctx, dir });
    Ok(OK)
}

/// `proxy_close_stream(direction)`: reset the stream (both directions).
pub fn close_stream(c: C, p: &[Val]) -> Result<u32> {
    let Some(ctx) = effective_stream(c) else {
        return Ok(BAD_ARGUMENT);
    };
    if direction(p).is_none() {
        return Ok(BAD_ARGUMENT);
    }
    c.data_mut().effects.push(Effect::Close { ctx });
    Ok(OK)
}

/// `proxy_send_local_response(status, details, details_size, body, body_size,
/// headers, headers_size, grpc_status)`.
pub fn send_local_response(c: C, p: &[Val]) -> Result<u32> {
    let status = arg(p, 0);
    let details = read_str(c, arg(p, 1), arg(p, 2))?;
    let body = read(c, arg(p, 3), arg(p, 4))?;
    let hdr = read(c, arg(p, 5), arg(p, 6))?;
    let Some(headers) = deserialize_pairs(&hdr) else {
        return Ok(BAD_ARGUMENT);
    };
    let Some(ctx) = effective_stream(c) else {
        return Ok(BAD_ARGUMENT);
    };
    c.data_mut().effects.push(Effect::LocalReply {
        ctx,
        status: status as u16,
        details,
        body,
        headers: headers
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect(),
    });
    Ok(OK)
}
