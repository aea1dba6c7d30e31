//! The settings of a simulated process, the mid-run changes a scenario can schedule,
//! and what a VM crash leaves behind.

use crate::host::faults::Fault;
use crate::host::module;
use crate::host::vm::Cluster;
use crate::prometheus::{self, TagRule};
use crate::world::clock::{Nanos, SEC, US};
use crate::world::network::Network;
use crate::world::upstream::{Condition, Upstream};
use std::path::PathBuf;

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
    /// Independent Envoy processes (gateway replicas) in front of the same model servers,
    /// each with its own VMs, shared data, queues, stats and workers; clients' connections
    /// are spread over them as a Kubernetes Service spreads connections. 1 by default.
    pub replicas: usize,
    /// When each replica's VMs start (by replica; missing ones at 0): a gateway pod started
    /// (or restarted) mid-run, its shared data empty. Send it requests only after that.
    pub replica_start: Vec<Nanos>,
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
    /// Run the invariants after every event. On by default in every build (a test
    /// run in release checks as much as in debug); a bench that only measures turns it
    /// off explicitly ([`SimConfig::checks`]). The end-of-run checks always run.
    pub check_invariants: bool,
    /// Keep a readable trace of every event (the hash is always kept).
    pub record_trace: bool,
    /// `stats_tags` rules for the Prometheus view.
    pub tag_rules: Vec<TagRule>,
    /// Histogram buckets for the Prometheus view.
    pub histogram_buckets: Vec<prometheus::BucketSetting>,
    /// Stop after this many events.
    pub max_events: u64,
    /// Stop at this virtual time.
    pub max_time: Nanos,
    /// VMs on other threads start within this much of the base VM.
    pub vm_start_jitter: Nanos,
    /// Envoy's HCM `generate_request_id` (on by default): a request without
    /// `x-request-id` gets one before the filters run.
    pub generate_request_id: bool,
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
            replicas: 1,
            replica_start: Vec::new(),
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
                    dst_header: "x-gateway-destination-endpoint-primary".into(),
                },
                Cluster {
                    name: "scrape".into(),
                    dst_header: "x-envoy-original-dst-host".into(),
                },
            ],
            route_header: "x-gateway-destination-endpoint-primary".into(),
            callout_limit: 1024,
            check_invariants: true,
            record_trace: false,
            tag_rules: prometheus::default_rules(),
            histogram_buckets: prometheus::default_bucket_settings(),
            max_events: 50_000_000,
            max_time: 3600 * SEC,
            vm_start_jitter: 500 * US,
            generate_request_id: true,
            stream_idle_timeout: 300 * SEC,
            preempt_probability: 0.0,
            preempt_window: 100 * US,
            nested_local_reply_limit: 300,
        }
    }

    /// With the per-event invariant checks on or off.
    pub fn checks(mut self, on: bool) -> Self {
        self.check_invariants = on;
        self
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

    /// With `n` gateway replicas (independent Envoy processes) in front of the same servers.
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n.max(1);
        self
    }

    /// Thread slots of one replica: the base VM, the main thread and the workers.
    pub fn slots_per_replica(&self) -> usize {
        self.workers + 2
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
    /// Envoy removes the plugin (listener / filter config removal): `proxy_on_done` on
    /// every live VM's root context (seeded order). A root answering true is deleted
    /// (`proxy_on_delete`) at once; one answering false keeps its ticks, queue
    /// deliveries and callouts until it calls `proxy_done`, and is deleted after that
    /// callback. Streams already in the filter keep their HTTP contexts; requests
    /// arriving afterwards bypass the filter (the router then answers them itself, e.g.
    /// 503 "no healthy upstream" without a destination header). See
    /// [`Sim::root_shutdowns`](crate::Sim::root_shutdowns).
    RemovePlugin,
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
