//! The imports: every `env` function of Proxy-Wasm ABI 0.2.1 and the WASI functions a
//! `wasm32-wasip1` filter links, with Envoy 1.40's behaviour. Also the wire formats
//! (header pairs) and status codes.
//!
//! Imports are bound with `Linker::func_new` from the module's own import list and
//! dispatched by name; an import host-sim does not know fails instantiation with its
//! name and signature.

use super::effects::{Effect, Outgoing, StreamDir};
use super::faults::FaultAction;
use super::shared::{MetricKind, QueueOwner, SetResult};
use super::vm::{HostState, LogLine};
use crate::world::clock::EPOCH_NANOS;
use anyhow::{anyhow, bail, Result};
use std::sync::atomic::Ordering;
use wasmtime::{Caller, Engine, ExternType, Linker, Module, Val};

/// proxy-wasm status codes (the subset the Rust SDK 0.2.5 knows).
pub mod status {
    /// Ok.
    pub const OK: u32 = 0;
    /// NotFound.
    pub const NOT_FOUND: u32 = 1;
    /// BadArgument.
    pub const BAD_ARGUMENT: u32 = 2;
    /// SerializationFailure.
    pub const SERIALIZATION_FAILURE: u32 = 3;
    /// ParseFailure.
    pub const PARSE_FAILURE: u32 = 4;
    /// Empty (queue).
    pub const EMPTY: u32 = 7;
    /// CasMismatch.
    pub const CAS_MISMATCH: u32 = 8;
    /// InternalFailure.
    pub const INTERNAL_FAILURE: u32 = 10;
}
use status::*;

/// Header pairs in the ABI's wire format: `u32 n`, `n x (u32 klen, u32 vlen)`, then
/// `key\0value\0` for each pair.
pub fn serialize_pairs(pairs: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + pairs.len() * 24);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// Parses header pairs in the wire format; `None` when malformed.
pub fn deserialize_pairs(b: &[u8]) -> Option<Vec<(String, String)>> {
    if b.is_empty() {
        return Some(Vec::new());
    }
    let word = |i: usize| -> Option<usize> {
        Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?) as usize)
    };
    let n = word(0)?;
    let mut sizes = Vec::with_capacity(n);
    for i in 0..n {
        sizes.push((word(4 + i * 8)?, word(8 + i * 8)?));
    }
    let mut at = 4 + n * 8;
    let mut out = Vec::with_capacity(n);
    for (kl, vl) in sizes {
        let k = b.get(at..at + kl)?;
        at += kl + 1;
        let v = b.get(at..at + vl)?;
        at += vl + 1;
        out.push((
            String::from_utf8_lossy(k).into_owned(),
            String::from_utf8_lossy(v).into_owned(),
        ));
    }
    Some(out)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Imp {
    Log,
    GetLogLevel,
    GetCurrentTime,
    SetTickPeriod,
    GetBufferBytes,
    SetBufferBytes,
    GetHeaderMapPairs,
    SetHeaderMapPairs,
    GetHeaderMapValue,
    ReplaceHeaderMapValue,
    AddHeaderMapValue,
    RemoveHeaderMapValue,
    GetProperty,
    SetProperty,
    GetSharedData,
    SetSharedData,
    RegisterSharedQueue,
    ResolveSharedQueue,
    EnqueueSharedQueue,
    DequeueSharedQueue,
    ContinueStream,
    CloseStream,
    SendLocalResponse,
    HttpCall,
    GrpcCall,
    GrpcStream,
    GrpcSend,
    GrpcCancel,
    GrpcClose,
    GetStatus,
    SetEffectiveContext,
    Done,
    CallForeignFunction,
    DefineMetric,
    IncrementMetric,
    RecordMetric,
    GetMetric,
    // WASI
    FdWrite,
    EnvironGet,
    EnvironSizesGet,
    ArgsGet,
    ArgsSizesGet,
    RandomGet,
    ProcExit,
    ClockTimeGet,
    FdClose,
    FdSeek,
    FdFdstatGet,
    SchedYield,
}

impl Imp {
    fn from(module: &str, name: &str) -> Option<Imp> {
        use Imp::*;
        Some(match (module, name) {
            ("env", "proxy_log") => Log,
            ("env", "proxy_get_log_level") => GetLogLevel,
            ("env", "proxy_get_current_time_nanoseconds") => GetCurrentTime,
            ("env", "proxy_set_tick_period_milliseconds") => SetTickPeriod,
            ("env", "proxy_get_buffer_bytes") => GetBufferBytes,
            ("env", "proxy_set_buffer_bytes") => SetBufferBytes,
            ("env", "proxy_get_header_map_pairs") => GetHeaderMapPairs,
            ("env", "proxy_set_header_map_pairs") => SetHeaderMapPairs,
            ("env", "proxy_get_header_map_value") => GetHeaderMapValue,
            ("env", "proxy_replace_header_map_value") => ReplaceHeaderMapValue,
            ("env", "proxy_add_header_map_value") => AddHeaderMapValue,
            ("env", "proxy_remove_header_map_value") => RemoveHeaderMapValue,
            ("env", "proxy_get_property") => GetProperty,
            ("env", "proxy_set_property") => SetProperty,
            ("env", "proxy_get_shared_data") => GetSharedData,
            ("env", "proxy_set_shared_data") => SetSharedData,
            ("env", "proxy_register_shared_queue") => RegisterSharedQueue,
            ("env", "proxy_resolve_shared_queue") => ResolveSharedQueue,
            ("env", "proxy_enqueue_shared_queue") => EnqueueSharedQueue,
            ("env", "proxy_dequeue_shared_queue") => DequeueSharedQueue,
            ("env", "proxy_continue_stream") => ContinueStream,
            ("env", "proxy_close_stream") => CloseStream,
            ("env", "proxy_send_local_response") => SendLocalResponse,
            ("env", "proxy_http_call") => HttpCall,
            ("env", "proxy_grpc_call") => GrpcCall,
            ("env", "proxy_grpc_stream") => GrpcStream,
            ("env", "proxy_grpc_send") => GrpcSend,
            ("env", "proxy_grpc_cancel") => GrpcCancel,
            ("env", "proxy_grpc_close") => GrpcClose,
            ("env", "proxy_get_status") => GetStatus,
            ("env", "proxy_set_effective_context") => SetEffectiveContext,
            ("env", "proxy_done") => Done,
            ("env", "proxy_call_foreign_function") => CallForeignFunction,
            ("env", "proxy_define_metric") => DefineMetric,
            ("env", "proxy_increment_metric") => IncrementMetric,
            ("env", "proxy_record_metric") => RecordMetric,
            ("env", "proxy_get_metric") => GetMetric,
            ("wasi_snapshot_preview1", "fd_write") => FdWrite,
            ("wasi_snapshot_preview1", "environ_get") => EnvironGet,
            ("wasi_snapshot_preview1", "environ_sizes_get") => EnvironSizesGet,
            ("wasi_snapshot_preview1", "args_get") => ArgsGet,
            ("wasi_snapshot_preview1", "args_sizes_get") => ArgsSizesGet,
            ("wasi_snapshot_preview1", "random_get") => RandomGet,
            ("wasi_snapshot_preview1", "proc_exit") => ProcExit,
            ("wasi_snapshot_preview1", "clock_time_get") => ClockTimeGet,
            ("wasi_snapshot_preview1", "fd_close") => FdClose,
            ("wasi_snapshot_preview1", "fd_seek") => FdSeek,
            ("wasi_snapshot_preview1", "fd_fdstat_get") => FdFdstatGet,
            ("wasi_snapshot_preview1", "sched_yield") => SchedYield,
            _ => return None,
        })
    }
}

/// A linker with every import of `module` bound; fails naming the first import
/// host-sim does not implement.
pub fn linker(engine: &Engine, module: &Module) -> Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    for import in module.imports() {
        let (m, n) = (import.module(), import.name());
        let ExternType::Func(ty) = import.ty() else {
            bail!("unsupported import {m}.{n}: host-sim provides functions only");
        };
        let Some(imp) = Imp::from(m, n) else {
            bail!("unknown import {m}.{n} {ty:?}: host-sim does not implement it");
        };
        let name: &'static str = Box::leak(n.to_string().into_boxed_str());
        linker.func_new_async(m, n, ty, move |mut caller, params, results| {
            Box::new(async move {
                let st = dispatch(imp, name, &mut caller, params)
                    .await
                    .map_err(wasmtime::Error::from_anyhow)?;
                if let Some(r) = results.first_mut() {
                    *r = Val::I32(st as i32);
                }
                Ok(())
            })
        })?;
    }
    Ok(linker)
}

type C<'a, 'b> = &'a mut Caller<'b, HostState>;

fn arg(p: &[Val], i: usize) -> u32 {
    match p.get(i) {
        Some(Val::I32(v)) => *v as u32,
        Some(Val::I64(v)) => *v as u32,
        _ => 0,
    }
}

fn arg64(p: &[Val], i: usize) -> i64 {
    match p.get(i) {
        Some(Val::I64(v)) => *v,
        Some(Val::I32(v)) => i64::from(*v),
        _ => 0,
    }
}

fn read(c: C, ptr: u32, len: u32) -> Result<Vec<u8>> {
    let mem = c.data().memory.ok_or_else(|| anyhow!("no memory"))?;
    let data = mem.data(&*c);
    let (s, e) = (ptr as usize, ptr as usize + len as usize);
    data.get(s..e)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| anyhow!("invalid memory access: {len} bytes at {ptr:#x}"))
}

fn read_str(c: C, ptr: u32, len: u32) -> Result<String> {
    Ok(String::from_utf8_lossy(&read(c, ptr, len)?).into_owned())
}

fn write(c: C, ptr: u32, bytes: &[u8]) -> Result<()> {
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

fn write_u32(c: C, ptr: u32, v: u32) -> Result<()> {
    write(c, ptr, &v.to_le_bytes())
}

/// Returns `Pending` once: the VM is suspended inside this host call, so that another
/// VM's callback can run in between (see [`crate::sim::SimConfig::preempt_probability`]).
struct YieldOnce(bool);

impl std::future::Future for YieldOnce {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            std::task::Poll::Ready(())
        } else {
            self.0 = true;
            std::task::Poll::Pending
        }
    }
}

/// A preemption point: with the configured probability, suspend this VM here.
async fn maybe_yield(c: C<'_, '_>) {
    let yield_now = {
        let p = &mut c.data_mut().preempt;
        p.enabled && p.rng.unit() < p.probability
    };
    if yield_now {
        c.data_mut().preempt.yields += 1;
        YieldOnce(false).await;
    }
}

/// Copies `bytes` into guest memory obtained from `proxy_on_memory_allocate` and writes
/// its pointer and size at the out-pointers (0/0 for empty data, as Envoy does).
async fn give(c: C<'_, '_>, bytes: &[u8], ptr_ptr: u32, size_ptr: u32) -> Result<()> {
    let mut ptr = 0u32;
    if !bytes.is_empty() {
        let alloc = c
            .data()
            .alloc
            .clone()
            .ok_or_else(|| anyhow!("no allocator"))?;
        ptr = alloc.call_async(&mut *c, bytes.len() as i32).await? as u32;
        if ptr == 0 {
            bail!("proxy_on_memory_allocate({}) returned null", bytes.len());
        }
        write(c, ptr, bytes)?;
    }
    write_u32(c, ptr_ptr, ptr)?;
    write_u32(c, size_ptr, bytes.len() as u32)
}

enum MapRef<'a> {
    Map(&'a mut Vec<(String, String)>, bool),
    Empty,
}

fn map_of(h: &mut HostState, t: u32) -> Result<MapRef<'_>, u32> {
    match t {
        6 | 7 => match &mut h.callout {
            Some(r) if t == 6 => Ok(MapRef::Map(&mut r.headers, false)),
            Some(_) => Ok(MapRef::Empty),
            None => Err(BAD_ARGUMENT),
        },
        0..=3 => {
            let eff = h.effective;
            let s = h.streams.get_mut(&eff).ok_or(BAD_ARGUMENT)?;
            match t {
                0 => Ok(MapRef::Map(&mut s.req_headers, s.req_headers_writable)),
                2 => match &mut s.resp_headers {
                    Some(m) => Ok(MapRef::Map(m, s.resp_headers_writable)),
                    None => Err(BAD_ARGUMENT),
                },
                _ => Ok(MapRef::Empty),
            }
        }
        _ => Err(BAD_ARGUMENT),
    }
}

fn buffer_of(h: &HostState, t: u32) -> Option<&[u8]> {
    match t {
        0 | 1 => h.streams.get(&h.effective).map(|s| {
            if t == 0 {
                s.req_body.as_slice()
            } else {
                s.resp_body.as_slice()
            }
        }),
        4 => h.callout.as_ref().map(|r| r.body.as_slice()),
        6 => Some(h.vm_config.as_slice()),
        7 => Some(h.plugin_config.as_slice()),
        _ => None,
    }
}

fn property(h: &HostState, path: &[&str]) -> Option<Vec<u8>> {
    let s = h.streams.get(&h.effective);
    let header = |name: &str| -> Option<Vec<u8>> {
        s?.req_headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone().into_bytes())
    };
    match path {
        ["plugin_name"] => Some(h.plugin_name.clone().into_bytes()),
        ["plugin_root_id"] => Some(h.root_id_name.clone().into_bytes()),
        ["plugin_vm_id"] => Some(h.vm_id.clone().into_bytes()),
        ["upstream", "address"] => s?.upstream_address.clone().map(String::into_bytes),
        ["source", "address"] => s.map(|s| s.source_address.clone().into_bytes()),
        ["destination", "address"] => s.map(|_| b"127.0.0.1:10000".to_vec()),
        ["request", "path"] => header(":path"),
        ["request", "method"] => header(":method"),
        ["request", "host"] => header(":authority"),
        ["request", "scheme"] => header(":scheme"),
        ["request", "id"] => header("x-request-id"),
        ["request", "headers", name] => header(name),
        ["response", "code"] => s?
            .response_code
            .map(|c| u64::from(c).to_le_bytes().to_vec()),
        _ => {
            let key = path.join(".");
            s?.props.get(&key).cloned()
        }
    }
}

#[allow(clippy::too_many_lines)]
async fn dispatch(imp: Imp, name: &'static str, c: C<'_, '_>, p: &[Val]) -> Result<u32> {
    {
        let h = c.data_mut();
        h.hostcalls += 1;
        let (slot, now) = (h.slot, h.now);
        let fault = {
            let mut f = h
                .faults
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if f.rules.is_empty() {
                None
            } else {
                f.check(name, slot, now)
            }
        };
        match fault {
            Some(FaultAction::Status(s)) => return Ok(s),
            Some(FaultAction::Trap) => bail!("injected fault: {name} trapped"),
            None => {}
        }
    }
    match imp {
        Imp::Log => {
            let level = arg(p, 0);
            let msg = read_str(c, arg(p, 1), arg(p, 2))?;
            push_log(c.data(), level, msg);
            Ok(OK)
        }
        Imp::GetLogLevel => {
            write_u32(c, arg(p, 0), 2)?;
            Ok(OK)
        }
        Imp::GetCurrentTime => {
            let t = EPOCH_NANOS + c.data().now;
            write(c, arg(p, 0), &t.to_le_bytes())?;
            Ok(OK)
        }
        Imp::SetTickPeriod => {
            c.data_mut().tick_period_ms = arg(p, 0);
            Ok(OK)
        }
        Imp::GetBufferBytes => {
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
        Imp::SetBufferBytes => {
            let (t, start, len) = (arg(p, 0), arg(p, 1) as usize, arg(p, 2) as usize);
            let data = read(c, arg(p, 3), arg(p, 4))?;
            let h = c.data_mut();
            let eff = h.effective;
            let Some(s) = h.streams.get_mut(&eff) else {
                return Ok(NOT_FOUND);
            };
            let buf = match t {
                0 => &mut s.req_body,
                1 => &mut s.resp_body,
                _ => return Ok(NOT_FOUND),
            };
            if start > buf.len() {
                return Ok(BAD_ARGUMENT);
            }
            let end = (start + len).min(buf.len());
            buf.splice(start..end, data);
            Ok(OK)
        }
        Imp::GetHeaderMapPairs => {
            let bytes = match map_of(c.data_mut(), arg(p, 0)) {
                Ok(MapRef::Map(m, _)) => serialize_pairs(m),
                Ok(MapRef::Empty) => serialize_pairs(&[]),
                Err(s) => return Ok(s),
            };
            give(c, &bytes, arg(p, 1), arg(p, 2)).await?;
            Ok(OK)
        }
        Imp::SetHeaderMapPairs => {
            let bytes = read(c, arg(p, 1), arg(p, 2))?;
            let Some(pairs) = deserialize_pairs(&bytes) else {
                return Ok(BAD_ARGUMENT);
            };
            match map_of(c.data_mut(), arg(p, 0)) {
                Ok(MapRef::Map(m, true)) => {
                    *m = pairs
                        .into_iter()
                        .map(|(k, v)| (k.to_ascii_lowercase(), v))
                        .collect();
                    Ok(OK)
                }
                Ok(_) => Ok(BAD_ARGUMENT),
                Err(s) => Ok(s),
            }
        }
        Imp::GetHeaderMapValue => {
            let key = read_str(c, arg(p, 1), arg(p, 2))?.to_ascii_lowercase();
            let value = match map_of(c.data_mut(), arg(p, 0)) {
                Ok(MapRef::Map(m, _)) => m.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone()),
                Ok(MapRef::Empty) => None,
                Err(s) => return Ok(s),
            };
            match value {
                Some(v) => {
                    give(c, v.as_bytes(), arg(p, 3), arg(p, 4)).await?;
                    Ok(OK)
                }
                None => Ok(NOT_FOUND),
            }
        }
        Imp::ReplaceHeaderMapValue | Imp::AddHeaderMapValue => {
            let key = read_str(c, arg(p, 1), arg(p, 2))?.to_ascii_lowercase();
            let value = read_str(c, arg(p, 3), arg(p, 4))?;
            match map_of(c.data_mut(), arg(p, 0)) {
                Ok(MapRef::Map(m, true)) => {
                    if imp == Imp::ReplaceHeaderMapValue {
                        if let Some(i) = m.iter().position(|(k, _)| *k == key) {
                            m[i].1 = value;
                            let mut j = i + 1;
                            while j < m.len() {
                                if m[j].0 == key {
                                    m.remove(j);
                                } else {
                                    j += 1;
                                }
                            }
                            return Ok(OK);
                        }
                    }
                    m.push((key, value));
                    Ok(OK)
                }
                Ok(_) => Ok(BAD_ARGUMENT),
                Err(s) => Ok(s),
            }
        }
        Imp::RemoveHeaderMapValue => {
            let key = read_str(c, arg(p, 1), arg(p, 2))?.to_ascii_lowercase();
            match map_of(c.data_mut(), arg(p, 0)) {
                Ok(MapRef::Map(m, true)) => {
                    m.retain(|(k, _)| *k != key);
                    Ok(OK)
                }
                Ok(_) => Ok(BAD_ARGUMENT),
                Err(s) => Ok(s),
            }
        }
        Imp::GetProperty => {
            let raw = read_str(c, arg(p, 0), arg(p, 1))?;
            let path: Vec<&str> = raw.split('\0').filter(|s| !s.is_empty()).collect();
            match property(c.data(), &path) {
                Some(v) => {
                    give(c, &v, arg(p, 2), arg(p, 3)).await?;
                    Ok(OK)
                }
                None => Ok(NOT_FOUND),
            }
        }
        Imp::SetProperty => {
            let raw = read_str(c, arg(p, 0), arg(p, 1))?;
            let value = read(c, arg(p, 2), arg(p, 3))?;
            let key = raw
                .split('\0')
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(".");
            let h = c.data_mut();
            let eff = h.effective;
            match h.streams.get_mut(&eff) {
                Some(s) => {
                    s.props.insert(key, value);
                    Ok(OK)
                }
                None => Ok(NOT_FOUND),
            }
        }
        Imp::GetSharedData => {
            maybe_yield(c).await;
            let key = read_str(c, arg(p, 0), arg(p, 1))?;
            let got = {
                let h = c.data();
                let vm_id = h.vm_id.clone();
                let r = h
                    .shared
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .get(&vm_id, &key);
                r
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
        Imp::SetSharedData => {
            maybe_yield(c).await;
            let key = read_str(c, arg(p, 0), arg(p, 1))?;
            let value = read(c, arg(p, 2), arg(p, 3))?;
            let cas = arg(p, 4);
            let h = c.data();
            let r = h
                .shared
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .set(&h.vm_id, &key, &value, cas);
            Ok(match r {
                SetResult::Ok => OK,
                SetResult::CasMismatch => CAS_MISMATCH,
            })
        }
        Imp::RegisterSharedQueue => {
            let name = read_str(c, arg(p, 0), arg(p, 1))?;
            let token = {
                let h = c.data();
                let owner = QueueOwner {
                    slot: h.slot,
                    root: h.root_id,
                };
                let t = h
                    .shared
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .register_queue(&h.vm_id, &name, owner);
                t
            };
            write_u32(c, arg(p, 2), token)?;
            Ok(OK)
        }
        Imp::ResolveSharedQueue => {
            let vm_id = read_str(c, arg(p, 0), arg(p, 1))?;
            let name = read_str(c, arg(p, 2), arg(p, 3))?;
            let token = {
                let h = c.data();
                let vm_id = if vm_id.is_empty() {
                    h.vm_id.clone()
                } else {
                    vm_id
                };
                let t = h
                    .shared
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .resolve_queue(&vm_id, &name);
                t
            };
            match token {
                Some(t) => {
                    write_u32(c, arg(p, 4), t)?;
                    Ok(OK)
                }
                None => Ok(NOT_FOUND),
            }
        }
        Imp::EnqueueSharedQueue => {
            maybe_yield(c).await;
            let token = arg(p, 0);
            let value = read(c, arg(p, 1), arg(p, 2))?;
            let h = c.data_mut();
            let owner = h
                .shared
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .enqueue(token, &value);
            match owner {
                Some(o) => {
                    h.outgoing.push(Outgoing::QueueReady {
                        slot: o.slot,
                        root: o.root,
                        token,
                    });
                    Ok(OK)
                }
                None => Ok(NOT_FOUND),
            }
        }
        Imp::DequeueSharedQueue => {
            let token = arg(p, 0);
            let r = c
                .data()
                .shared
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .dequeue(token);
            match r {
                Err(()) => Ok(NOT_FOUND),
                Ok(None) => Ok(EMPTY),
                Ok(Some(v)) => {
                    give(c, &v, arg(p, 1), arg(p, 2)).await?;
                    Ok(OK)
                }
            }
        }
        Imp::ContinueStream | Imp::CloseStream => {
            let h = c.data_mut();
            let ctx = h.effective;
            if !h.streams.contains_key(&ctx) {
                return Ok(BAD_ARGUMENT);
            }
            let dir = match arg(p, 0) {
                0 => StreamDir::Request,
                1 => StreamDir::Response,
                _ => return Ok(BAD_ARGUMENT),
            };
            h.effects.push(if imp == Imp::ContinueStream {
                Effect::Continue { ctx, dir }
            } else {
                Effect::Close { ctx }
            });
            Ok(OK)
        }
        Imp::SendLocalResponse => {
            let status = arg(p, 0);
            let details = read_str(c, arg(p, 1), arg(p, 2))?;
            let body = read(c, arg(p, 3), arg(p, 4))?;
            let hdr = read(c, arg(p, 5), arg(p, 6))?;
            let Some(headers) = deserialize_pairs(&hdr) else {
                return Ok(BAD_ARGUMENT);
            };
            let h = c.data_mut();
            let ctx = h.effective;
            if !h.streams.contains_key(&ctx) {
                return Ok(BAD_ARGUMENT);
            }
            h.effects.push(Effect::LocalReply {
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
        Imp::HttpCall => {
            let cluster = read_str(c, arg(p, 0), arg(p, 1))?;
            let hdr = read(c, arg(p, 2), arg(p, 3))?;
            let body = read(c, arg(p, 4), arg(p, 5))?;
            let timeout_ms = arg(p, 8);
            let token_ptr = arg(p, 9);
            let Some(headers) = deserialize_pairs(&hdr) else {
                return Ok(BAD_ARGUMENT);
            };
            let token = {
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
                    root: h.root_id,
                    cluster,
                    headers,
                    body,
                    timeout_ms,
                });
                token
            };
            write_u32(c, token_ptr, token)?;
            Ok(OK)
        }
        // No gRPC services are configured in the simulated Envoy.
        Imp::GrpcCall | Imp::GrpcStream => Ok(BAD_ARGUMENT),
        Imp::GrpcSend | Imp::GrpcCancel | Imp::GrpcClose => Ok(NOT_FOUND),
        Imp::GetStatus => Ok(NOT_FOUND),
        Imp::SetEffectiveContext => {
            let ctx = arg(p, 0);
            let h = c.data_mut();
            if ctx == h.root_id || h.streams.contains_key(&ctx) {
                h.effective = ctx;
                Ok(OK)
            } else {
                Ok(BAD_ARGUMENT)
            }
        }
        // cpp-host's `WasmBase::done`: only a root that answered `on_done` with false
        // (pending done) may call it; otherwise NotFound.
        Imp::Done => {
            let h = c.data_mut();
            if h.draining && !h.done_signalled {
                h.done_signalled = true;
                Ok(OK)
            } else {
                Ok(NOT_FOUND)
            }
        }
        Imp::CallForeignFunction => {
            let fname = read_str(c, arg(p, 0), arg(p, 1))?;
            match fname.as_str() {
                "clear_route_cache" => {
                    give(c, &[], arg(p, 4), arg(p, 5)).await?;
                    Ok(OK)
                }
                _ => Ok(NOT_FOUND),
            }
        }
        Imp::DefineMetric => {
            let kind = match arg(p, 0) {
                0 => MetricKind::Counter,
                1 => MetricKind::Gauge,
                2 => MetricKind::Histogram,
                _ => return Ok(BAD_ARGUMENT),
            };
            let name = read_str(c, arg(p, 1), arg(p, 2))?;
            let full = format!("wasmcustom.{name}");
            let id = {
                let h = c.data_mut();
                h.shared
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .define_stat(&full, kind);
                h.new_metric_id(kind, full)
            };
            write_u32(c, arg(p, 3), id)?;
            Ok(OK)
        }
        Imp::IncrementMetric | Imp::RecordMetric => {
            let id = arg(p, 0);
            let v = arg64(p, 1);
            let h = c.data();
            let Some((name, kind)) = h.metric_ids.get(&id) else {
                return Ok(NOT_FOUND);
            };
            let mut shared = h
                .shared
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let Some(stat) = shared.stat_mut(name) else {
                return Ok(NOT_FOUND);
            };
            Ok(match (imp, kind) {
                (Imp::IncrementMetric, MetricKind::Counter) if v > 0 => {
                    stat.value = stat.value.wrapping_add(v as u64);
                    OK
                }
                (Imp::IncrementMetric, MetricKind::Gauge) => {
                    stat.value = stat.value.wrapping_add(v as u64);
                    OK
                }
                (Imp::IncrementMetric, _) => BAD_ARGUMENT,
                (_, MetricKind::Counter) => {
                    stat.value = stat.value.wrapping_add(v as u64);
                    OK
                }
                (_, MetricKind::Gauge) => {
                    stat.value = v as u64;
                    OK
                }
                (_, MetricKind::Histogram) => {
                    stat.samples.push(v as u64);
                    OK
                }
            })
        }
        Imp::GetMetric => {
            let id = arg(p, 0);
            let value = {
                let h = c.data();
                let Some((name, kind)) = h.metric_ids.get(&id) else {
                    return Ok(NOT_FOUND);
                };
                if *kind == MetricKind::Histogram {
                    return Ok(BAD_ARGUMENT);
                }
                let shared = h
                    .shared
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                shared.stats.get(name).map_or(0, |s| s.value)
            };
            write(c, arg(p, 1), &value.to_le_bytes())?;
            Ok(OK)
        }
        Imp::FdWrite => {
            let (fd, iovs, n, out) = (arg(p, 0), arg(p, 1), arg(p, 2), arg(p, 3));
            let mut text = Vec::new();
            for i in 0..n {
                let iov = read(c, iovs + i * 8, 8)?;
                let ptr = u32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]);
                let len = u32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]);
                text.extend(read(c, ptr, len)?);
            }
            write_u32(c, out, text.len() as u32)?;
            let level = if fd == 1 { 6 } else { 7 };
            push_log(c.data(), level, String::from_utf8_lossy(&text).into_owned());
            Ok(0)
        }
        Imp::EnvironSizesGet | Imp::ArgsSizesGet => {
            write_u32(c, arg(p, 0), 0)?;
            write_u32(c, arg(p, 1), 0)?;
            Ok(0)
        }
        Imp::EnvironGet | Imp::ArgsGet => Ok(0),
        Imp::RandomGet => {
            let mut buf = vec![0u8; arg(p, 1) as usize];
            c.data_mut().rng.fill(&mut buf);
            write(c, arg(p, 0), &buf)?;
            Ok(0)
        }
        Imp::ProcExit => bail!("the module called proc_exit({})", arg(p, 0)),
        Imp::ClockTimeGet => {
            let t = EPOCH_NANOS + c.data().now;
            write(c, arg(p, 2), &t.to_le_bytes())?;
            Ok(0)
        }
        Imp::FdClose | Imp::FdSeek | Imp::FdFdstatGet => Ok(8), // WASI EBADF
        Imp::SchedYield => Ok(0),
    }
}

fn push_log(h: &HostState, level: u32, message: String) {
    let mut log = h
        .log
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if log.len() < 200_000 {
        log.push(LogLine {
            at: h.now,
            slot: h.slot,
            level,
            message,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_pairs_round_trip_in_the_wire_format() {
        let pairs = vec![
            (":path".to_string(), "/v1".to_string()),
            ("x".to_string(), String::new()),
        ];
        let b = serialize_pairs(&pairs);
        assert_eq!(&b[..4], &2u32.to_le_bytes());
        assert_eq!(&b[4..8], &5u32.to_le_bytes());
        assert_eq!(deserialize_pairs(&b), Some(pairs));
        assert_eq!(deserialize_pairs(&b[..b.len() - 3]), None);
    }
}
