//! [`Sim`]: one simulated Envoy process with the filter loaded in every VM, its clients
//! and model servers, run as a discrete-event simulation in virtual time.
//!
//! What Envoy does around the filter is reproduced here: the VM layout (a base VM and a
//! thread-local VM on the main thread, one VM per worker), connections spread over
//! workers, the HTTP filter chain of one stream (pause/continue, body buffering with
//! cumulative sizes, the buffer limit, local replies that pass through the response
//! callbacks, `on_log` then `on_done`), the ORIGINAL_DST router, callouts, ticks, queue
//! notifications, and the failure policy when a VM traps.

mod config;
mod streams;
mod upstreams;
mod vms;

pub use config::{Control, Crash, FailurePolicy, SimConfig};

use crate::host::abi;
use crate::host::effects::{Effect, Outgoing, StreamDir};
use crate::host::faults::{Fault, Faults};
use crate::host::module::{self, Compiled};
use crate::host::shared::Shared;
use crate::host::vm::{
    Callback, CalloutResponse, Cluster, HostState, HttpData, LogLine, Vm, VmInit,
};
use crate::prometheus;
use crate::world::balancers::{Balancer, Candidate, Pick};
use crate::world::client::Connections;
use crate::world::clock::{Fnv, Nanos, Rng, MS};
use crate::world::events::EventQueue;
use crate::world::invariants::{Invariant, Violation};
use crate::world::outcomes::{Final, Outcome};
use crate::world::upstream::{Emit, Upstream, UpstreamRequest};
use crate::world::workload::RequestSpec;
use crate::{slot_of_worker, SLOT_BASE, SLOT_MAIN};
use anyhow::{bail, Result};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use wasmtime::Linker;

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

/// One VM root context's shutdown after [`Control::RemovePlugin`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootShutdown {
    /// Thread slot (0 base, 1 main thread, 2.. workers).
    pub slot: usize,
    /// When `proxy_on_done` was called.
    pub on_done_at: Nanos,
    /// `proxy_on_done` answered false ("not done yet").
    pub not_done: bool,
    /// When `proxy_done` was called (only after a false `on_done`).
    pub proxy_done_at: Option<Nanos>,
    /// When the root was deleted (`proxy_on_delete`); `None` while draining.
    pub deleted_at: Option<Nanos>,
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
    removed_at: Option<Nanos>,
    shutdowns: Vec<Option<RootShutdown>>,
    balancer: Option<Box<dyn Balancer>>,
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
            balancer: None,
            crashes: Vec::new(),
            reloads: 0,
            events_processed: 0,
            vm_calls: 0,
            emit_buf: Vec::new(),
            current_event: String::new(),
            removed_at: None,
            shutdowns: Vec::new(),
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

    /// Routes every request with `balancer` instead of the filter: requests skip the Wasm
    /// filter (the VMs still start and tick) and the router sends each to the endpoint the
    /// balancer picks among those up, given their in-flight counts. For runs of the same
    /// world behind Envoy's own load balancers or a model of another router.
    pub fn set_balancer(&mut self, balancer: Box<dyn Balancer>) {
        self.balancer = Some(balancer);
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
                data_at: Vec::new(),
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

    /// Runs until every request has its final outcome, or until virtual time `limit`;
    /// true if every request has one. Unlike [`Sim::run`] it does not wait for the
    /// filter's own background work (metrics scrapes keep a callout in flight forever);
    /// no end-of-run checks.
    pub fn run_until_answered(&mut self, limit: Nanos) -> Result<bool> {
        const STEP: Nanos = 100 * MS;
        while !self.all_final() && self.now < limit {
            let next = (self.now + STEP).min(limit);
            self.run_loop(Some(next))?;
            if self.events.peek_time().is_none() {
                break;
            }
        }
        Ok(self.all_final())
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

    /// When [`Control::RemovePlugin`] ran.
    pub fn plugin_removed_at(&self) -> Option<Nanos> {
        self.removed_at
    }

    /// The roots that got `proxy_on_done` (after [`Control::RemovePlugin`]), by VM.
    pub fn root_shutdowns(&self) -> Vec<RootShutdown> {
        self.shutdowns.iter().flatten().cloned().collect()
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
            if until.is_none()
                && self.work_pending == 0
                && self.all_final()
                && self.draining_vms().is_empty()
            {
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
        let draining = self.draining_vms();
        if !draining.is_empty() {
            let slots: Vec<usize> = draining.iter().map(|&v| self.vm_slot[v]).collect();
            problems.push(format!(
                "{} root context(s) answered on_done with false and never called proxy_done (slots {slots:?})",
                draining.len()
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
                if cur == gen
                    && period > 0
                    && self.vms[vm].failed.is_none()
                    && !self.root_deleted(vm)
                {
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
                    if known && !self.root_deleted(vm) {
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
}
