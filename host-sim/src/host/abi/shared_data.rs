//! `proxy_get_shared_data` / `proxy_set_shared_data`: the process-wide store of the
//! plugin's `vm_id`, with CAS. Both are preemption points.

use super::memory::{arg, give, read, read_str, write_u32, C};
use super::preempt::maybe_yield;
use super::status::{CAS_MISMATCH, NOT_FOUND, OK};
use crate::host::lock;
use crate::host::shared::SetResult;
use anyhow::Result;
use wasmtime::Val;

/// `proxy_get_shared_data(key, key_size, out_ptr, out_size, out_cas)`.
pub async fn get(c: C<'_, '_>, p: &[Val]) -> Result<u32> {
    maybe_yield(c).await;
    let key = read_str(c, arg(p, 0), arg(p, 1))?;
    let got = {
        let h = c.data();
        let got = lock(&h.shared).get(&h.vm_id, &key);
        let n = got.as_ref().map_or(0, |(v, _)| v.len() as u64);
        lock(&h.calls).shared("get", &key, n);
        got
    };
    match got {
        Some((v, cas)) => {
            give(c, &v, arg(p, 2), arg(p, 3)).await?;
            write_u32(c, arg(p, 4), cas)?;
            Ok(OK)
        }
        None => Ok(NOT_FOUND),
    }
}

/// `proxy_set_shared_data(key, key_size, value, value_size, cas)`.
pub async fn set(c: C<'_, '_>, p: &[Val]) -> Result<u32> {
    maybe_yield(c).await;
    let key = read_str(c, arg(p, 0), arg(p, 1))?;
    let value = read(c, arg(p, 2), arg(p, 3))?;
    let cas = arg(p, 4);
    let h = c.data();
    lock(&h.calls).shared("set", &key, value.len() as u64);
    Ok(match lock(&h.shared).set(&h.vm_id, &key, &value, cas) {
        SetResult::Ok => OK,
        SetResult::CasMismatch => CAS_MISMATCH,
    })
}
