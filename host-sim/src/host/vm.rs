//! One VM: a wasmtime `Store` with an instance of the filter module, its contexts, and
//! the per-VM host state the imports work on.

use super::calls::CallCounts;
use super::effects::{Effect, Outgoing};
use super::faults::Faults;
use super::lock;
use super::shared::{MetricKind, Shared};
use crate::world::clock::{Nanos, Rng};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use wasmtime::{Instance, Linker, Memory, Module, Store, TypedFunc};

/// An upstream cluster the filter can send callouts to (an ORIGINAL_DST cluster that
/// routes on `dst_header`).
#[derive(Debug, Clone)]
pub struct Cluster {
    /// Cluster name, as passed to `dispatch_http_call`.
    pub name: String,
    /// Request header naming the destination `ip:port`.
    pub dst_header: String,
}

/// One log line from a VM (`proxy_log` or WASI stdout/stderr).
#[derive(Debug, Clone)]
pub struct LogLine {
    /// Virtual time.
    pub at: Nanos,
    /// Thread slot of the VM.
    pub slot: usize,
    /// proxy-wasm log level (0 trace .. 5 critical); 6 = WASI stdout, 7 = WASI stderr.
    pub level: u32,
    /// The message.
    pub message: String,
}

/// The HTTP side of one stream, as the filter sees it through host calls.
#[derive(Debug, Default)]
pub struct HttpData {
    /// The world's stream (request) id.
    pub sid: usize,
    /// Request headers (lower-case names, in order).
    pub req_headers: Vec<(String, String)>,
    /// Whether the filter may still change them (headers not yet passed on).
    pub req_headers_writable: bool,
    /// The request body the current callback sees (cumulative while buffering).
    pub req_body: Vec<u8>,
    /// Response headers, once there is a response.
    pub resp_headers: Option<Vec<(String, String)>>,
    /// Whether the filter may still change them.
    pub resp_headers_writable: bool,
    /// The response body the current callback sees.
    pub resp_body: Vec<u8>,
    /// `upstream.address`, once connected.
    pub upstream_address: Option<String>,
    /// `source.address` (the client).
    pub source_address: String,
    /// `response.code`.
    pub response_code: Option<u16>,
    /// Properties set by the filter.
    pub props: BTreeMap<String, Vec<u8>>,
}

/// The response of an HTTP callout, readable during `on_http_call_response`.
#[derive(Debug, Default, Clone)]
pub struct CalloutResponse {
    /// Headers (`:status` first).
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
}

/// Preemption inside host calls (suspend a VM mid-callback so another runs).
#[derive(Debug, Clone)]
pub struct Preempt {
    /// Whether the current callback may be suspended.
    pub enabled: bool,
    /// Chance of suspending at each preemption point.
    pub probability: f64,
    /// Seeded source of those choices.
    pub rng: Rng,
}

/// Runs a future that waits on nothing external to completion (polling again when a VM
/// suspends itself with nobody to switch to).
pub fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

/// Everything the imports of one VM work on.
pub struct HostState {
    /// Thread slot (0 base, 1 main thread, 2.. workers).
    pub slot: usize,
    /// The plugin's `vm_id` (keys shared data and queues).
    pub vm_id: String,
    /// Plugin name and root id (properties `plugin_name`, `plugin_root_id`).
    pub plugin_name: String,
    /// Root id of the plugin.
    pub root_id_name: String,
    /// Process-wide store.
    pub shared: Arc<Mutex<Shared>>,
    /// Injected failures.
    pub faults: Arc<Mutex<Faults>>,
    /// Process log.
    pub log: Arc<Mutex<Vec<LogLine>>>,
    /// Calls across the VM boundary, process-wide.
    pub calls: Arc<Mutex<CallCounts>>,
    /// The import being served (bytes handed to the VM are counted under it).
    pub import: &'static str,
    /// With fuel counted: the callback running, and where its current stretch of wasm
    /// instructions began (its start or the last host call) with the fuel left there.
    pub stretch: (&'static str, &'static str, u64),
    /// Virtual time of the current callback.
    pub now: Nanos,
    /// The root context id.
    pub root_id: u32,
    /// The context of the current callback.
    pub current: u32,
    /// The effective context (`set_effective_context`).
    pub effective: u32,
    /// Live HTTP contexts.
    pub streams: HashMap<u32, HttpData>,
    /// Next context id.
    pub next_ctx: u32,
    /// Deferred actions of the current callback.
    pub effects: Vec<Effect>,
    /// Messages for the world from the current callback.
    pub outgoing: Vec<Outgoing>,
    /// The root context's tick period (0 = none).
    pub tick_period_ms: u32,
    /// Plugin configuration (`on_configure`).
    pub plugin_config: Vec<u8>,
    /// VM configuration (`on_vm_start`).
    pub vm_config: Vec<u8>,
    /// WASI `random_get` source (seeded).
    pub rng: Rng,
    /// This VM's metric ids.
    pub metric_ids: HashMap<u32, (String, MetricKind)>,
    next_metric_id: u32,
    /// Callout response during `on_http_call_response`.
    pub callout: Option<CalloutResponse>,
    /// Next callout token.
    pub next_callout: u32,
    /// Clusters for callouts.
    pub clusters: Arc<Vec<Cluster>>,
    /// Callouts in flight process-wide, and the circuit-breaker limit.
    pub callouts_in_flight: Arc<AtomicU32>,
    /// Circuit-breaker limit (max pending requests) for callouts.
    pub callout_limit: u32,
    /// The guest's memory and allocator.
    pub memory: Option<Memory>,
    /// `proxy_on_memory_allocate`.
    pub alloc: Option<TypedFunc<i32, i32>>,
    /// Preemption state.
    pub preempt: Preempt,
    /// The root answered `on_done` with false: `proxy_done` is expected.
    pub draining: bool,
    /// `proxy_done` was called while draining (the host deletes the root after the call).
    pub done_signalled: bool,
}

impl HostState {
    /// Allocates a context id.
    pub fn alloc_ctx(&mut self) -> u32 {
        let id = self.next_ctx;
        self.next_ctx += 1;
        id
    }

    /// A new metric id of `kind` (Envoy: type in the low 2 bits, ids step by 4).
    pub fn new_metric_id(&mut self, kind: MetricKind, name: String) -> u32 {
        self.next_metric_id += 4;
        let id = self.next_metric_id
            | match kind {
                MetricKind::Counter => 0,
                MetricKind::Gauge => 1,
                MetricKind::Histogram => 2,
            };
        self.metric_ids.insert(id, (name, kind));
        id
    }
}

/// Settings a VM is created with.
pub struct VmInit {
    /// Thread slot.
    pub slot: usize,
    /// `vm_id`.
    pub vm_id: String,
    /// Plugin name.
    pub plugin_name: String,
    /// Root id.
    pub root_id_name: String,
    /// Plugin configuration.
    pub plugin_config: Vec<u8>,
    /// VM configuration.
    pub vm_config: Vec<u8>,
    /// Seed for WASI randomness.
    pub seed: u64,
    /// Shared store.
    pub shared: Arc<Mutex<Shared>>,
    /// Faults.
    pub faults: Arc<Mutex<Faults>>,
    /// Log.
    pub log: Arc<Mutex<Vec<LogLine>>>,
    /// Call counts.
    pub calls: Arc<Mutex<CallCounts>>,
    /// Clusters.
    pub clusters: Arc<Vec<Cluster>>,
    /// Callouts in flight.
    pub callouts_in_flight: Arc<AtomicU32>,
    /// Callout circuit breaker.
    pub callout_limit: u32,
    /// Chance of suspending at each preemption point.
    pub preempt_probability: f64,
}

/// A callback into the filter (the ABI 0.2.1 exports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Callback {
    /// `proxy_on_context_create(ctx, parent)`.
    ContextCreate(u32, u32),
    /// `proxy_on_vm_start(root, vm_config_size)`.
    VmStart(u32, u32),
    /// `proxy_on_configure(root, plugin_config_size)`.
    Configure(u32, u32),
    /// `proxy_on_tick(root)`.
    Tick(u32),
    /// `proxy_on_queue_ready(root, token)`.
    QueueReady(u32, u32),
    /// `proxy_on_request_headers(ctx, headers, end_of_stream)`.
    RequestHeaders(u32, u32, bool),
    /// `proxy_on_request_body(ctx, size, end_of_stream)`.
    RequestBody(u32, u32, bool),
    /// `proxy_on_response_headers(ctx, headers, end_of_stream)`.
    ResponseHeaders(u32, u32, bool),
    /// `proxy_on_response_body(ctx, size, end_of_stream)`.
    ResponseBody(u32, u32, bool),
    /// `proxy_on_log(ctx)`.
    Log(u32),
    /// `proxy_on_done(ctx)`.
    Done(u32),
    /// `proxy_on_delete(ctx)`.
    Delete(u32),
    /// `proxy_on_http_call_response(root, token, headers, body_size, trailers)`.
    HttpCallResponse(u32, u32, u32, u32, u32),
}

impl Callback {
    /// The context the callback runs in.
    pub fn context(&self) -> u32 {
        match *self {
            Callback::ContextCreate(c, _)
            | Callback::VmStart(c, _)
            | Callback::Configure(c, _)
            | Callback::Tick(c)
            | Callback::QueueReady(c, _)
            | Callback::RequestHeaders(c, ..)
            | Callback::RequestBody(c, ..)
            | Callback::ResponseHeaders(c, ..)
            | Callback::ResponseBody(c, ..)
            | Callback::Log(c)
            | Callback::Done(c)
            | Callback::Delete(c)
            | Callback::HttpCallResponse(c, ..) => c,
        }
    }

    /// The export's name.
    pub fn name(&self) -> &'static str {
        match self {
            Callback::ContextCreate(..) => "proxy_on_context_create",
            Callback::VmStart(..) => "proxy_on_vm_start",
            Callback::Configure(..) => "proxy_on_configure",
            Callback::Tick(..) => "proxy_on_tick",
            Callback::QueueReady(..) => "proxy_on_queue_ready",
            Callback::RequestHeaders(..) => "proxy_on_request_headers",
            Callback::RequestBody(..) => "proxy_on_request_body",
            Callback::ResponseHeaders(..) => "proxy_on_response_headers",
            Callback::ResponseBody(..) => "proxy_on_response_body",
            Callback::Log(..) => "proxy_on_log",
            Callback::Done(..) => "proxy_on_done",
            Callback::Delete(..) => "proxy_on_delete",
            Callback::HttpCallResponse(..) => "proxy_on_http_call_response",
        }
    }

    /// A small number identifying the callback, for the trace hash.
    pub fn code(&self) -> u64 {
        match self {
            Callback::ContextCreate(..) => 1,
            Callback::VmStart(..) => 2,
            Callback::Configure(..) => 3,
            Callback::Tick(..) => 4,
            Callback::QueueReady(..) => 5,
            Callback::RequestHeaders(..) => 6,
            Callback::RequestBody(..) => 7,
            Callback::ResponseHeaders(..) => 8,
            Callback::ResponseBody(..) => 9,
            Callback::Log(..) => 10,
            Callback::Done(..) => 11,
            Callback::Delete(..) => 12,
            Callback::HttpCallResponse(..) => 13,
        }
    }
}

type F2 = TypedFunc<(i32, i32), ()>;
type F2R = TypedFunc<(i32, i32), i32>;
type F3R = TypedFunc<(i32, i32, i32), i32>;
type F1 = TypedFunc<i32, ()>;
type F5 = TypedFunc<(i32, i32, i32, i32, i32), ()>;

struct Exports {
    context_create: Option<F2>,
    vm_start: Option<F2R>,
    configure: Option<F2R>,
    tick: Option<F1>,
    queue_ready: Option<F2>,
    request_headers: Option<F3R>,
    request_body: Option<F3R>,
    response_headers: Option<F3R>,
    response_body: Option<F3R>,
    log: Option<F1>,
    done: Option<TypedFunc<i32, i32>>,
    delete: Option<F1>,
    http_call_response: Option<F5>,
}

impl Exports {
    /// Whether the module exports `cb`'s function.
    fn has(&self, cb: &Callback) -> bool {
        match cb {
            Callback::ContextCreate(..) => self.context_create.is_some(),
            Callback::VmStart(..) => self.vm_start.is_some(),
            Callback::Configure(..) => self.configure.is_some(),
            Callback::Tick(..) => self.tick.is_some(),
            Callback::QueueReady(..) => self.queue_ready.is_some(),
            Callback::RequestHeaders(..) => self.request_headers.is_some(),
            Callback::RequestBody(..) => self.request_body.is_some(),
            Callback::ResponseHeaders(..) => self.response_headers.is_some(),
            Callback::ResponseBody(..) => self.response_body.is_some(),
            Callback::Log(..) => self.log.is_some(),
            Callback::Done(..) => self.done.is_some(),
            Callback::Delete(..) => self.delete.is_some(),
            Callback::HttpCallResponse(..) => self.http_call_response.is_some(),
        }
    }
}

/// One VM instance.
pub struct Vm {
    /// The store (holds the [`HostState`]).
    pub store: Store<HostState>,
    exports: Exports,
    /// Set when the VM trapped: when, and the error with its wasm backtrace.
    pub failed: Option<(Nanos, String)>,
}

impl Vm {
    /// Instantiates `module` and runs `_initialize`. The caller then creates the root
    /// context and runs `on_vm_start` / `on_configure`.
    pub fn new(
        engine: &wasmtime::Engine,
        linker: &Linker<HostState>,
        module: &Module,
        init: VmInit,
    ) -> anyhow::Result<Vm> {
        let state = HostState {
            slot: init.slot,
            vm_id: init.vm_id,
            plugin_name: init.plugin_name,
            root_id_name: init.root_id_name,
            shared: init.shared,
            faults: init.faults,
            log: init.log,
            calls: init.calls,
            import: "",
            stretch: ("", "", 0),
            now: 0,
            root_id: 0,
            current: 0,
            effective: 0,
            streams: HashMap::new(),
            next_ctx: 1,
            effects: Vec::new(),
            outgoing: Vec::new(),
            tick_period_ms: 0,
            plugin_config: init.plugin_config,
            vm_config: init.vm_config,
            rng: Rng::new(init.seed, 77),
            metric_ids: HashMap::new(),
            next_metric_id: 0,
            callout: None,
            next_callout: 0,
            clusters: init.clusters,
            callouts_in_flight: init.callouts_in_flight,
            callout_limit: init.callout_limit,
            memory: None,
            alloc: None,
            preempt: Preempt {
                enabled: false,
                probability: init.preempt_probability,
                rng: Rng::new(init.seed, 78),
            },
            draining: false,
            done_signalled: false,
        };
        // Envoy refuses a module that names no ABI version it knows.
        let abi_versions = [
            "proxy_abi_version_0_2_1",
            "proxy_abi_version_0_2_0",
            "proxy_abi_version_0_1_0",
        ];
        if !module.exports().any(|e| abi_versions.contains(&e.name())) {
            anyhow::bail!("the module exports no proxy_abi_version_* function");
        }
        let mut store = Store::new(engine, state);
        if super::module::counting_fuel() {
            store.set_fuel(u64::MAX / 4)?;
        }
        let instance: Instance = block_on(linker.instantiate_async(&mut store, module))?;
        let memory = instance
            .get_memory(&mut store, "memory")
            .ok_or_else(|| anyhow::anyhow!("the module exports no `memory`"))?;
        let alloc = instance
            .get_typed_func::<i32, i32>(&mut store, "proxy_on_memory_allocate")
            .or_else(|_| instance.get_typed_func::<i32, i32>(&mut store, "malloc"))
            .map_err(|_| anyhow::anyhow!("the module exports no `proxy_on_memory_allocate`"))?;
        store.data_mut().memory = Some(memory);
        store.data_mut().alloc = Some(alloc);
        macro_rules! get {
            ($name:literal) => {
                instance.get_typed_func(&mut store, $name).ok()
            };
        }
        let exports = Exports {
            context_create: get!("proxy_on_context_create"),
            vm_start: get!("proxy_on_vm_start"),
            configure: get!("proxy_on_configure"),
            tick: get!("proxy_on_tick"),
            queue_ready: get!("proxy_on_queue_ready"),
            request_headers: get!("proxy_on_request_headers"),
            request_body: get!("proxy_on_request_body"),
            response_headers: get!("proxy_on_response_headers"),
            response_body: get!("proxy_on_response_body"),
            log: get!("proxy_on_log"),
            done: get!("proxy_on_done"),
            delete: get!("proxy_on_delete"),
            http_call_response: get!("proxy_on_http_call_response"),
        };
        for init_name in ["_initialize", "_start"] {
            if let Ok(f) = instance.get_typed_func::<(), ()>(&mut store, init_name) {
                block_on(f.call_async(&mut store, ()))?;
                break;
            }
        }
        Ok(Vm {
            store,
            exports,
            failed: None,
        })
    }

    /// Runs one callback (no effects processing: see the world). Returns the export's
    /// return value (0 for exports without one).
    pub async fn invoke(mut self, cb: Callback) -> (Vm, wasmtime::Result<i32>) {
        let r = self.invoke_ref(cb).await;
        (self, r)
    }

    async fn invoke_ref(&mut self, cb: Callback) -> wasmtime::Result<i32> {
        if !self.exports.has(&cb) {
            // As Envoy, a callback the module does not export is skipped: no VM entry.
            return self.dispatch(cb).await;
        }
        lock(&self.store.data().calls).call(cb.name());
        if !super::module::counting_fuel() {
            return self.dispatch(cb).await;
        }
        const FULL: u64 = u64::MAX / 4;
        self.store.set_fuel(FULL)?;
        self.store.data_mut().stretch = (cb.name(), "start", FULL);
        let r = self.dispatch(cb).await;
        let left = self.store.get_fuel().unwrap_or(FULL);
        let (name, from, at) = self.store.data().stretch;
        let mut calls = lock(&self.store.data().calls);
        calls.fuel(cb.name(), FULL.saturating_sub(left));
        calls.stretch(name, from, "end", at.saturating_sub(left));
        r
    }

    async fn dispatch(&mut self, cb: Callback) -> wasmtime::Result<i32> {
        let s = &mut self.store;
        let b = |x: bool| i32::from(x);
        let i = |x: u32| x as i32;
        let e = &self.exports;
        match cb {
            Callback::ContextCreate(c, p) => call0(&e.context_create, s, (i(c), i(p))).await,
            Callback::VmStart(c, n) => call1(&e.vm_start, s, (i(c), i(n)), 1).await,
            Callback::Configure(c, n) => call1(&e.configure, s, (i(c), i(n)), 1).await,
            Callback::Tick(c) => call0(&e.tick, s, i(c)).await,
            Callback::QueueReady(c, t) => call0(&e.queue_ready, s, (i(c), i(t))).await,
            Callback::RequestHeaders(c, n, eos) => {
                call1(&e.request_headers, s, (i(c), i(n), b(eos)), 0).await
            }
            Callback::RequestBody(c, n, eos) => {
                call1(&e.request_body, s, (i(c), i(n), b(eos)), 0).await
            }
            Callback::ResponseHeaders(c, n, eos) => {
                call1(&e.response_headers, s, (i(c), i(n), b(eos)), 0).await
            }
            Callback::ResponseBody(c, n, eos) => {
                call1(&e.response_body, s, (i(c), i(n), b(eos)), 0).await
            }
            Callback::Log(c) => call0(&e.log, s, i(c)).await,
            Callback::Done(c) => call1(&e.done, s, i(c), 1).await,
            Callback::Delete(c) => call0(&e.delete, s, i(c)).await,
            Callback::HttpCallResponse(c, t, h, bsz, tr) => {
                call0(&e.http_call_response, s, (i(c), i(t), i(h), i(bsz), i(tr))).await
            }
        }
    }
}

async fn call0<P: wasmtime::WasmParams + Sync>(
    f: &Option<TypedFunc<P, ()>>,
    s: &mut Store<HostState>,
    p: P,
) -> wasmtime::Result<i32> {
    match f {
        Some(f) => f.call_async(s, p).await.map(|()| 0),
        None => Ok(0),
    }
}

async fn call1<P: wasmtime::WasmParams + Sync>(
    f: &Option<TypedFunc<P, i32>>,
    s: &mut Store<HostState>,
    p: P,
    default: i32,
) -> wasmtime::Result<i32> {
    match f {
        Some(f) => f.call_async(s, p).await,
        None => Ok(default),
    }
}
