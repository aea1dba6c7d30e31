//! `proxy_call_foreign_function`: Envoy's `clear_route_cache` (no result); any other
//! name is NotFound.

use super::memory::{arg, give, read_str, C};
use super::status::{NOT_FOUND, OK};
use anyhow::Result;
use wasmtime::Val;

/// `proxy_call_foreign_function(name, name_size, args, args_size, out_ptr, out_size)`.
pub async fn call(c: C<'_, '_>, p: &[Val]) -> Result<u32> {
    let fname = read_str(c, arg(p, 0), arg(p, 1))?;
    match fname.as_str() {
        "clear_route_cache" => {
            give(c, &[], arg(p, 4), arg(p, 5)).await?;
            Ok(OK)
        }
        _ => Ok(NOT_FOUND),
    }
}
