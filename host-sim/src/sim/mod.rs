//! [`Sim`]: one simulated Envoy process with the filter loaded in every VM, its clients
//! and model servers, run as a discrete-event simulation in virtual time.
//!
//! What Envoy does around the filter is reproduced here: the VM layout (a base VM and a
//! thread-local VM on the main thread, one VM per worker), connections spread over
//! workers, the HTTP filter chain of one stream (pause/continue, body buffering with
//! cumulative sizes, the buffer limit, local replies that pass through the response
//! callbacks, `on_log` then `on_done`), the ORIGINAL_DST router, callouts, ticks, queue
//! notifications, and the failure policy when a VM traps.
//!
//! | module | holds |
//! |---|---|
//! | `config` | [`SimConfig`], [`Control`], [`Crash`], [`FailurePolicy`] |
//! | `events` | the events, the loop that handles them, ticks and queue deliveries |
//! | `process` | the compiled filter and what its VMs share |
//! | `vms` | the VMs: creation, calls (with preemption), deferred actions, crashes, callouts, plugin removal |
//! | `stream` | one request's stream through Envoy: its phases and flags, calling the filter for it |
//! | `request_path` | the request through the filter's callbacks to the router and upstream |
//! | `response_path` | the response through the filter's callbacks, local replies, the client's view |
//! | `stream_end` | final outcomes, deferred deletion, resets, disconnects, the idle timeout |
//! | `upstreams` | requests at the model servers, servers coming and going |
//! | `kv_relay` | the KV-event relay's callouts ([`Sim::add_kv_relay`]) |
//! | `checks` | invariants and the end-of-run checks |

mod checks;
mod config;
mod events;
mod kv_relay;
mod process;
mod request_path;
mod response_path;
mod stream;
mod stream_end;
mod upstreams;
mod vms;

pub use config::{Control, Crash, FailurePolicy, SimConfig};

use crate::host::faults::Fault;
use crate::host::lock;
use crate::host::vm::LogLine;
use crate::prometheus;
use crate::world::balancers::Balancer;
use crate::world::clock::{Fnv, Nanos, Rng, MS};
use crate::world::invariants::{Invariant, Violation};
use crate::world::outcomes::{Final, Outcome};
use crate::world::upstream::Upstream;
use crate::world::workload::RequestSpec;
use crate::{SLOT_BASE, SLOT_MAIN};
use anyhow::Result;
use checks::Checks;
use events::{Ev, Events};
use process::Process;
use stream::{Requests, Stream};
use upstreams::{Endpoint, Upstreams};
use vms::Vms;

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

/// What a run leaves for inspection besides the outcomes.
#[derive(Default)]
struct Record {
    /// Hash of every event and VM call: equal for runs with identical sequences.
    hash: Fnv,
    /// Every event in words (when `record_trace`).
    trace: Vec<String>,
    /// VM crashes.
    crashes: Vec<Crash>,
    /// FAIL_RELOAD reloads.
    reloads: u64,
    /// Times a callback was suspended inside a host call.
    yields: u64,
    /// Events handled.
    events: u64,
    /// VM callbacks made.
    vm_calls: u64,
}

/// One simulated Envoy process with its world.
pub struct Sim {
    /// The settings.
    cfg: SimConfig,
    /// Virtual time: when the event being handled happens.
    now: Nanos,
    /// The seeded generator every random choice of the world draws from.
    rng: Rng,
    /// The compiled filter and what its VMs share.
    process: Process,
    /// The VMs and their per-VM state.
    vms: Vms,
    /// Pending events and the scenario's scheduled changes.
    events: Events,
    /// The clients' requests and Envoy's streams for them.
    requests: Requests,
    /// The model servers and the requests at them.
    upstreams: Upstreams,
    /// Invariants and what they found.
    checks: Checks,
    /// Counters, crashes and the trace.
    record: Record,
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

impl Sim {
    /// A process with `cfg`: loads (or reuses) the compiled module and schedules the VMs'
    /// start. Nothing runs until [`Sim::run`].
    pub fn new(cfg: SimConfig) -> Result<Sim> {
        let per = cfg.slots_per_replica();
        let slots = per * cfg.replicas;
        let mut sim = Sim {
            now: 0,
            rng: Rng::new(cfg.seed, 1),
            process: Process::new(&cfg)?,
            vms: Vms::new(slots),
            events: Events::default(),
            requests: Requests::default(),
            upstreams: Upstreams::default(),
            checks: Checks::default(),
            record: Record::default(),
            cfg,
        };
        // The base VM is created when the configuration loads; the thread-local VMs of the
        // main thread and the workers follow on their threads, in no fixed order.
        for r in 0..sim.cfg.replicas {
            let base = r * per;
            let t0 = sim.cfg.replica_start.get(r).copied().unwrap_or(0);
            sim.push(
                t0,
                Ev::VmStart {
                    slot: base + SLOT_BASE,
                },
            );
            for slot in base + SLOT_MAIN..base + per {
                let at = t0 + 1 + sim.rng.below(sim.cfg.vm_start_jitter.max(1));
                sim.push(at, Ev::VmStart { slot });
            }
        }
        Ok(sim)
    }

    /// Adds a model server at `addr` (`ip:port`), up from the start.
    pub fn add_endpoint(&mut self, addr: &str, upstream: Box<dyn Upstream>) {
        let idx = self.upstreams.endpoints.len();
        self.upstreams.endpoints.push(Endpoint {
            addr: addr.to_string(),
            upstream,
            up: true,
            gen: 0,
            wake_at: None,
        });
        self.upstreams.by_addr.insert(addr.to_string(), idx);
    }

    /// Routes every request with `balancer` instead of the filter: requests skip the Wasm
    /// filter (the VMs still start and tick) and the router sends each to the endpoint the
    /// balancer picks among those up, given their in-flight counts. For runs of the same
    /// world behind Envoy's own load balancers or a model of another router.
    pub fn set_balancer(&mut self, balancer: Box<dyn Balancer>) {
        self.upstreams.balancer = Some(balancer);
    }

    /// Adds requests; their ids are their positions in the order added. Returns the ids.
    pub fn add_requests(&mut self, specs: impl IntoIterator<Item = RequestSpec>) -> Vec<usize> {
        let mut ids = Vec::new();
        for spec in specs {
            let rid = self.requests.specs.len();
            self.requests.outcomes.push(Outcome {
                id: rid,
                label: spec.label.clone(),
                fin: Final::Pending,
                status: None,
                headers: Vec::new(),
                body: Vec::new(),
                worker: None,
                replica: 0,
                endpoint: None,
                sent_at: spec.at,
                enqueued_at: None,
                dispatched_at: None,
                first_token_at: None,
                last_token_at: None,
                data_at: Vec::new(),
                finished_at: None,
            });
            let replica = match spec.replica {
                Some(r) => r.min(self.cfg.replicas - 1),
                None => {
                    self.requests
                        .conns
                        .replica(spec.connection, self.cfg.replicas, &mut self.rng)
                }
            };
            self.requests.outcomes[rid].replica = replica;
            let worker =
                self.requests
                    .conns
                    .worker(spec.connection, self.cfg.workers, &mut self.rng);
            self.requests.streams.push(Stream {
                replica,
                worker,
                ..Stream::default()
            });
            let lat = self.cfg.network.client.draw(&mut self.rng);
            self.push(spec.at + lat, Ev::Headers { rid });
            if let Some(after) = spec.disconnect_after {
                let lat = self.cfg.network.client.draw(&mut self.rng);
                self.push(spec.at + after + lat, Ev::Disconnect { rid });
            }
            self.requests.specs.push(spec);
            ids.push(rid);
        }
        ids
    }

    /// Schedules a change to the world at `at`.
    pub fn at(&mut self, at: Nanos, control: Control) {
        let idx = self.events.controls.len();
        self.events.controls.push(Some(control));
        self.push(at, Ev::Control { idx });
    }

    /// Injects a host-call failure from now on.
    pub fn add_fault(&mut self, mut fault: Fault) {
        fault.rng = Rng::new(self.rng.next_u64(), 5);
        lock(&self.process.faults).rules.push(fault);
    }

    /// How many times a callback was suspended inside a host call so others could run.
    pub fn yields(&self) -> u64 {
        self.record.yields
    }

    /// Conditional shared-data writes refused because another VM wrote first (in the
    /// first replica).
    pub fn cas_mismatches(&self) -> u64 {
        lock(&self.process.shared[0]).cas_mismatches
    }

    /// How many times each injected fault fired, in the order they were added.
    pub fn faults_fired(&self) -> Vec<u64> {
        lock(&self.process.faults)
            .rules
            .iter()
            .map(Fault::fired)
            .collect()
    }

    /// Adds an invariant checked after every event (when `check_invariants`) and at the end.
    pub fn add_invariant(&mut self, inv: Invariant) {
        self.checks.invariants.push(inv);
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
            if self.events.queue.peek_time().is_none() {
                break;
            }
        }
        Ok(self.all_final())
    }

    /// The current virtual time.
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// Every request's outcome, by id.
    pub fn outcomes(&self) -> &[Outcome] {
        &self.requests.outcomes
    }

    /// One request's outcome.
    pub fn outcome(&self, id: usize) -> &Outcome {
        &self.requests.outcomes[id]
    }

    /// The Prometheus text (`/stats/prometheus`) of the process's stats (the first
    /// replica's; see [`Sim::replica_prometheus`]).
    pub fn prometheus(&self) -> String {
        self.replica_prometheus(0)
    }

    /// The Prometheus text (`/stats/prometheus`) of gateway replica `r`'s stats.
    pub fn replica_prometheus(&self, r: usize) -> String {
        let Some(shared) = self.process.shared.get(r) else {
            return String::new();
        };
        prometheus::render(
            &lock(shared).stats,
            &self.cfg.tag_rules,
            &self.cfg.histogram_buckets,
        )
    }

    /// The value of one Prometheus series, e.g. `m{a="x"}`.
    pub fn metric(&self, series: &str) -> Option<f64> {
        prometheus::value(&self.prometheus(), series)
    }

    /// A shared-data value (host-side view; the first replica's).
    pub fn shared_data(&self, key: &str) -> Option<Vec<u8>> {
        lock(&self.process.shared[0])
            .peek(&self.cfg.vm_id, key)
            .map(<[u8]>::to_vec)
    }

    /// The plugin's shared data (the first replica's): how many keys, and their keys' and values' total bytes.
    pub fn shared_data_footprint(&self) -> (usize, usize) {
        lock(&self.process.shared[0]).footprint(&self.cfg.vm_id)
    }

    /// Requests in flight at the model server `addr` right now (sent, not finished).
    pub fn in_flight(&self, addr: &str) -> u64 {
        self.upstreams.in_flight.get(addr).copied().unwrap_or(0)
    }

    /// Addresses of all endpoints ever added.
    pub fn endpoint_addresses(&self) -> Vec<String> {
        self.upstreams
            .endpoints
            .iter()
            .map(|e| e.addr.clone())
            .collect()
    }

    /// The trace hash: equal for runs with identical event sequences.
    pub fn trace_hash(&self) -> u64 {
        self.record.hash.0
    }

    /// The readable trace (when `record_trace`).
    pub fn trace(&self) -> &[String] {
        &self.record.trace
    }

    /// VM crashes so far.
    pub fn crashes(&self) -> &[Crash] {
        &self.record.crashes
    }

    /// FAIL_RELOAD reloads so far (Envoy's `vm_reload_success`).
    pub fn reloads(&self) -> u64 {
        self.record.reloads
    }

    /// Log lines of every VM.
    pub fn logs(&self) -> Vec<LogLine> {
        lock(&self.process.log).clone()
    }

    /// Calls across the VM boundary so far (every VM): imports and callbacks, with the
    /// bytes handed into the VMs.
    pub fn host_calls(&self) -> crate::host::calls::CallCounts {
        lock(&self.process.calls).clone()
    }

    /// Each live VM's linear memory, in bytes (a Wasm memory only grows: this is the
    /// most the VM's heap ever needed).
    pub fn vm_memory_bytes(&mut self) -> Vec<usize> {
        let mut out = Vec::new();
        for vm in self.vms.all.iter_mut().flatten() {
            if let Some(m) = vm.store.data().memory {
                out.push(m.data_size(&vm.store));
            }
        }
        out
    }

    /// Invariant violations found so far.
    pub fn violations(&self) -> &[Violation] {
        &self.checks.violations
    }

    /// Events processed and VM callbacks made.
    pub fn counts(&self) -> (u64, u64) {
        (self.record.events, self.record.vm_calls)
    }

    /// Ids of streams Envoy still holds (not completed): after a run, leaked streams.
    pub fn open_streams(&self) -> Vec<usize> {
        (0..self.requests.streams.len())
            .filter(|&i| self.requests.streams[i].held())
            .collect()
    }

    /// The current settings.
    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    /// The roots that got `proxy_on_done` (after [`Control::RemovePlugin`]), by VM.
    pub fn root_shutdowns(&self) -> Vec<RootShutdown> {
        self.vms.shutdowns.iter().flatten().cloned().collect()
    }
}
