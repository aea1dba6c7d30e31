//! HTTP callouts (`proxy_http_call`) to a configured cluster; gRPC answers as an Envoy
//! with no gRPC service configured.

use super::memory::{arg, read, read_str, write_u32, C};
use super::status::{BAD_ARGUMENT, INTERNAL_FAILURE, NOT_FOUND, OK};
use super::wire::deserialize_pairs;
use crate::host::effects::Outgoing;
use anyhow::Result;
use std::sync::atomic::Ordering;
use wasmtime::Val;

/// What `proxy_grpc_call` / `proxy_grpc_stream` answer: no such service.
pub const GRPC_OPEN: u32 = BAD_ARGUMENT;
/// What `proxy_grpc_send` / `_cancel` / `_close` and `proxy_get_status` answer: no such
/// call.
pub const GRPC_ON_STREAM: u32 = NOT_FOUND;

/// `proxy_http_call(cluster, cluster_size, headers, headers_size, body, body_size,
/// trailers, trailers_size, timeout_ms, out_token)`: BadArgument for an unknown cluster
/// or without `:method`, `:path` and `:authority`; InternalFailure past the cluster's
/// circuit breaker. The world sends it when the callback returns.
pub fn http_call(c: C, p: &[Val]) -> Result<u32> {
    let cluster = read_str(c, arg(p, 0), arg(p, 1))?;
    let hdr = read(c, arg(p, 2), arg(p, 3))?;
    let body = read(c, arg(p, 4), arg(p, 5))?;
    let timeout_ms = arg(p, 8);
    let token_ptr = arg(p, 9);
    let Some(headers) = deserialize_pairs(&hdr) else {
        return Ok(BAD_ARGUMENT);
    };
    let h = c.data_mut();
    if !h.clusters.iter().any(|cl| cl.name == cluster) {
        return Ok(BAD_ARGUMENT);
    }
    let has = |n: &str| headers.iter().any(|(k, _)| k == n);
    if !has(":method") || !has(":path") || !has(":authority") {
        return Ok(BAD_ARGUMENT);
    }
    if h.callouts_in_flight.load(Ordering::Relaxed) >= h.callout_limit {
        return Ok(INTERNAL_FAILURE);
    }
    h.callouts_in_flight.fetch_add(1, Ordering::Relaxed);
    h.next_callout += 1;
    let token = h.next_callout;
    h.outgoing.push(Outgoing::HttpCall {
        token,
        cluster,
        headers,
        body,
        timeout_ms,
    });
    write_u32(c, token_ptr, token)?;
    Ok(OK)
}
