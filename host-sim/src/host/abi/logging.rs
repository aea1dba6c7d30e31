//! `proxy_log`, `proxy_get_log_level`, and the process log they write to.

use super::memory::{arg, read_str, write_u32, C};
use super::status::OK;
use crate::host::lock;
use crate::host::vm::{HostState, LogLine};
use anyhow::Result;
use wasmtime::Val;

/// The log keeps at most this many lines (a runaway filter cannot exhaust memory).
const MAX_LINES: usize = 200_000;

/// The level `proxy_get_log_level` reports: info.
const LEVEL_INFO: u32 = 2;

/// `proxy_log(level, message, message_size)`.
pub fn log(c: C, p: &[Val]) -> Result<u32> {
    let level = arg(p, 0);
    let msg = read_str(c, arg(p, 1), arg(p, 2))?;
    push_log(c.data(), level, msg);
    Ok(OK)
}

/// `proxy_get_log_level(out)`: info.
pub fn get_log_level(c: C, p: &[Val]) -> Result<u32> {
    write_u32(c, arg(p, 0), LEVEL_INFO)?;
    Ok(OK)
}

/// Appends a line to the process log at the VM's current time.
pub fn push_log(h: &HostState, level: u32, message: String) {
    let mut log = lock(&h.log);
    if log.len() < MAX_LINES {
        log.push(LogLine {
            at: h.now,
            slot: h.slot,
            level,
            message,
        });
    }
}
