//! Virtual time and the root context's tick period.

use super::memory::{arg, write, C};
use super::status::OK;
use crate::world::clock::EPOCH_NANOS;
use anyhow::Result;
use wasmtime::Val;

/// `proxy_get_current_time_nanoseconds(out)`: the virtual clock as wall-clock time.
pub fn get_current_time(c: C, p: &[Val]) -> Result<u32> {
    let t = EPOCH_NANOS + c.data().now;
    write(c, arg(p, 0), &t.to_le_bytes())?;
    Ok(OK)
}

/// `proxy_set_tick_period_milliseconds(period)`: the world re-arms the tick after the
/// callback returns.
pub fn set_tick_period(c: C, p: &[Val]) -> Result<u32> {
    c.data_mut().tick_period_ms = arg(p, 0);
    Ok(OK)
}
