//! Arguments of a host call and the guest memory behind them.

use crate::host::lock;
use crate::host::vm::HostState;
use anyhow::{anyhow, bail, Result};
use wasmtime::{Caller, Val};

/// The calling VM: its store (guest memory) and [`HostState`].
pub type C<'a, 'b> = &'a mut Caller<'b, HostState>;

/// Argument `i` as a `u32` (pointers, sizes, enums); 0 when absent.
pub fn arg(p: &[Val], i: usize) -> u32 {
    match p.get(i) {
        Some(Val::I32(v)) => *v as u32,
        Some(Val::I64(v)) => *v as u32,
        _ => 0,
    }
}

/// Argument `i` as an `i64` (metric values); 0 when absent.
pub fn arg64(p: &[Val], i: usize) -> i64 {
    match p.get(i) {
        Some(Val::I64(v)) => *v,
        Some(Val::I32(v)) => i64::from(*v),
        _ => 0,
    }
}

/// `len` bytes of guest memory at `ptr`; an out-of-bounds access traps.
pub fn read(c: C, ptr: u32, len: u32) -> Result<Vec<u8>> {
    let mem = c.data().memory.ok_or_else(|| anyhow!("no memory"))?;
    let data = mem.data(&*c);
    let (s, e) = (ptr as usize, ptr as usize + len as usize);
    data.get(s..e)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| anyhow!("invalid memory access: {len} bytes at {ptr:#x}"))
}

/// [`read`] as text (invalid UTF-8 replaced).
pub fn read_str(c: C, ptr: u32, len: u32) -> Result<String> {
    Ok(String::from_utf8_lossy(&read(c, ptr, len)?).into_owned())
}

/// Writes `bytes` into guest memory at `ptr`; an out-of-bounds access traps.
pub fn write(c: C, ptr: u32, bytes: &[u8]) -> Result<()> {
    let mem = c.data().memory.ok_or_else(|| anyhow!("no memory"))?;
    let data = mem.data_mut(&mut *c);
    let s = ptr as usize;
    data.get_mut(s..s + bytes.len())
        .ok_or_else(|| {
            anyhow!(
                "invalid memory access: write of {} bytes at {ptr:#x}",
                bytes.len()
            )
        })?
        .copy_from_slice(bytes);
    Ok(())
}

/// Writes a little-endian `u32` at `ptr` (an out-pointer).
pub fn write_u32(c: C, ptr: u32, v: u32) -> Result<()> {
    write(c, ptr, &v.to_le_bytes())
}

/// Copies `bytes` into guest memory obtained from `proxy_on_memory_allocate` and writes
/// its pointer and size at the out-pointers (0/0 for empty data, as Envoy does).
pub async fn give(c: C<'_, '_>, bytes: &[u8], ptr_ptr: u32, size_ptr: u32) -> Result<()> {
    let mut ptr = 0u32;
    if !bytes.is_empty() {
        let alloc = c
            .data()
            .alloc
            .clone()
            .ok_or_else(|| anyhow!("no allocator"))?;
        {
            let h = c.data();
            let mut calls = lock(&h.calls);
            calls.bytes(h.import, bytes.len() as u64);
            calls.call("proxy_on_memory_allocate");
        }
        ptr = alloc.call_async(&mut *c, bytes.len() as i32).await? as u32;
        if ptr == 0 {
            bail!("proxy_on_memory_allocate({}) returned null", bytes.len());
        }
        write(c, ptr, bytes)?;
    }
    write_u32(c, ptr_ptr, ptr)?;
    write_u32(c, size_ptr, bytes.len() as u32)
}
