//! [`Sim`]: one simulated Envoy process with the filter loaded in every VM, its clients
//! and model servers, run as a discrete-event simulation in virtual time.
//!
//! What Envoy does around the filter is reproduced here: the VM layout (a base VM and a
//! thread-local VM on the main thread, one VM per worker), connections spread over
//! workers, the HTTP filter chain of one stream (pause/continue, body buffering with
//! cumulative sizes, the buffer limit, local replies that pass through the response
//! callbacks, `on_log` then `on_done`), the ORIGINAL_DST router, callouts, ticks, queue
//! notifications, and the failure policy when a VM traps.

use crate::host::abi;
use crate::host::effects::{Effect, Outgoing, StreamDir};
use crate::host::faults::{Fault, Faults};
use crate::host::module::{self, Compiled};
use crate::host::shared::Shared;
use crate::host::vm::{
    Callback, CalloutResponse, Cluster, HostState, HttpData, LogLine, Vm, VmInit,
};
use crate::prometheus::{self, TagRule};
use crate::world::client::Connections;
use crate::world::clock::{Fnv, Nanos, Rng, MS, SEC, US};
use crate::world::events::EventQueue;
use crate::world::invariants::{Invariant, Violation};
use crate::world::network::Network;
use crate::world::outcomes::{Final, Outcome};
use crate::world::upstream::{Condition, Emit, Upstream, UpstreamRequest};
use crate::world::workload::RequestSpec;
use crate::{slot_of_worker, SLOT_BASE, SLOT_MAIN};
use anyhow::{bail, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use wasmtime::Linker;

/// What Envoy does with a worker whose VM crashed (`failure_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    /// 503 for every later request on that worker.
    FailClosed,
    /// Later requests skip the filter.
    FailOpen,
    /// 503 during the backoff, then a fresh VM.
    FailReload,
}

/// Settings of a simulated process. Start from [`SimConfig::new`] and adjust fields.
#[derive(Clone)]
pub struct SimConfig {
    /// The seed: same seed, same run.
    pub seed: u64,
    /// Envoy `--concurrency`.
    pub workers: usize,
    /// The filter module.
    pub wasm: PathBuf,
    /// The plugin configuration (`on_configure`).
    pub plugin_config: String,
    /// The VM configuration (`on_vm_start`).
    pub vm_config: String,
    /// `vm_id` (keys shared data and queues).
    pub vm_id: String,
    /// Plugin name.
    pub plugin_name: String,
    /// Root id.
    pub root_id: String,
    /// Failure policy.
    pub failure_policy: FailurePolicy,
    /// FAIL_RELOAD backoff.
    pub reload_backoff: Nanos,
    /// `allow_on_headers_stop_iteration`.
    pub allow_on_headers_stop_iteration: bool,
    /// `per_connection_buffer_limit_bytes` (a buffered request body beyond it gets 413).
    pub buffer_limit: usize,
    /// Size of the request body pieces the client sends.
    pub body_chunk: usize,
    /// Latencies.
    pub network: Network,
    /// Clusters for callouts.
    pub clusters: Vec<Cluster>,
    /// Request header the inference route's ORIGINAL_DST cluster routes on.
    pub route_header: String,
    /// Circuit-breaker limit for callouts in flight.
    pub callout_limit: u32,
    /// Run the invariants after every event (default: in debug builds).
    pub check_invariants: bool,
    /// Keep a readable trace of every event (the hash is always kept).
    pub record_trace: bool,
    /// `stats_tags` rules for the Prometheus view.
    pub tag_rules: Vec<TagRule>,
    /// Histogram buckets for the Prometheus view.
    pub histogram_buckets: Vec<f64>,
    /// Stop after this many events.
    pub max_events: u64,
    /// Stop at this virtual time.
    pub max_time: Nanos,
    /// VMs on other threads start within this much of the base VM.
    pub vm_start_jitter: Nanos,
    /// Envoy's HCM `stream_idle_timeout` (0 = none).
    pub stream_idle_timeout: Nanos,
    /// Chance that a VM is suspended at a preemption point inside a host call
    /// (`proxy_get_shared_data`, `proxy_set_shared_data`, `proxy_enqueue_shared_queue`)
    /// while another VM's pending callback runs, as two Envoy worker threads would
    /// interleave. 0 = callbacks are atomic.
    pub preempt_probability: f64,
    /// Only events due within this much virtual time of a suspended callback run inside it.
    pub preempt_window: Nanos,
    /// More local replies than this deferred by one callback overflow V8's stack in Envoy
    /// and kill the VM (measured: 288 fine, 312 crashed). 0 = no limit.
    pub nested_local_reply_limit: usize,
}

impl SimConfig {
    /// Defaults like `envoy/bootstrap.yaml.in` (4 MiB filter limit → 8.06 MiB buffer
    /// limit, FAIL_RELOAD, allow_on_headers_stop_iteration) with `plugin_config`.
    pub fn new(plugin_config: &str) -> SimConfig {
        SimConfig {
            seed: 1,
            workers: 2,
            wasm: module::default_wasm_path(),
            plugin_config: plugin_config.to_string(),
            vm_config: String::new(),
            vm_id: "epp".into(),
            plugin_name: "epp".into(),
            root_id: "epp".into(),
            failure_policy: FailurePolicy::FailReload,
            reload_backoff: SEC,
            allow_on_headers_stop_iteration: true,
            buffer_limit: 2 * 4 * 1024 * 1024 + 65536,
            body_chunk: 64 * 1024,
            network: Network::default(),
            clusters: vec![
                Cluster {
                    name: "pool".into(),
                    dst_header: "x-gateway-destination-endpoint".into(),
                },
                Cluster {
                    name: "scrape".into(),
                    dst_header: "x-envoy-original-dst-host".into(),
                },
            ],
            route_header: "x-gateway-destination-endpoint".into(),
            callout_limit: 1024,
            check_invariants: cfg!(debug_assertions),
            record_trace: false,
            tag_rules: prometheus::default_rules(),
            histogram_buckets: prometheus::DEFAULT_BUCKETS.to_vec(),
            max_events: 50_000_000,
            max_time: 3600 * SEC,
            vm_start_jitter: 500 * US,
            stream_idle_timeout: 300 * SEC,
            preempt_probability: 0.0,
            preempt_window: 100 * US,
            nested_local_reply_limit: 300,
        }
    }

    /// With `seed`.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// With `n` workers.
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n.max(1);
        self
    }

    /// Keeping a readable trace.
    pub fn record_trace(mut self, on: bool) -> Self {
        self.record_trace = on;
        self
    }

    /// With a failure policy.
    pub fn failure_policy(mut self, p: FailurePolicy) -> Self {
        self.failure_policy = p;
        self
    }

    /// Suspending VMs inside shared-data host calls with probability `p` (see
    /// [`SimConfig::preempt_probability`]).
    pub fn preempt(mut self, p: f64) -> Self {
        self.preempt_probability = p;
        self
    }

    /// With a buffer limit.
    pub fn buffer_limit(mut self, bytes: usize) -> Self {
        self.buffer_limit = bytes;
        self
    }
}

/// A change to the world at a chosen time.
pub enum Control {
    /// A model server comes up at `ip:port`.
    AddEndpoint(String, Box<dyn Upstream>),
    /// The server at `ip:port` goes away: in-flight requests are reset, new ones refused.
    RemoveEndpoint(String),
    /// The server at `ip:port` gets slower, fails, or recovers.
    SetCondition(String, Condition),
    /// Register an injected host-call failure.
    AddFault(Fault),
}

/// A VM crash.
#[derive(Debug, Clone)]
pub struct Crash {
    /// Virtual time.
    pub at: Nanos,
    /// Thread slot.
    pub slot: usize,
    /// The callback that trapped.
    pub callback: &'static str,
    /// The error with the wasm backtrace.
    pub message: String,
}

enum Ev {
    VmStart {
        slot: usize,
    },
    Tick {
        vm: usize,
        gen: u64,
    },
    QueueReady {
        slot: usize,
        root: u32,
        token: u32,
    },
    Headers {
        rid: usize,
    },
    Body {
        rid: usize,
        len: usize,
    },
    BodyEnd {
        rid: usize,
    },
    Disconnect {
        rid: usize,
    },
    UpstreamArrive {
        uid: u64,
    },
    UpstreamWake {
        ep: usize,
        gen: u64,
    },
    Deliver {
        uid: u64,
        emit: Emit,
    },
    ConnectFail {
        rid: usize,
    },
    CalloutDone {
        vm: usize,
        token: u32,
        resp: CalloutResponse,
    },
    CalloutTimeout {
        vm: usize,
        token: u32,
    },
    IdleCheck {
        rid: usize,
    },
    Control {
        idx: usize,
    },
}

impl Ev {
    fn code(&self) -> (u64, u64) {
        match self {
            Ev::VmStart { slot } => (1, *slot as u64),
            Ev::Tick { vm, .. } => (2, *vm as u64),
            Ev::QueueReady { slot, token, .. } => (3, (*slot as u64) << 32 | u64::from(*token)),
            Ev::Headers { rid } => (4, *rid as u64),
            Ev::Body { rid, len } => (5, (*rid as u64) << 32 | *len as u64),
            Ev::BodyEnd { rid } => (6, *rid as u64),
            Ev::Disconnect { rid } => (7, *rid as u64),
            Ev::UpstreamArrive { uid } => (8, *uid),
            Ev::UpstreamWake { ep, .. } => (9, *ep as u64),
            Ev::Deliver { uid, emit } => (
                10 + match emit {
                    Emit::Head { .. } => 0,
                    Emit::Data { .. } => 1,
                    Emit::End { .. } => 2,
                },
                *uid,
            ),
            Ev::ConnectFail { rid } => (13, *rid as u64),
            Ev::CalloutDone { vm, token, .. } => (14, (*vm as u64) << 32 | u64::from(*token)),
            Ev::CalloutTimeout { vm, token } => (15, (*vm as u64) << 32 | u64::from(*token)),
            Ev::IdleCheck { rid } => (16, *rid as u64),
            Ev::Control { idx } => (17, *idx as u64),
        }
    }

    fn describe(&self) -> String {
        match self {
            Ev::VmStart { slot } => format!("vm-start slot={slot}"),
            Ev::Tick { vm, .. } => format!("tick vm={vm}"),
            Ev::QueueReady { slot, root, token } => {
                format!("queue-ready slot={slot} root={root} token={token}")
            }
            Ev::Headers { rid } => format!("request-headers rid={rid}"),
            Ev::Body { rid, len } => format!("request-body rid={rid} len={len}"),
            Ev::BodyEnd { rid } => format!("request-end rid={rid}"),
            Ev::Disconnect { rid } => format!("client-disconnect rid={rid}"),
            Ev::UpstreamArrive { uid } => format!("upstream-arrive uid={uid}"),
            Ev::UpstreamWake { ep, .. } => format!("upstream-wake ep={ep}"),
            Ev::Deliver { uid, emit } => match emit {
                Emit::Head { status, .. } => format!("response-head uid={uid} status={status}"),
                Emit::Data { bytes, .. } => format!("response-data uid={uid} len={}", bytes.len()),
                Emit::End { .. } => format!("response-end uid={uid}"),
            },
            Ev::ConnectFail { rid } => format!("connect-fail rid={rid}"),
            Ev::CalloutDone { vm, token, .. } => format!("callout-done vm={vm} token={token}"),
            Ev::CalloutTimeout { vm, token } => format!("callout-timeout vm={vm} token={token}"),
            Ev::IdleCheck { rid } => format!("idle-check rid={rid}"),
            Ev::Control { idx } => format!("control #{idx}"),
        }
    }
}

/// Locks a process-wide structure (single-threaded: never contended, never poisoned
/// in a way that matters).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Demangles the Rust symbols of a wasm backtrace (`_ZN...E` → `a::b::c`).
fn demangle_backtrace(text: &str) -> String {
    use std::sync::OnceLock;
    static SYMBOL: OnceLock<regex::Regex> = OnceLock::new();
    let re = SYMBOL.get_or_init(|| {
        regex::Regex::new(r"_ZN[0-9A-Za-z_$.]+E").unwrap_or_else(|e| panic!("{e}"))
    });
    re.replace_all(text, |c: &regex::Captures| {
        format!("{:#}", rustc_demangle::demangle(&c[0]))
    })
    .into_owned()
}

/// The VMs; a slot is empty while its VM runs a (possibly suspended) callback.
struct Vms(Vec<Option<Vm>>);

impl std::ops::Index<usize> for Vms {
    type Output = Vm;
    fn index(&self, i: usize) -> &Vm {
        self.0[i]
            .as_ref()
            .unwrap_or_else(|| panic!("VM {i} is suspended in a callback"))
    }
}

impl std::ops::IndexMut<usize> for Vms {
    fn index_mut(&mut self, i: usize) -> &mut Vm {
        self.0[i]
            .as_mut()
            .unwrap_or_else(|| panic!("VM {i} is suspended in a callback"))
    }
}

/// Which VM an event needs.
enum Target {
    Free,
    Vm(usize),
    All,
}

fn event_vm(
    ev: &Ev,
    streams: &[Stream],
    upreqs: &HashMap<u64, UpReq>,
    slot_vm: &[Option<usize>],
) -> Target {
    let of_slot = |slot: usize| {
        slot_vm
            .get(slot)
            .copied()
            .flatten()
            .map_or(Target::Free, Target::Vm)
    };
    let of_stream = |rid: usize| {
        let s = &streams[rid];
        if s.started {
            Target::Vm(s.vm)
        } else {
            of_slot(slot_of_worker(s.worker))
        }
    };
    match ev {
        Ev::VmStart { .. } | Ev::UpstreamWake { .. } => Target::Free,
        Ev::Tick { vm, .. } | Ev::CalloutDone { vm, .. } | Ev::CalloutTimeout { vm, .. } => {
            Target::Vm(*vm)
        }
        Ev::QueueReady { slot, .. } => of_slot(if *slot == SLOT_BASE { SLOT_MAIN } else { *slot }),
        Ev::Headers { rid }
        | Ev::Body { rid, .. }
        | Ev::BodyEnd { rid }
        | Ev::Disconnect { rid }
        | Ev::ConnectFail { rid }
        | Ev::IdleCheck { rid } => of_stream(*rid),
        Ev::UpstreamArrive { uid } | Ev::Deliver { uid, .. } => {
            match upreqs.get(uid).map(|u| &u.owner) {
                Some(UpRef::Stream(sid)) => of_stream(*sid),
                Some(UpRef::Callout { vm, .. }) => Target::Vm(*vm),
                None => Target::Free,
            }
        }
        Ev::Control { .. } => Target::All,
    }
}

struct Endpoint {
    addr: String,
    upstream: Box<dyn Upstream>,
    up: bool,
    gen: u64,
    wake_at: Option<Nanos>,
}

enum UpRef {
    Stream(usize),
    Callout { vm: usize, token: u32 },
}

struct UpReq {
    owner: UpRef,
    ep: usize,
    req: Option<UpstreamRequest>,
    last_delivery: Nanos,
    callout: CalloutResponse,
    done: bool,
}

#[derive(Default)]
struct Stream {
    worker: usize,
    vm: usize,
    ctx: u32,
    filter: bool,
    started: bool,
    body_len: usize,
    body_complete: bool,
    stop_all: bool,
    headers_passed: bool,
    req_stopped: bool,
    eos_passed: bool,
    endpoint: Option<String>,
    uid: Option<u64>,
    head_sent: bool,
    resp_stopped: bool,
    resp_end_pending: bool,
    upstream_ended: bool,
    in_local_reply: bool,
    finished: bool,
    completed: bool,
    last_client: Nanos,
    last_activity: Nanos,
    paused: bool,
    delivered: usize,
}

/// One simulated Envoy process with its world.
pub struct Sim {
    cfg: SimConfig,
    compiled: Arc<Compiled>,
    linker: Linker<HostState>,
    shared: Arc<Mutex<Shared>>,
    faults: Arc<Mutex<Faults>>,
    log: Arc<Mutex<Vec<LogLine>>>,
    clusters: Arc<Vec<Cluster>>,
    callouts_in_flight: Arc<AtomicU32>,
    vms: Vms,
    busy: Vec<usize>,
    yields: u64,
    deferred_error: Option<anyhow::Error>,
    vm_slot: Vec<usize>,
    tick_state: Vec<(u32, u64)>,
    slot_vm: Vec<Option<usize>>,
    now: Nanos,
    events: EventQueue<Ev>,
    work_pending: usize,
    rng: Rng,
    specs: Vec<RequestSpec>,
    outcomes: Vec<Outcome>,
    streams: Vec<Stream>,
    conns: Connections,
    endpoints: Vec<Endpoint>,
    ep_index: HashMap<String, usize>,
    upreqs: HashMap<u64, UpReq>,
    next_uid: u64,
    in_flight: BTreeMap<String, u64>,
    callouts: HashMap<(usize, u32), u32>,
    controls: Vec<Option<Control>>,
    hash: Fnv,
    trace: Vec<String>,
    invariants: Vec<Invariant>,
    violations: Vec<Violation>,
    deferred: Vec<usize>,
    leaked: Vec<usize>,
    crashes: Vec<Crash>,
    reloads: u64,
    events_processed: u64,
    vm_calls: u64,
    emit_buf: Vec<Emit>,
    current_event: String,
}

impl Sim {
    /// A process with `cfg`: loads (or reuses) the compiled module and schedules the VMs'
    /// start. Nothing runs until [`Sim::run`].
    pub fn new(cfg: SimConfig) -> Result<Sim> {
        let compiled = module::load(&cfg.wasm)?;
        let linker = abi::linker(&compiled.engine, &compiled.module)?;
        let rng = Rng::new(cfg.seed, 1);
        let clusters = Arc::new(cfg.clusters.clone());
        let slots = cfg.workers + 2;
        let mut sim = Sim {
            compiled,
            linker,
            shared: Arc::default(),
            faults: Arc::default(),
            log: Arc::default(),
            clusters,
            callouts_in_flight: Arc::default(),
            vms: Vms(Vec::new()),
            busy: Vec::new(),
            yields: 0,
            deferred_error: None,
            vm_slot: Vec::new(),
            tick_state: Vec::new(),
            slot_vm: vec![None; slots],
            now: 0,
            events: EventQueue::default(),
            work_pending: 0,
            rng,
            specs: Vec::new(),
            outcomes: Vec::new(),
            streams: Vec::new(),
            conns: Connections::default(),
            endpoints: Vec::new(),
            ep_index: HashMap::new(),
            upreqs: HashMap::new(),
            next_uid: 0,
            in_flight: BTreeMap::new(),
            callouts: HashMap::new(),
            controls: Vec::new(),
            hash: Fnv::default(),
            trace: Vec::new(),
            invariants: Vec::new(),
            violations: Vec::new(),
            deferred: Vec::new(),
            leaked: Vec::new(),
            crashes: Vec::new(),
            reloads: 0,
            events_processed: 0,
            vm_calls: 0,
            emit_buf: Vec::new(),
            current_event: String::new(),
            cfg,
        };
        // The base VM is created when the configuration loads; the thread-local VMs of the
        // main thread and the workers follow on their threads, in no fixed order.
        sim.push(0, Ev::VmStart { slot: SLOT_BASE });
        for slot in SLOT_MAIN..slots {
            let at = 1 + sim.rng.below(sim.cfg.vm_start_jitter.max(1));
            sim.push(at, Ev::VmStart { slot });
        }
        Ok(sim)
    }

    // ----- scenario API -------------------------------------------------------------

    /// Adds a model server at `addr` (`ip:port`), up from the start.
    pub fn add_endpoint(&mut self, addr: &str, upstream: Box<dyn Upstream>) {
        let idx = self.endpoints.len();
        self.endpoints.push(Endpoint {
            addr: addr.to_string(),
            upstream,
            up: true,
            gen: 0,
            wake_at: None,
        });
        self.ep_index.insert(addr.to_string(), idx);
    }

    /// Adds requests; their ids are their positions in the order added. Returns the ids.
    pub fn add_requests(&mut self, specs: impl IntoIterator<Item = RequestSpec>) -> Vec<usize> {
        let mut ids = Vec::new();
        for spec in specs {
            let rid = self.specs.len();
            self.outcomes.push(Outcome {
                id: rid,
                label: spec.label.clone(),
                fin: Final::Pending,
                status: None,
                headers: Vec::new(),
                body: Vec::new(),
                worker: None,
                endpoint: None,
                sent_at: spec.at,
                enqueued_at: None,
                dispatched_at: None,
                first_token_at: None,
                last_token_at: None,
                finished_at: None,
            });
            let worker = self
                .conns
                .worker(spec.connection, self.cfg.workers, &mut self.rng);
            self.streams.push(Stream {
                worker,
                ..Stream::default()
            });
            let lat = self.cfg.network.client.draw(&mut self.rng);
            self.push(spec.at + lat, Ev::Headers { rid });
            if let Some(after) = spec.disconnect_after {
                let lat = self.cfg.network.client.draw(&mut self.rng);
                self.push(spec.at + after + lat, Ev::Disconnect { rid });
            }
            self.specs.push(spec);
            ids.push(rid);
        }
        ids
    }

    /// Schedules a change to the world at `at`.
    pub fn at(&mut self, at: Nanos, control: Control) {
        let idx = self.controls.len();
        self.controls.push(Some(control));
        self.push(at, Ev::Control { idx });
    }

    /// Injects a host-call failure from now on.
    pub fn add_fault(&mut self, mut fault: Fault) {
        fault.rng = Rng::new(self.rng.next_u64(), 5);
        lock(&self.faults).rules.push(fault);
    }

    /// How many times a callback was suspended inside a host call so others could run.
    pub fn yields(&self) -> u64 {
        self.yields
    }

    /// Conditional shared-data writes refused because another VM wrote first.
    pub fn cas_mismatches(&self) -> u64 {
        lock(&self.shared).cas_mismatches
    }

    /// How many times each injected fault fired, in the order they were added.
    pub fn faults_fired(&self) -> Vec<u64> {
        lock(&self.faults).rules.iter().map(Fault::fired).collect()
    }

    /// Adds an invariant checked after every event (when `check_invariants`) and at the end.
    pub fn add_invariant(&mut self, inv: Invariant) {
        self.invariants.push(inv);
    }

    /// Runs until every request has its final outcome and nothing but ticks is left
    /// (or the limits are hit), then checks that no stream was leaked. Errors describe
    /// invariant violations, leaked streams and requests without an outcome.
    pub fn run(&mut self) -> Result<()> {
        self.run_loop(None)?;
        self.finish_checks()
    }

    /// Runs every event up to virtual time `t` (inclusive); no end-of-run checks.
    pub fn run_until(&mut self, t: Nanos) -> Result<()> {
        self.run_loop(Some(t))
    }

    // ----- queries ------------------------------------------------------------------

    /// The current virtual time.
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// Every request's outcome, by id.
    pub fn outcomes(&self) -> &[Outcome] {
        &self.outcomes
    }

    /// One request's outcome.
    pub fn outcome(&self, id: usize) -> &Outcome {
        &self.outcomes[id]
    }

    /// The Prometheus text (`/stats/prometheus`) of the process's stats.
    pub fn prometheus(&self) -> String {
        prometheus::render(
            &lock(&self.shared).stats,
            &self.cfg.tag_rules,
            &self.cfg.histogram_buckets,
        )
    }

    /// The value of one Prometheus series, e.g. `m{a="x"}`.
    pub fn metric(&self, series: &str) -> Option<f64> {
        prometheus::value(&self.prometheus(), series)
    }

    /// A shared-data value (host-side view).
    pub fn shared_data(&self, key: &str) -> Option<Vec<u8>> {
        lock(&self.shared)
            .peek(&self.cfg.vm_id, key)
            .map(<[u8]>::to_vec)
    }

    /// Requests in flight at the model server `addr` right now (sent, not finished).
    pub fn in_flight(&self, addr: &str) -> u64 {
        self.in_flight.get(addr).copied().unwrap_or(0)
    }

    /// Addresses of all endpoints ever added.
    pub fn endpoint_addresses(&self) -> Vec<String> {
        self.endpoints.iter().map(|e| e.addr.clone()).collect()
    }

    /// The trace hash: equal for runs with identical event sequences.
    pub fn trace_hash(&self) -> u64 {
        self.hash.0
    }

    /// The readable trace (when `record_trace`).
    pub fn trace(&self) -> &[String] {
        &self.trace
    }

    /// VM crashes so far.
    pub fn crashes(&self) -> &[Crash] {
        &self.crashes
    }

    /// FAIL_RELOAD reloads so far (Envoy's `vm_reload_success`).
    pub fn reloads(&self) -> u64 {
        self.reloads
    }

    /// VMs created so far (including reloaded ones).
    pub fn vms_created(&self) -> usize {
        self.vms.0.len()
    }

    /// Log lines of every VM.
    pub fn logs(&self) -> Vec<LogLine> {
        lock(&self.log).clone()
    }

    /// Invariant violations found so far.
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }

    /// Events processed and VM callbacks made.
    pub fn counts(&self) -> (u64, u64) {
        (self.events_processed, self.vm_calls)
    }

    /// Connections per worker.
    pub fn connections_per_worker(&self) -> &[u64] {
        &self.conns.per_worker
    }

    /// Ids of streams Envoy still holds (not completed): after a run, leaked streams.
    pub fn open_streams(&self) -> Vec<usize> {
        (0..self.streams.len())
            .filter(|&i| self.streams[i].started && !self.streams[i].completed)
            .collect()
    }

    /// The current settings.
    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    // ----- event loop ---------------------------------------------------------------

    fn push(&mut self, at: Nanos, ev: Ev) {
        if !matches!(ev, Ev::Tick { .. } | Ev::IdleCheck { .. }) {
            self.work_pending += 1;
        }
        let tie = self.rng.next_u32();
        self.events.push(at.max(self.now), tie, ev);
    }

    fn all_final(&self) -> bool {
        self.outcomes.iter().all(|o| o.fin != Final::Pending)
    }

    fn run_loop(&mut self, until: Option<Nanos>) -> Result<()> {
        loop {
            if self.events_processed >= self.cfg.max_events {
                bail!(
                    "stopped after {} events (max_events)",
                    self.events_processed
                );
            }
            if until.is_none() && self.work_pending == 0 && self.all_final() {
                return Ok(());
            }
            let Some(t) = self.events.peek_time() else {
                return Ok(());
            };
            if until.is_some_and(|u| t > u) {
                self.now = until.unwrap_or(t);
                return Ok(());
            }
            if t > self.cfg.max_time {
                return Ok(());
            }
            let Some((t, ev)) = self.events.pop() else {
                return Ok(());
            };
            self.process(t, ev)?;
        }
    }

    /// Handles one event with its bookkeeping: clock, trace, deferred completions,
    /// invariants.
    fn process(&mut self, t: Nanos, ev: Ev) -> Result<()> {
        if !matches!(ev, Ev::Tick { .. } | Ev::IdleCheck { .. }) {
            self.work_pending -= 1;
        }
        self.now = self.now.max(t);
        self.events_processed += 1;
        let (code, id) = ev.code();
        self.hash.u64(t);
        self.hash.u64(code);
        self.hash.u64(id);
        if self.cfg.record_trace || self.cfg.check_invariants {
            self.current_event = ev.describe();
            if self.cfg.record_trace {
                let nested = if self.busy.is_empty() {
                    ""
                } else {
                    " (inside a suspended callback)"
                };
                self.trace
                    .push(format!("{t} {}{nested}", self.current_event));
            }
        }
        self.handle(ev)?;
        self.run_deferred();
        if let Some(e) = self.deferred_error.take() {
            return Err(e);
        }
        if self.cfg.check_invariants {
            self.check_invariants();
            if let Some(v) = self.violations.first() {
                bail!("{v}");
            }
        }
        Ok(())
    }

    /// Runs one callback, letting other VMs' due events run while it is suspended.
    fn invoke(&mut self, vm: usize, cb: Callback) -> wasmtime::Result<i32> {
        let Some(mut v) = self.vms.0[vm].take() else {
            return Err(wasmtime::Error::msg(format!(
                "VM {vm} re-entered while suspended"
            )));
        };
        v.store.data_mut().preempt.enabled =
            self.busy.is_empty() && self.cfg.preempt_probability > 0.0;
        self.busy.push(vm);
        let mut fut = Box::pin(v.invoke(cb));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let (v, r) = loop {
            match std::future::Future::poll(fut.as_mut(), &mut cx) {
                std::task::Poll::Ready(x) => break x,
                std::task::Poll::Pending => {
                    self.yields += 1;
                    self.hash.u64(0x5EED_1E1D ^ vm as u64);
                    self.run_concurrent();
                }
            }
        };
        self.busy.pop();
        self.vms.0[vm] = Some(v);
        r
    }

    /// While a callback is suspended: run the next event due within the window that
    /// does not need a busy VM (as another Envoy thread would meanwhile).
    fn run_concurrent(&mut self) {
        let until = self.now + self.cfg.preempt_window;
        let busy = self.busy.clone();
        let (streams, upreqs, slot_vm) = (&self.streams, &self.upreqs, &self.slot_vm);
        let next =
            self.events
                .pop_matching(until, |ev| match event_vm(ev, streams, upreqs, slot_vm) {
                    Target::Free => true,
                    Target::Vm(v) => !busy.contains(&v),
                    Target::All => false,
                });
        if let Some((t, ev)) = next {
            if let Err(e) = self.process(t, ev) {
                if self.deferred_error.is_none() {
                    self.deferred_error = Some(e);
                }
            }
        }
    }

    fn check_invariants(&mut self) {
        let invs = std::mem::take(&mut self.invariants);
        for inv in &invs {
            if let Err(message) = (inv.check)(self) {
                self.violations.push(Violation {
                    invariant: inv.name.clone(),
                    at: self.now,
                    after_event: self.current_event.clone(),
                    message,
                });
            }
        }
        self.invariants = invs;
    }

    fn finish_checks(&mut self) -> Result<()> {
        self.check_invariants();
        let mut problems: Vec<String> = self.violations.iter().map(ToString::to_string).collect();
        if !self.leaked.is_empty() {
            problems.push(format!(
                "{} stream(s) paused by the filter and never released (ended by Envoy's stream idle timeout): {:?}",
                self.leaked.len(),
                &self.leaked[..self.leaked.len().min(20)]
            ));
        }
        let open = self.open_streams();
        if !open.is_empty() {
            problems.push(format!(
                "{} stream(s) still held by Envoy after the run (paused and never released?): {:?}",
                open.len(),
                &open[..open.len().min(20)]
            ));
        }
        let pending: Vec<usize> = self
            .outcomes
            .iter()
            .filter(|o| o.fin == Final::Pending)
            .map(|o| o.id)
            .collect();
        if !pending.is_empty() {
            problems.push(format!(
                "{} request(s) without a final outcome: {:?}",
                pending.len(),
                &pending[..pending.len().min(20)]
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            bail!("{}", problems.join("\n"))
        }
    }

    fn handle(&mut self, ev: Ev) -> Result<()> {
        match ev {
            Ev::VmStart { slot } => self.start_vm(slot)?,
            Ev::Tick { vm, gen } => {
                let (period, cur) = self.tick_state[vm];
                if cur == gen && period > 0 && self.vms[vm].failed.is_none() {
                    let root = self.vms[vm].store.data().root_id;
                    self.call(vm, Callback::Tick(root));
                    // Re-arm unless the callback changed the period (then it re-armed).
                    if self.tick_state[vm].1 == gen && self.vms[vm].failed.is_none() {
                        self.push(self.now + u64::from(period) * MS, Ev::Tick { vm, gen });
                    }
                }
            }
            Ev::QueueReady { slot, root, token } => {
                // Delivered to the slot's current thread-local VM (the base VM's thread is
                // the main thread's).
                let slot = if slot == SLOT_BASE { SLOT_MAIN } else { slot };
                if let Some(vm) = self.slot_vm[slot] {
                    let known = {
                        let h = self.vms[vm].store.data();
                        h.root_id == root
                    };
                    if known {
                        self.call(vm, Callback::QueueReady(root, token));
                    }
                }
            }
            Ev::Headers { rid } => self.on_headers(rid)?,
            Ev::Body { rid, len } => self.on_body(rid, len),
            Ev::BodyEnd { rid } => self.on_body_end(rid),
            Ev::Disconnect { rid } => self.on_disconnect(rid),
            Ev::UpstreamArrive { uid } => self.on_upstream_arrive(uid),
            Ev::UpstreamWake { ep, gen } => {
                if self.endpoints[ep].gen == gen {
                    self.endpoints[ep].wake_at = None;
                    self.poll_upstream(ep);
                }
            }
            Ev::Deliver { uid, emit } => self.on_deliver(uid, emit),
            Ev::ConnectFail { rid } => {
                let body = "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure, transport failure reason: delayed connect error: Connection refused";
                self.local_reply(rid, 503, body.as_bytes().to_vec(), Vec::new(), true);
            }
            Ev::CalloutDone { vm, token, resp } => self.callout_done(vm, token, resp),
            Ev::CalloutTimeout { vm, token } => {
                // Envoy resets the callout's upstream request on timeout.
                let mut uids: Vec<u64> = self
                    .upreqs
                    .iter()
                    .filter(|(_, u)| matches!(u.owner, UpRef::Callout { vm: v, token: t } if v == vm && t == token))
                    .map(|(k, _)| *k)
                    .collect();
                uids.sort_unstable();
                for uid in uids {
                    if let Some(u) = self.upreqs.remove(&uid) {
                        self.endpoints[u.ep].upstream.cancel(self.now, uid);
                        self.rearm_upstream(u.ep);
                    }
                }
                let resp = CalloutResponse {
                    headers: vec![(":status".into(), "504".into())],
                    body: b"upstream request timeout".to_vec(),
                };
                self.callout_done(vm, token, resp);
            }
            Ev::IdleCheck { rid } => self.on_idle_check(rid),
            Ev::Control { idx } => {
                if let Some(c) = self.controls[idx].take() {
                    self.control(c);
                }
            }
        }
        Ok(())
    }

    // ----- VMs ----------------------------------------------------------------------

    fn new_vm(&mut self, slot: usize) -> Result<usize> {
        let seed = self.rng.next_u64();
        let vm = Vm::new(
            &self.compiled.engine,
            &self.linker,
            &self.compiled.module,
            VmInit {
                slot,
                vm_id: self.cfg.vm_id.clone(),
                plugin_name: self.cfg.plugin_name.clone(),
                root_id_name: self.cfg.root_id.clone(),
                plugin_config: self.cfg.plugin_config.clone().into_bytes(),
                vm_config: self.cfg.vm_config.clone().into_bytes(),
                seed,
                shared: self.shared.clone(),
                faults: self.faults.clone(),
                log: self.log.clone(),
                clusters: self.clusters.clone(),
                callouts_in_flight: self.callouts_in_flight.clone(),
                callout_limit: self.cfg.callout_limit,
                preempt_probability: self.cfg.preempt_probability,
            },
        )?;
        let idx = self.vms.0.len();
        self.vms.0.push(Some(vm));
        self.vm_slot.push(slot);
        self.tick_state.push((0, 0));
        self.slot_vm[slot] = Some(idx);
        let root = {
            let h = self.vms[idx].store.data_mut();
            let r = h.alloc_ctx();
            h.root_id = r;
            r
        };
        let (vm_len, cfg_len) = {
            let h = self.vms[idx].store.data();
            (h.vm_config.len() as u32, h.plugin_config.len() as u32)
        };
        self.call(idx, Callback::ContextCreate(root, 0));
        let started = self.call(idx, Callback::VmStart(root, vm_len));
        let configured = self.call(idx, Callback::Configure(root, cfg_len));
        if started == Some(0) || configured == Some(0) {
            let why = if started == Some(0) {
                "on_vm_start"
            } else {
                "on_configure"
            };
            let logs: Vec<String> = lock(&self.log)
                .iter()
                .filter(|l| l.slot == slot && l.level >= 3)
                .map(|l| l.message.clone())
                .collect();
            bail!(
                "the filter refused its configuration ({why} returned false) in slot {slot}; its log:\n{}",
                logs.join("\n")
            );
        }
        Ok(idx)
    }

    fn start_vm(&mut self, slot: usize) -> Result<()> {
        self.new_vm(slot)?;
        Ok(())
    }

    /// Calls into a VM and then runs the deferred actions. `None` when the VM is dead or
    /// trapped in this call.
    fn call(&mut self, vm: usize, cb: Callback) -> Option<i32> {
        if self.vms[vm].failed.is_some() {
            return None;
        }
        self.vm_calls += 1;
        self.hash.u64(0xCA11 ^ ((vm as u64) << 8) ^ cb.code());
        self.hash.u64(u64::from(cb.context()));
        let ctx = cb.context();
        {
            let h = self.vms[vm].store.data_mut();
            h.now = self.now;
            h.current = ctx;
            h.effective = ctx;
        }
        let r = self.invoke(vm, cb);
        match r {
            Ok(ret) => {
                let (effects, outgoing, period) = {
                    let h = self.vms[vm].store.data_mut();
                    h.effective = h.current;
                    (
                        std::mem::take(&mut h.effects),
                        std::mem::take(&mut h.outgoing),
                        h.tick_period_ms,
                    )
                };
                self.after_call_tick(vm, period);
                for o in outgoing {
                    self.outgoing(vm, o);
                }
                // Envoy drains these nested: each local reply runs the filter's response
                // callbacks, and the next one is drained inside that call, so V8's stack
                // grows with every local reply of one callback.
                let mut replies = 0usize;
                for e in effects {
                    if matches!(e, Effect::LocalReply { .. }) {
                        replies += 1;
                        let limit = self.cfg.nested_local_reply_limit;
                        if limit > 0 && replies == limit + 1 && self.vms[vm].failed.is_none() {
                            self.stack_overflow(vm, replies);
                        }
                    }
                    self.apply_effect(vm, e);
                }
                Some(ret)
            }
            Err(e) => {
                self.crash(vm, cb, &e);
                None
            }
        }
    }

    fn after_call_tick(&mut self, vm: usize, period: u32) {
        // The base VM never ticks in Envoy.
        if self.vm_slot[vm] == SLOT_BASE {
            return;
        }
        let (cur, gen) = self.tick_state[vm];
        if cur != period {
            let gen = gen + 1;
            self.tick_state[vm] = (period, gen);
            if period > 0 {
                self.push(self.now + u64::from(period) * MS, Ev::Tick { vm, gen });
            }
        }
    }

    /// V8 ran out of stack draining nested local replies: the VM dies (its remaining
    /// deferred replies are still sent, without the filter).
    fn stack_overflow(&mut self, vm: usize, replies: usize) {
        let message = format!(
            "proxy_on_response_headers failed: Uncaught RangeError: Maximum call stack size \
             exceeded ({replies} local replies drained nested in one callback; Envoy's V8 \
             overflows at about 300)"
        );
        self.crashes.push(Crash {
            at: self.now,
            slot: self.vm_slot[vm],
            callback: "proxy_on_response_headers",
            message: message.clone(),
        });
        self.vms[vm].failed = Some((self.now, message));
        self.tick_state[vm].1 += 1;
    }

    fn crash(&mut self, vm: usize, cb: Callback, e: &wasmtime::Error) {
        let message = demangle_backtrace(&format!("{e:?}"));
        let slot = self.vm_slot[vm];
        self.crashes.push(Crash {
            at: self.now,
            slot,
            callback: cb.name(),
            message: message.clone(),
        });
        {
            let h = self.vms[vm].store.data_mut();
            h.effects.clear();
            h.outgoing.clear();
        }
        self.vms[vm].failed = Some((self.now, message));
        self.tick_state[vm].1 += 1;
        // The stream whose callback trapped gets Envoy's 503.
        let sid = self.vms[vm]
            .store
            .data()
            .streams
            .get(&cb.context())
            .map(|h| h.sid);
        if let Some(sid) = sid {
            self.fail_stream(sid);
        }
    }

    /// Envoy's `failStream`: a 503 local reply that no longer runs the dead filter.
    fn fail_stream(&mut self, sid: usize) {
        self.streams[sid].filter = false;
        self.local_reply(sid, 503, Vec::new(), Vec::new(), false);
    }

    fn outgoing(&mut self, vm: usize, o: Outgoing) {
        match o {
            Outgoing::QueueReady { slot, root, token } => {
                let lat = if slot >= 2 {
                    self.cfg.network.queue_worker
                } else {
                    self.cfg.network.queue_main
                };
                let d = lat.draw(&mut self.rng);
                self.push(self.now + d, Ev::QueueReady { slot, root, token });
            }
            Outgoing::HttpCall {
                token,
                root: _,
                cluster,
                headers,
                body,
                timeout_ms,
            } => {
                self.callouts.insert((vm, token), 0);
                let dst_header = self
                    .clusters
                    .iter()
                    .find(|c| c.name == cluster)
                    .map(|c| c.dst_header.clone())
                    .unwrap_or_default();
                let dst = headers
                    .iter()
                    .find(|(k, _)| *k == dst_header)
                    .map(|(_, v)| v.clone());
                if timeout_ms > 0 {
                    self.push(
                        self.now + u64::from(timeout_ms) * MS,
                        Ev::CalloutTimeout { vm, token },
                    );
                }
                let rtt = self.cfg.network.upstream.draw(&mut self.rng) * 2;
                let ep = dst.as_ref().and_then(|d| self.ep_index.get(d).copied());
                let Some(ep) = ep.filter(|&e| self.endpoints[e].up) else {
                    let (status, body) = if dst.is_none() {
                        ("503", "no healthy upstream".to_string())
                    } else {
                        ("503", "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure".to_string())
                    };
                    let resp = CalloutResponse {
                        headers: vec![(":status".into(), status.into())],
                        body: body.into_bytes(),
                    };
                    self.push(self.now + rtt, Ev::CalloutDone { vm, token, resp });
                    return;
                };
                let get = |n: &str| {
                    headers
                        .iter()
                        .find(|(k, _)| k == n)
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default()
                };
                let path = get(":path");
                if get(":method") == "GET" && path.split('?').next() == Some("/metrics") {
                    let text = self.endpoints[ep].upstream.metrics(self.now);
                    let resp = CalloutResponse {
                        headers: vec![
                            (":status".into(), "200".into()),
                            ("content-type".into(), "text/plain; version=0.0.4".into()),
                        ],
                        body: text.into_bytes(),
                    };
                    self.push(self.now + rtt, Ev::CalloutDone { vm, token, resp });
                    return;
                }
                let uid = self.next_uid;
                self.next_uid += 1;
                self.upreqs.insert(
                    uid,
                    UpReq {
                        owner: UpRef::Callout { vm, token },
                        ep,
                        req: Some(UpstreamRequest {
                            method: get(":method"),
                            path,
                            headers,
                            body,
                        }),
                        last_delivery: 0,
                        callout: CalloutResponse::default(),
                        done: false,
                    },
                );
                self.push(self.now + rtt / 2, Ev::UpstreamArrive { uid });
            }
        }
    }

    fn callout_done(&mut self, vm: usize, token: u32, resp: CalloutResponse) {
        if self.callouts.remove(&(vm, token)).is_none() {
            return; // already answered (or timed out)
        }
        let _ = self
            .callouts_in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            });
        if self.vms[vm].failed.is_some() {
            return;
        }
        let root = self.vms[vm].store.data().root_id;
        let (nh, nb) = (resp.headers.len() as u32, resp.body.len() as u32);
        self.vms[vm].store.data_mut().callout = Some(resp);
        self.call(vm, Callback::HttpCallResponse(root, token, nh, nb, 0));
        if let Some(Some(v)) = self.vms.0.get_mut(vm) {
            v.store.data_mut().callout = None;
        }
    }

    fn apply_effect(&mut self, vm: usize, e: Effect) {
        let ctx = match &e {
            Effect::Continue { ctx, .. }
            | Effect::LocalReply { ctx, .. }
            | Effect::Close { ctx } => *ctx,
        };
        let Some(sid) = self.vms[vm].store.data().streams.get(&ctx).map(|h| h.sid) else {
            return;
        };
        match e {
            Effect::Continue {
                dir: StreamDir::Request,
                ..
            } => self.continue_request(sid),
            Effect::Continue {
                dir: StreamDir::Response,
                ..
            } => self.continue_response(sid),
            Effect::LocalReply {
                status,
                body,
                headers,
                ..
            } => self.local_reply(sid, status, body, headers, true),
            Effect::Close { .. } => self.reset_stream(sid, Final::Reset),
        }
    }

    // ----- streams: request path ----------------------------------------------------

    fn http<'a>(vms: &'a mut Vms, s: &Stream) -> Option<&'a mut HttpData> {
        vms.0
            .get_mut(s.vm)?
            .as_mut()?
            .store
            .data_mut()
            .streams
            .get_mut(&s.ctx)
    }

    /// Calls a stream callback; if the VM is dead, Envoy fails the stream (503).
    fn stream_call(&mut self, sid: usize, cb: impl Fn(u32) -> Callback) -> Option<i32> {
        let s = &self.streams[sid];
        if !s.filter || s.finished {
            return None;
        }
        let (vm, ctx) = (s.vm, s.ctx);
        if self.vms[vm].failed.is_some() {
            self.fail_stream(sid);
            return None;
        }
        self.streams[sid].last_activity = self.now;
        let r = self.call(vm, cb(ctx));
        if r.is_none() && !self.streams[sid].finished {
            self.fail_stream(sid);
        }
        r
    }

    fn on_headers(&mut self, rid: usize) -> Result<()> {
        if self.outcomes[rid].fin != Final::Pending {
            return Ok(()); // the client already gave up
        }
        let worker = self.streams[rid].worker;
        self.outcomes[rid].worker = Some(worker);
        let slot = slot_of_worker(worker);
        let mut vm = self.slot_vm[slot];
        let mut filter = true;
        if let Some(v) = vm {
            if let Some((failed_at, _)) = self.vms[v].failed {
                match self.cfg.failure_policy {
                    FailurePolicy::FailOpen => filter = false,
                    FailurePolicy::FailClosed => vm = None,
                    FailurePolicy::FailReload => {
                        if self.now >= failed_at + self.cfg.reload_backoff {
                            let n = self.new_vm(slot)?;
                            self.reloads += 1;
                            vm = Some(n);
                        } else {
                            vm = None;
                        }
                    }
                }
            }
        }
        let spec = &self.specs[rid];
        let mut headers = vec![
            (":authority".to_string(), "gateway.local".to_string()),
            (":path".to_string(), spec.path.clone()),
            (":method".to_string(), spec.method.clone()),
            (":scheme".to_string(), "http".to_string()),
        ];
        for (k, v) in &spec.headers {
            headers.push((k.to_ascii_lowercase(), v.clone()));
        }
        if !spec.body.is_empty() {
            headers.push(("content-length".into(), spec.body.len().to_string()));
        }
        headers.push(("x-forwarded-proto".into(), "http".into()));
        headers.push((
            "x-request-id".into(),
            format!("{:016x}-{rid}", self.rng.next_u64()),
        ));
        let body_len = spec.body.len();
        let eos = body_len == 0;
        let st = &mut self.streams[rid];
        st.worker = worker;
        st.started = true;
        st.body_len = body_len;
        st.last_activity = self.now;
        let Some(vm) = vm else {
            // A worker without a usable VM: Envoy's wasm filter answers 503 itself.
            st.vm = 0;
            self.local_reply(rid, 503, Vec::new(), Vec::new(), false);
            return Ok(());
        };
        st.vm = vm;
        st.filter = filter;
        self.schedule_body(rid);
        self.arm_idle(rid);
        if !filter {
            self.pass_headers(rid, headers);
            if eos {
                self.pass_eos(rid);
            }
            return Ok(());
        }
        let ctx = {
            let h = self.vms[vm].store.data_mut();
            let ctx = h.alloc_ctx();
            let source = format!(
                "10.1.{}.{}:{}",
                (rid >> 8) & 255,
                rid & 255,
                40000 + rid % 20000
            );
            h.streams.insert(
                ctx,
                HttpData {
                    sid: rid,
                    req_headers: headers,
                    req_headers_writable: true,
                    source_address: source,
                    ..HttpData::default()
                },
            );
            ctx
        };
        self.streams[rid].ctx = ctx;
        let root = self.vms[vm].store.data().root_id;
        self.call(vm, Callback::ContextCreate(ctx, root));
        if self.vms[vm].failed.is_some() {
            if !self.streams[rid].finished {
                self.fail_stream(rid);
            }
            return Ok(());
        }
        let n = Self::http(&mut self.vms, &self.streams[rid]).map_or(0, |h| h.req_headers.len());
        let r = self.stream_call(rid, |c| Callback::RequestHeaders(c, n as u32, eos));
        let Some(action) = r else { return Ok(()) };
        self.after_request_action(rid, action, eos, true);
        Ok(())
    }

    fn schedule_body(&mut self, rid: usize) {
        let len = self.streams[rid].body_len;
        if len == 0 {
            return;
        }
        let chunk = self.cfg.body_chunk.max(1);
        let mut at = self.now;
        let mut sent = 0;
        while sent < len {
            let n = chunk.min(len - sent);
            at += US + (n as u64) / 1000; // ~1 GB/s on loopback
            self.push(at, Ev::Body { rid, len: n });
            sent += n;
        }
        self.push(at + US, Ev::BodyEnd { rid });
    }

    /// What Envoy does with the filter's return value for a request callback.
    fn after_request_action(&mut self, sid: usize, action: i32, eos: bool, headers_cb: bool) {
        if self.streams[sid].finished {
            return;
        }
        if action == 0 {
            // Continue: everything the filter held goes on.
            self.streams[sid].req_stopped = false;
            self.set_paused(sid, false);
            if !self.streams[sid].headers_passed {
                let headers = Self::http(&mut self.vms, &self.streams[sid])
                    .map(|h| h.req_headers.clone())
                    .unwrap_or_default();
                self.pass_headers(sid, headers);
            }
            if let Some(h) = Self::http(&mut self.vms, &self.streams[sid]) {
                h.req_body.clear();
            }
            if eos && !self.streams[sid].finished {
                self.pass_eos(sid);
            }
        } else {
            self.streams[sid].req_stopped = true;
            if headers_cb && !self.cfg.allow_on_headers_stop_iteration {
                // StopAllIterationAndWatermark: no body callbacks until continued.
                self.streams[sid].stop_all = true;
            }
            if eos {
                // Held with the whole request in hand: the request waits in the filter.
                self.set_paused(sid, true);
            }
            if !eos {
                let size =
                    Self::http(&mut self.vms, &self.streams[sid]).map_or(0, |h| h.req_body.len());
                if size > self.cfg.buffer_limit {
                    self.local_reply(sid, 413, b"Payload Too Large".to_vec(), Vec::new(), true);
                }
            }
        }
    }

    fn set_paused(&mut self, sid: usize, paused: bool) {
        let s = &mut self.streams[sid];
        if paused && !s.paused && self.outcomes[sid].enqueued_at.is_none() {
            self.outcomes[sid].enqueued_at = Some(self.now);
        }
        s.paused = paused;
    }

    fn on_body(&mut self, rid: usize, len: usize) {
        let s = &self.streams[rid];
        if !s.started || s.finished {
            return;
        }
        let start = s.delivered;
        let data = self.specs[rid].body[start..start + len].to_vec();
        self.streams[rid].last_activity = self.now;
        self.streams[rid].delivered += len;
        if !self.streams[rid].filter {
            return; // no filter: straight to the router
        }
        if let Some(h) = Self::http(&mut self.vms, &self.streams[rid]) {
            h.req_body.extend_from_slice(&data);
        }
        if self.streams[rid].stop_all {
            let size =
                Self::http(&mut self.vms, &self.streams[rid]).map_or(0, |h| h.req_body.len());
            if size > self.cfg.buffer_limit {
                self.local_reply(rid, 413, b"Payload Too Large".to_vec(), Vec::new(), true);
            }
            return;
        }
        let size = Self::http(&mut self.vms, &self.streams[rid]).map_or(0, |h| h.req_body.len());
        let Some(action) = self.stream_call(rid, |c| Callback::RequestBody(c, size as u32, false))
        else {
            return;
        };
        self.after_request_action(rid, action, false, false);
    }

    fn on_body_end(&mut self, rid: usize) {
        let s = &mut self.streams[rid];
        if !s.started || s.finished {
            return;
        }
        s.body_complete = true;
        s.last_activity = self.now;
        if !s.filter {
            self.pass_eos(rid);
            return;
        }
        if s.stop_all {
            return;
        }
        if s.headers_passed && !s.req_stopped {
            // Iteration continues: the end of stream still goes through the filter.
        }
        let size = Self::http(&mut self.vms, &self.streams[rid]).map_or(0, |h| h.req_body.len());
        let Some(action) = self.stream_call(rid, |c| Callback::RequestBody(c, size as u32, true))
        else {
            return;
        };
        self.after_request_action(rid, action, true, false);
    }

    fn continue_request(&mut self, sid: usize) {
        let s = &mut self.streams[sid];
        if s.finished || (!s.req_stopped && !s.stop_all) {
            return;
        }
        s.req_stopped = false;
        s.stop_all = false;
        self.set_paused(sid, false);
        if !self.streams[sid].headers_passed {
            let headers = Self::http(&mut self.vms, &self.streams[sid])
                .map(|h| h.req_headers.clone())
                .unwrap_or_default();
            self.pass_headers(sid, headers);
        }
        if self.streams[sid].finished {
            return;
        }
        if let Some(h) = Self::http(&mut self.vms, &self.streams[sid]) {
            h.req_body.clear();
        }
        let s = &self.streams[sid];
        if s.body_len == 0 || s.body_complete {
            self.pass_eos(sid);
        }
    }

    /// The request headers leave the filter: the router picks the upstream.
    fn pass_headers(&mut self, sid: usize, headers: Vec<(String, String)>) {
        self.streams[sid].headers_passed = true;
        if let Some(h) = Self::http(&mut self.vms, &self.streams[sid]) {
            h.req_headers_writable = false;
        }
        let dst = headers
            .iter()
            .find(|(k, _)| *k == self.cfg.route_header)
            .map(|(_, v)| v.clone())
            .filter(|v| v.parse::<std::net::SocketAddr>().is_ok());
        match dst {
            Some(d) => {
                self.streams[sid].endpoint = Some(d.clone());
                self.outcomes[sid].endpoint = Some(d);
            }
            None => {
                self.local_reply(sid, 503, b"no healthy upstream".to_vec(), Vec::new(), true);
            }
        }
    }

    /// The end of the request leaves the filter: the router sends it upstream.
    fn pass_eos(&mut self, sid: usize) {
        let s = &mut self.streams[sid];
        if s.eos_passed || s.finished {
            return;
        }
        s.eos_passed = true;
        self.set_paused(sid, false);
        let Some(ep_addr) = self.streams[sid].endpoint.clone() else {
            return;
        };
        self.outcomes[sid].dispatched_at = Some(self.now);
        let lat = self.cfg.network.upstream.draw(&mut self.rng);
        let ep = self
            .ep_index
            .get(&ep_addr)
            .copied()
            .filter(|&e| self.endpoints[e].up);
        let Some(ep) = ep else {
            self.push(self.now + 2 * lat, Ev::ConnectFail { rid: sid });
            return;
        };
        let headers = Self::http(&mut self.vms, &self.streams[sid])
            .map(|h| h.req_headers.clone())
            .unwrap_or_else(|| {
                vec![
                    (":path".into(), self.specs[sid].path.clone()),
                    (":method".into(), self.specs[sid].method.clone()),
                ]
            });
        if let Some(h) = Self::http(&mut self.vms, &self.streams[sid]) {
            h.upstream_address = Some(ep_addr.clone());
        }
        let get = |n: &str| {
            headers
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let req = UpstreamRequest {
            method: get(":method"),
            path: get(":path"),
            body: self.specs[sid].body.clone(),
            headers,
        };
        let uid = self.next_uid;
        self.next_uid += 1;
        self.streams[sid].uid = Some(uid);
        *self.in_flight.entry(ep_addr).or_default() += 1;
        self.upreqs.insert(
            uid,
            UpReq {
                owner: UpRef::Stream(sid),
                ep,
                req: Some(req),
                last_delivery: 0,
                callout: CalloutResponse::default(),
                done: false,
            },
        );
        self.push(self.now + lat, Ev::UpstreamArrive { uid });
    }

    // ----- upstreams ----------------------------------------------------------------

    fn on_upstream_arrive(&mut self, uid: u64) {
        let Some(u) = self.upreqs.get_mut(&uid) else {
            return; // cancelled on the way
        };
        let ep = u.ep;
        let Some(req) = u.req.take() else { return };
        if !self.endpoints[ep].up {
            self.upstream_failed(uid);
            return;
        }
        self.endpoints[ep].upstream.start(self.now, uid, &req);
        self.rearm_upstream(ep);
    }

    fn rearm_upstream(&mut self, ep: usize) {
        let next = self.endpoints[ep].upstream.next_wake();
        let e = &mut self.endpoints[ep];
        if let Some(t) = next {
            if e.wake_at.is_none_or(|w| t < w) {
                e.gen += 1;
                e.wake_at = Some(t);
                let gen = e.gen;
                self.push(t, Ev::UpstreamWake { ep, gen });
            }
        }
    }

    fn poll_upstream(&mut self, ep: usize) {
        let mut out = std::mem::take(&mut self.emit_buf);
        out.clear();
        self.endpoints[ep].upstream.poll(self.now, &mut out);
        for emit in out.drain(..) {
            let uid = match &emit {
                Emit::Head { id, .. } | Emit::Data { id, .. } | Emit::End { id } => *id,
            };
            let lat = self.cfg.network.upstream.draw(&mut self.rng);
            let Some(u) = self.upreqs.get_mut(&uid) else {
                continue;
            };
            // One upstream connection delivers in order.
            let at = (self.now + lat).max(u.last_delivery + 1);
            u.last_delivery = at;
            self.push(at, Ev::Deliver { uid, emit });
        }
        self.emit_buf = out;
        self.rearm_upstream(ep);
    }

    fn on_deliver(&mut self, uid: u64, emit: Emit) {
        let Some(u) = self.upreqs.get_mut(&uid) else {
            return;
        };
        match u.owner {
            UpRef::Callout { vm, token } => match emit {
                Emit::Head {
                    status, headers, ..
                } => {
                    u.callout.headers = vec![(":status".into(), status.to_string())];
                    u.callout.headers.extend(headers);
                }
                Emit::Data { bytes, .. } => u.callout.body.extend(bytes),
                Emit::End { .. } => {
                    let resp = std::mem::take(&mut u.callout);
                    self.upreqs.remove(&uid);
                    self.callout_done(vm, token, resp);
                }
            },
            UpRef::Stream(sid) => match emit {
                Emit::Head {
                    status, headers, ..
                } => self.on_response_head(sid, status, headers),
                Emit::Data { bytes, .. } => self.on_response_data(sid, bytes),
                Emit::End { .. } => {
                    u.done = true;
                    self.upstream_done(uid);
                    self.on_response_end(sid);
                }
            },
        }
    }

    /// An upstream request is finished (or abandoned): no longer in flight.
    fn upstream_done(&mut self, uid: u64) {
        let Some(u) = self.upreqs.remove(&uid) else {
            return;
        };
        if let UpRef::Stream(sid) = u.owner {
            if let Some(ep) = &self.streams[sid].endpoint {
                if let Some(n) = self.in_flight.get_mut(ep) {
                    *n = n.saturating_sub(1);
                }
            }
            self.streams[sid].upstream_ended = true;
        }
    }

    /// Resets the upstream side of a stream (client gone, local reply, ...).
    fn cancel_upstream(&mut self, sid: usize) {
        let Some(uid) = self.streams[sid].uid else {
            return;
        };
        if let Some(u) = self.upreqs.get(&uid) {
            let ep = u.ep;
            self.endpoints[ep].upstream.cancel(self.now, uid);
            self.upstream_done(uid);
            self.rearm_upstream(ep);
        }
    }

    /// The server went away under a request.
    fn upstream_failed(&mut self, uid: u64) {
        let Some(u) = self.upreqs.get(&uid) else {
            return;
        };
        match u.owner {
            UpRef::Callout { vm, token } => {
                self.upreqs.remove(&uid);
                let resp = CalloutResponse {
                    headers: vec![(":status".into(), "503".into())],
                    body: b"upstream connect error or disconnect/reset before headers. reset reason: connection termination".to_vec(),
                };
                self.callout_done(vm, token, resp);
            }
            UpRef::Stream(sid) => {
                self.upstream_done(uid);
                if self.streams[sid].head_sent {
                    self.reset_stream(sid, Final::Reset);
                } else {
                    let body = b"upstream connect error or disconnect/reset before headers. reset reason: connection termination".to_vec();
                    self.local_reply(sid, 503, body, Vec::new(), true);
                }
            }
        }
    }

    // ----- streams: response path ---------------------------------------------------

    fn on_response_head(&mut self, sid: usize, status: u16, headers: Vec<(String, String)>) {
        if self.streams[sid].finished {
            return;
        }
        let mut all = vec![(":status".to_string(), status.to_string())];
        all.extend(headers);
        if !self.streams[sid].filter {
            self.client_head(sid, all);
            return;
        }
        if let Some(h) = Self::http(&mut self.vms, &self.streams[sid]) {
            h.resp_headers = Some(all);
            h.resp_headers_writable = true;
            h.response_code = Some(status);
        }
        let n = Self::http(&mut self.vms, &self.streams[sid])
            .and_then(|h| h.resp_headers.as_ref().map(Vec::len))
            .unwrap_or(0);
        let Some(action) = self.stream_call(sid, |c| Callback::ResponseHeaders(c, n as u32, false))
        else {
            return;
        };
        if self.streams[sid].finished {
            return;
        }
        if action == 0 {
            self.send_head_from_filter(sid);
        } else {
            self.streams[sid].resp_stopped = true;
        }
    }

    fn send_head_from_filter(&mut self, sid: usize) {
        let headers = match Self::http(&mut self.vms, &self.streams[sid]) {
            Some(h) => {
                h.resp_headers_writable = false;
                h.resp_headers.clone().unwrap_or_default()
            }
            None => Vec::new(),
        };
        self.client_head(sid, headers);
    }

    fn on_response_data(&mut self, sid: usize, bytes: Vec<u8>) {
        if self.streams[sid].finished {
            return;
        }
        self.streams[sid].last_activity = self.now;
        if !self.streams[sid].filter {
            self.client_data(sid, &bytes);
            return;
        }
        let size = match Self::http(&mut self.vms, &self.streams[sid]) {
            Some(h) => {
                h.resp_body.extend_from_slice(&bytes);
                h.resp_body.len()
            }
            None => 0,
        };
        let Some(action) = self.stream_call(sid, |c| Callback::ResponseBody(c, size as u32, false))
        else {
            return;
        };
        if self.streams[sid].finished {
            return;
        }
        if action == 0 {
            self.streams[sid].resp_stopped = false;
            self.flush_response(sid);
        } else {
            self.streams[sid].resp_stopped = true;
        }
    }

    fn on_response_end(&mut self, sid: usize) {
        if self.streams[sid].finished {
            return;
        }
        if !self.streams[sid].filter {
            self.client_end(sid);
            return;
        }
        let size = Self::http(&mut self.vms, &self.streams[sid]).map_or(0, |h| h.resp_body.len());
        let Some(action) = self.stream_call(sid, |c| Callback::ResponseBody(c, size as u32, true))
        else {
            return;
        };
        if self.streams[sid].finished {
            return;
        }
        if action == 0 {
            self.streams[sid].resp_stopped = false;
            self.flush_response(sid);
            self.client_end(sid);
        } else {
            self.streams[sid].resp_stopped = true;
            self.streams[sid].resp_end_pending = true;
        }
    }

    fn flush_response(&mut self, sid: usize) {
        if !self.streams[sid].head_sent {
            self.send_head_from_filter(sid);
        }
        let body = Self::http(&mut self.vms, &self.streams[sid])
            .map(|h| std::mem::take(&mut h.resp_body))
            .unwrap_or_default();
        if !body.is_empty() {
            self.client_data(sid, &body);
        }
    }

    fn continue_response(&mut self, sid: usize) {
        let s = &mut self.streams[sid];
        if s.finished || !s.resp_stopped {
            return;
        }
        s.resp_stopped = false;
        self.flush_response(sid);
        if self.streams[sid].resp_end_pending {
            self.client_end(sid);
        }
    }

    /// A local reply (from the filter, the router or Envoy itself). With `through_filter`,
    /// the filter's response callbacks see it, as in Envoy.
    fn local_reply(
        &mut self,
        sid: usize,
        status: u16,
        body: Vec<u8>,
        extra: Vec<(String, String)>,
        through_filter: bool,
    ) {
        let s = &self.streams[sid];
        if s.finished {
            return;
        }
        if s.head_sent || s.in_local_reply {
            self.reset_stream(sid, Final::Reset);
            return;
        }
        self.streams[sid].in_local_reply = true;
        self.cancel_upstream(sid);
        let mut headers = vec![(":status".to_string(), status.to_string())];
        for (k, v) in extra {
            headers.push((k, v));
        }
        if !body.is_empty() {
            headers.push(("content-length".into(), body.len().to_string()));
            if !headers.iter().any(|(k, _)| k == "content-type") {
                headers.push(("content-type".into(), "text/plain".into()));
            }
        }
        let mut body = body;
        let run_filter = through_filter
            && self.streams[sid].filter
            && self.streams[sid].started
            && self.vms.0[self.streams[sid].vm]
                .as_ref()
                .is_some_and(|v| v.failed.is_none());
        if run_filter {
            let eos = body.is_empty();
            let n = headers.len() as u32;
            if let Some(h) = Self::http(&mut self.vms, &self.streams[sid]) {
                h.resp_headers = Some(headers.clone());
                h.resp_headers_writable = true;
                h.response_code = Some(status);
                h.resp_body.clear();
            }
            self.stream_call(sid, |c| Callback::ResponseHeaders(c, n, eos));
            if self.streams[sid].finished {
                return;
            }
            if let Some(h) = Self::http(&mut self.vms, &self.streams[sid]) {
                h.resp_headers_writable = false;
                if let Some(hh) = &h.resp_headers {
                    headers = hh.clone();
                }
            }
            if !eos {
                let len = body.len() as u32;
                if let Some(h) = Self::http(&mut self.vms, &self.streams[sid]) {
                    h.resp_body = body.clone();
                }
                self.stream_call(sid, |c| Callback::ResponseBody(c, len, true));
                if self.streams[sid].finished {
                    return;
                }
                if let Some(h) = Self::http(&mut self.vms, &self.streams[sid]) {
                    body = std::mem::take(&mut h.resp_body);
                }
            }
        }
        self.client_head(sid, headers);
        if !body.is_empty() {
            self.client_data(sid, &body);
        }
        self.client_end(sid);
    }

    // ----- the client side ----------------------------------------------------------

    fn client_time(&mut self, sid: usize) -> Nanos {
        let lat = self.cfg.network.client.draw(&mut self.rng);
        let s = &mut self.streams[sid];
        let t = (self.now + lat).max(s.last_client + 1);
        s.last_client = t;
        t
    }

    fn client_head(&mut self, sid: usize, headers: Vec<(String, String)>) {
        self.client_time(sid);
        self.streams[sid].head_sent = true;
        let o = &mut self.outcomes[sid];
        o.status = headers
            .iter()
            .find(|(k, _)| k == ":status")
            .and_then(|(_, v)| v.parse().ok());
        o.headers = headers
            .into_iter()
            .filter(|(k, _)| k != ":status")
            .collect();
    }

    fn client_data(&mut self, sid: usize, bytes: &[u8]) {
        let t = self.client_time(sid);
        let o = &mut self.outcomes[sid];
        if o.first_token_at.is_none() && !bytes.is_empty() {
            o.first_token_at = Some(t);
        }
        if o.body.len() < 1 << 20 {
            o.body.extend_from_slice(bytes);
        }
    }

    fn client_end(&mut self, sid: usize) {
        let t = self.client_time(sid);
        self.outcomes[sid].last_token_at = Some(t);
        self.finalize(sid, Final::Response, t);
        self.finish_stream(sid);
    }

    fn finalize(&mut self, sid: usize, fin: Final, at: Nanos) {
        let o = &mut self.outcomes[sid];
        if o.fin != Final::Pending {
            self.violations.push(Violation {
                invariant: "every request has exactly one final outcome".into(),
                at: self.now,
                after_event: self.current_event.clone(),
                message: format!("request {sid} ended as {:?} and again as {fin:?}", o.fin),
            });
            return;
        }
        o.fin = fin;
        o.finished_at = Some(at);
    }

    /// The stream is over in Envoy: the filter's `on_log`, `on_done` and `on_delete` run
    /// when the current event is done (Envoy's deferred deletion).
    fn finish_stream(&mut self, sid: usize) {
        let s = &mut self.streams[sid];
        if s.finished {
            return;
        }
        s.finished = true;
        s.paused = false;
        if s.uid.is_some() && !s.upstream_ended {
            self.cancel_upstream(sid);
        }
        self.deferred.push(sid);
    }

    fn run_deferred(&mut self) {
        let mut held = Vec::new();
        while !self.deferred.is_empty() {
            let batch = std::mem::take(&mut self.deferred);
            for sid in batch {
                if self.busy.contains(&self.streams[sid].vm) {
                    held.push(sid); // its VM is suspended: complete it when it is back
                } else {
                    self.complete(sid);
                }
            }
        }
        self.deferred = held;
    }

    fn complete(&mut self, sid: usize) {
        let s = &self.streams[sid];
        if s.completed {
            return;
        }
        let (vm, ctx, filter) = (s.vm, s.ctx, s.filter && s.ctx != 0);
        if filter && self.vms[vm].failed.is_none() {
            self.call(vm, Callback::Log(ctx));
            if self.vms[vm].failed.is_none() {
                self.call(vm, Callback::Done(ctx));
            }
            if self.vms[vm].failed.is_none() {
                self.call(vm, Callback::Delete(ctx));
            }
        }
        self.vms[vm].store.data_mut().streams.remove(&ctx);
        self.streams[sid].completed = true;
    }

    fn reset_stream(&mut self, sid: usize, fin: Final) {
        if self.streams[sid].finished {
            return;
        }
        self.cancel_upstream(sid);
        let t = self.client_time(sid);
        self.finalize(sid, fin, t);
        self.finish_stream(sid);
    }

    fn on_disconnect(&mut self, rid: usize) {
        if self.outcomes[rid].fin != Final::Pending {
            return;
        }
        if !self.streams[rid].started {
            // Gone before Envoy saw the request.
            self.finalize(rid, Final::Disconnected, self.now);
            return;
        }
        self.reset_stream(rid, Final::Disconnected);
    }

    fn arm_idle(&mut self, rid: usize) {
        if self.cfg.stream_idle_timeout > 0 {
            self.push(
                self.now + self.cfg.stream_idle_timeout,
                Ev::IdleCheck { rid },
            );
        }
    }

    fn on_idle_check(&mut self, rid: usize) {
        let s = &self.streams[rid];
        if s.finished {
            return;
        }
        let due = s.last_activity + self.cfg.stream_idle_timeout;
        if self.now < due {
            self.push(due, Ev::IdleCheck { rid });
            return;
        }
        if s.req_stopped || s.paused || s.resp_stopped {
            // Envoy would have held it until the idle timeout: the filter leaked it.
            self.leaked.push(rid);
        }
        if s.head_sent {
            self.reset_stream(rid, Final::Reset);
        } else {
            self.local_reply(rid, 408, b"stream timeout".to_vec(), Vec::new(), true);
        }
    }

    fn control(&mut self, c: Control) {
        match c {
            Control::AddEndpoint(addr, up) => {
                if let Some(&i) = self.ep_index.get(&addr) {
                    self.endpoints[i].upstream = up;
                    self.endpoints[i].up = true;
                } else {
                    self.add_endpoint(&addr, up);
                }
            }
            Control::RemoveEndpoint(addr) => {
                let Some(&ep) = self.ep_index.get(&addr) else {
                    return;
                };
                self.endpoints[ep].up = false;
                self.endpoints[ep].gen += 1;
                self.endpoints[ep].wake_at = None;
                let mut uids: Vec<u64> = self
                    .upreqs
                    .iter()
                    .filter(|(_, u)| u.ep == ep)
                    .map(|(k, _)| *k)
                    .collect();
                uids.sort_unstable();
                for uid in uids {
                    self.upstream_failed(uid);
                }
            }
            Control::SetCondition(addr, cond) => {
                if let Some(&ep) = self.ep_index.get(&addr) {
                    self.endpoints[ep].upstream.set_condition(self.now, cond);
                    self.rearm_upstream(ep);
                }
            }
            Control::AddFault(f) => self.add_fault(f),
        }
    }
}
