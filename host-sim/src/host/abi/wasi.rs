//! The WASI functions a `wasm32-wasip1` module links: stdout/stderr into the process
//! log, no environment or arguments, seeded randomness, the virtual clock; files are
//! refused.

use super::logging::push_log;
use super::memory::{arg, read, write, write_u32, C};
use crate::world::clock::EPOCH_NANOS;
use anyhow::{bail, Result};
use wasmtime::Val;

/// WASI errno: success.
pub const SUCCESS: u32 = 0;
/// WASI errno: bad file descriptor.
pub const EBADF: u32 = 8;

/// Log levels of WASI output in the process log (after proxy-wasm's 0..=5).
const LEVEL_STDOUT: u32 = 6;
const LEVEL_STDERR: u32 = 7;

/// `fd_write(fd, iovs, iovs_len, out_written)`: stdout and stderr become log lines.
pub fn fd_write(c: C, p: &[Val]) -> Result<u32> {
    let (fd, iovs, n, out) = (arg(p, 0), arg(p, 1), arg(p, 2), arg(p, 3));
    let mut text = Vec::new();
    for i in 0..n {
        let iov = read(c, iovs + i * 8, 8)?;
        let ptr = u32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]);
        let len = u32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]);
        text.extend(read(c, ptr, len)?);
    }
    write_u32(c, out, text.len() as u32)?;
    let level = if fd == 1 { LEVEL_STDOUT } else { LEVEL_STDERR };
    push_log(c.data(), level, String::from_utf8_lossy(&text).into_owned());
    Ok(SUCCESS)
}

/// `environ_sizes_get` / `args_sizes_get`: none.
pub fn sizes_get(c: C, p: &[Val]) -> Result<u32> {
    write_u32(c, arg(p, 0), 0)?;
    write_u32(c, arg(p, 1), 0)?;
    Ok(SUCCESS)
}

/// `random_get(buf, len)`: from the VM's seeded generator.
pub fn random_get(c: C, p: &[Val]) -> Result<u32> {
    let mut buf = vec![0u8; arg(p, 1) as usize];
    c.data_mut().rng.fill(&mut buf);
    write(c, arg(p, 0), &buf)?;
    Ok(SUCCESS)
}

/// `proc_exit(code)`: traps the VM.
pub fn proc_exit(p: &[Val]) -> Result<u32> {
    bail!("the module called proc_exit({})", arg(p, 0))
}

/// `clock_time_get(id, precision, out)`: the virtual clock as wall-clock time.
pub fn clock_time_get(c: C, p: &[Val]) -> Result<u32> {
    let t = EPOCH_NANOS + c.data().now;
    write(c, arg(p, 2), &t.to_le_bytes())?;
    Ok(SUCCESS)
}
