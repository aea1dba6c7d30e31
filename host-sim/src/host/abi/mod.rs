//! The imports: every `env` function of Proxy-Wasm ABI 0.2.1 and the WASI functions a
//! `wasm32-wasip1` filter links, with Envoy 1.40's behaviour.
//!
//! Imports are bound with `Linker::func_new` from the module's own import list: `Imp`
//! names each one, `dispatch` sends it to the function that implements it, one small
//! module per group of the ABI. An import host-sim does not know fails instantiation
//! with its name and signature.
//!
//! | module | imports |
//! |---|---|
//! | `logging` | `proxy_log`, `proxy_get_log_level` |
//! | `time` | `proxy_get_current_time_nanoseconds`, `proxy_set_tick_period_milliseconds` |
//! | `buffers` | `proxy_get_buffer_bytes`, `proxy_set_buffer_bytes` |
//! | `headers` | `proxy_{get,set}_header_map_pairs`, `proxy_{get,replace,add,remove}_header_map_value` |
//! | `properties` | `proxy_get_property`, `proxy_set_property` |
//! | `shared_data` | `proxy_get_shared_data`, `proxy_set_shared_data` |
//! | `queues` | `proxy_{register,resolve,enqueue,dequeue}_shared_queue` |
//! | `stream` | `proxy_continue_stream`, `proxy_close_stream`, `proxy_send_local_response` |
//! | `contexts` | `proxy_set_effective_context`, `proxy_done` |
//! | `callouts` | `proxy_http_call`, `proxy_grpc_*`, `proxy_get_status` |
//! | `metrics` | `proxy_{define,increment,record,get}_metric` |
//! | `foreign` | `proxy_call_foreign_function` |
//! | `wasi` | `fd_write`, `environ_*`, `args_*`, `random_get`, `proc_exit`, `clock_time_get`, ... |
//!
//! `memory` reads arguments and guest memory, `preempt` holds the preemption point,
//! `wire` the header-pair wire format.

mod buffers;
mod callouts;
mod contexts;
mod foreign;
mod headers;
mod logging;
mod memory;
mod metrics;
mod preempt;
mod properties;
mod queues;
mod shared_data;
mod stream;
mod time;
mod wasi;
mod wire;

pub use wire::{deserialize_pairs, serialize_pairs};

use super::faults::FaultAction;
use super::lock;
use super::vm::HostState;
use anyhow::{bail, Result};
use memory::C;
use wasmtime::{Engine, ExternType, Linker, Module, Val};

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

/// One import host-sim implements.
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
    /// The import named `module`.`name`, if host-sim implements it.
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

/// Runs one host call: an injected fault if one fires, else the import's function.
/// Returns the status (or WASI errno) the import answers with; `Err` traps the VM.
async fn dispatch(imp: Imp, name: &'static str, c: C<'_, '_>, p: &[Val]) -> Result<u32> {
    {
        let left = c.get_fuel().ok();
        let h = c.data_mut();
        h.import = name;
        lock(&h.calls).call(name);
        if let Some(left) = left.filter(|_| crate::host::module::counting_fuel()) {
            // The wasm instructions since the callback began or its last host call.
            let (callback, from, at) = h.stretch;
            lock(&h.calls).stretch(callback, from, name, at.saturating_sub(left));
            h.stretch = (callback, name, left);
        }
    }
    match injected_fault(c.data(), name) {
        Some(FaultAction::Status(s)) => return Ok(s),
        Some(FaultAction::Trap) => bail!("injected fault: {name} trapped"),
        None => {}
    }
    match imp {
        Imp::Log => logging::log(c, p),
        Imp::GetLogLevel => logging::get_log_level(c, p),
        Imp::GetCurrentTime => time::get_current_time(c, p),
        Imp::SetTickPeriod => time::set_tick_period(c, p),
        Imp::GetBufferBytes => buffers::get(c, p).await,
        Imp::SetBufferBytes => buffers::set(c, p),
        Imp::GetHeaderMapPairs => headers::get_pairs(c, p).await,
        Imp::SetHeaderMapPairs => headers::set_pairs(c, p),
        Imp::GetHeaderMapValue => headers::get_value(c, p).await,
        Imp::ReplaceHeaderMapValue => headers::replace_value(c, p),
        Imp::AddHeaderMapValue => headers::add_value(c, p),
        Imp::RemoveHeaderMapValue => headers::remove_value(c, p),
        Imp::GetProperty => properties::get(c, p).await,
        Imp::SetProperty => properties::set(c, p),
        Imp::GetSharedData => shared_data::get(c, p).await,
        Imp::SetSharedData => shared_data::set(c, p).await,
        Imp::RegisterSharedQueue => queues::register(c, p),
        Imp::ResolveSharedQueue => queues::resolve(c, p),
        Imp::EnqueueSharedQueue => queues::enqueue(c, p).await,
        Imp::DequeueSharedQueue => queues::dequeue(c, p).await,
        Imp::ContinueStream => stream::continue_stream(c, p),
        Imp::CloseStream => stream::close_stream(c, p),
        Imp::SendLocalResponse => stream::send_local_response(c, p),
        Imp::HttpCall => callouts::http_call(c, p),
        Imp::GrpcCall | Imp::GrpcStream => Ok(callouts::GRPC_OPEN),
        Imp::GrpcSend | Imp::GrpcCancel | Imp::GrpcClose | Imp::GetStatus => {
            Ok(callouts::GRPC_ON_STREAM)
        }
        Imp::SetEffectiveContext => contexts::set_effective_context(c, p),
        Imp::Done => contexts::done(c),
        Imp::CallForeignFunction => foreign::call(c, p).await,
        Imp::DefineMetric => metrics::define(c, p),
        Imp::IncrementMetric => metrics::increment(c, p),
        Imp::RecordMetric => metrics::record(c, p),
        Imp::GetMetric => metrics::get(c, p),
        Imp::FdWrite => wasi::fd_write(c, p),
        Imp::EnvironSizesGet | Imp::ArgsSizesGet => wasi::sizes_get(c, p),
        Imp::EnvironGet | Imp::ArgsGet | Imp::SchedYield => Ok(wasi::SUCCESS),
        Imp::RandomGet => wasi::random_get(c, p),
        Imp::ProcExit => wasi::proc_exit(p),
        Imp::ClockTimeGet => wasi::clock_time_get(c, p),
        Imp::FdClose | Imp::FdSeek | Imp::FdFdstatGet => Ok(wasi::EBADF),
    }
}

/// The action of an injected fault that fires on this call, if any.
fn injected_fault(h: &HostState, name: &str) -> Option<FaultAction> {
    let mut faults = lock(&h.faults);
    if faults.rules.is_empty() {
        None
    } else {
        faults.check(name, h.slot, h.now)
    }
}
