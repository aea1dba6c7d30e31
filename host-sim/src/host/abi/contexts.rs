//! Contexts: `proxy_set_effective_context` and the root's `proxy_done`.

use super::memory::{arg, C};
use super::status::{BAD_ARGUMENT, NOT_FOUND, OK};
use anyhow::Result;
use wasmtime::Val;

/// `proxy_set_effective_context(ctx)`: the root or a live stream; BadArgument for a
/// context that is gone.
pub fn set_effective_context(c: C, p: &[Val]) -> Result<u32> {
    let ctx = arg(p, 0);
    let h = c.data_mut();
    if ctx == h.root_id || h.streams.contains_key(&ctx) {
        h.effective = ctx;
        Ok(OK)
    } else {
        Ok(BAD_ARGUMENT)
    }
}

/// `proxy_done()`, cpp-host's `WasmBase::done`: only a root that answered `on_done`
/// with false (pending done) may call it, once; otherwise NotFound. The host deletes the
/// root after the callback.
pub fn done(c: C) -> Result<u32> {
    let h = c.data_mut();
    if h.draining && !h.done_signalled {
        h.done_signalled = true;
        Ok(OK)
    } else {
        Ok(NOT_FOUND)
    }
}
