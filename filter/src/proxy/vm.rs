//! This VM's state, shared by its root context and its HTTP contexts: one record, in
//! one thread-local (Envoy runs one VM per thread, so a thread-local is the VM's memory).
//! Access goes through [`with`], which never nests (a nested borrow would panic and kill
//! the VM: it logs instead).

use super::state::View;
use super::{host, store::HostStore};
use crate::flow_control::parked::Parked;
use crate::latency::observe::Tracked;
use crate::latency::{shared::Cache, Sample};
use crate::prefix::feedback::{Reporters, Watch};
use crate::prefix::index::PrefixIndex;
use crate::prefix::shared::Cursor;
use crate::runtime::Runtime;
use crate::shared_store::update;
use hashbrown::HashMap;
use prost::Message;
use std::cell::RefCell;
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;

/// A map keyed by an id Envoy hands out (a context's, a metric's), hashed by [`IdHasher`].
pub type IdMap<V> = HashMap<u32, V, BuildHasherDefault<IdHasher>>;

/// The hasher of [`IdMap`]: one 64-bit multiplication (the default hasher's 128-bit
/// product is a library call on wasm32, on every lookup). The product's high bits, which
/// the map's control bytes take, mix every bit of the id; its low bits, which choose the
/// bucket, keep consecutive ids apart. Ids are Envoy's, not a client's choice.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

const ID_MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(ID_MULTIPLIER);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(ID_MULTIPLIER);
    }
}

/// Shared-data key of the counter that hands out VM ids.
pub const VM_SEQ_KEY: &str = "epp.v1.vm-seq";

/// A request parked by flow control, with what is needed to route it when released.
#[derive(Debug, Clone)]
pub struct Waiting {
    /// `model` of the request.
    pub model: String,
    /// Flow: fairness id.
    pub fairness_id: String,
    /// Flow: priority.
    pub priority: i32,
    /// Body bytes.
    pub bytes: u64,
    /// Token estimate.
    pub tokens: u64,
    /// When it entered flow control (µs).
    pub enqueue_us: u64,
    /// What routing needs when it is released.
    pub route: super::route::RouteInput,
    /// The queue-size and queue-bytes series it was counted in when queued, lowered
    /// through the same series when it leaves the queue.
    pub queue_series: Option<[super::stats::Series; 2]>,
}

/// A request sent upstream and not finished.
#[derive(Debug, Clone)]
pub struct Running {
    /// The endpoint it went to.
    pub endpoint: String,
    /// Its model.
    pub model: String,
    /// The model it was sent as.
    pub target: String,
    /// Its flow's fairness id.
    pub fairness_id: String,
    /// Its priority.
    pub priority: i32,
    /// Token estimate.
    pub tokens: u64,
    /// Whether flow control counted it in flight (and must be told it finished).
    pub flow_controlled: bool,
    /// The response status, when passive health watches responses.
    pub status: Option<u16>,
    /// When its headers reached the filter (µs).
    pub received_us: u64,
    /// When flow control dispatched it (ms; 0 when it did not).
    pub dispatched_ms: u64,
    /// The metric series its end updates, resolved when it was admitted.
    pub series: Option<super::route::RequestSeries>,
}

impl Running {
    /// A request received at `received_us`, routed to `endpoint`.
    pub fn new(
        endpoint: String,
        input: &super::route::RouteInput,
        tokens: u64,
        flow_controlled: bool,
        received_us: u64,
    ) -> Self {
        Self {
            endpoint,
            model: input.model.clone(),
            target: input.target.clone(),
            fairness_id: input.fairness_id.clone(),
            priority: input.priority,
            tokens,
            flow_controlled,
            received_us,
            dispatched_ms: 0,
            status: None,
            series: None,
        }
    }

    /// [`Running::new`], taking the input's strings instead of copying them.
    pub fn from_input(
        sent: super::route::Dispatched,
        input: super::route::RouteInput,
        tokens: u64,
        flow_controlled: bool,
        received_us: u64,
    ) -> Self {
        Self {
            endpoint: sent.endpoint,
            model: input.model,
            target: input.target,
            fairness_id: input.fairness_id,
            priority: input.priority,
            tokens,
            flow_controlled,
            received_us,
            dispatched_ms: 0,
            status: None,
            series: sent.series,
        }
    }
}

/// The VM's state.
#[derive(Default)]
pub struct Vm {
    /// Process-unique id (0 until allocated).
    pub id: u64,
    /// The root context's id (to restore after waking other streams).
    pub root_context: u32,
    /// The configuration this VM runs (the root context's; `None` until configured).
    pub runtime: Option<Rc<Runtime>>,
    /// The prefix index, kept in step with every worker's picks through the shared log.
    pub prefix: PrefixIndex,
    /// How far this VM has read the shared prefix log.
    pub cursor: Cursor,
    /// Requests watched for cached-token feedback, by context id.
    pub watched: IdMap<Watch>,
    /// Endpoints known to report `cached_tokens`.
    pub reporters: Reporters,
    /// This VM's view of the snapshots and discovered endpoints.
    pub view: View,
    /// Requests parked by flow control on this VM.
    pub parked: Parked<Waiting>,
    /// Requests routed upstream from this VM, by context id.
    pub running: IdMap<Running>,
    /// This VM's inbox queue id, once registered.
    pub inbox: Option<u32>,
    /// Other VMs' inbox queue ids, by VM id.
    pub peers: HashMap<u64, u32>,
    /// Envoy's `vm_id` of this plugin (to resolve other VMs' queues).
    pub plugin_vm_id: String,
    /// The plugin is shutting down: parked requests are being answered.
    pub draining: bool,
    /// Requests observed for the latency predictor, by context id.
    pub tracked: IdMap<Tracked>,
    /// This VM's copy of the published latency model.
    pub model: Cache,
    /// Its running SLO requests, and every VM's as of its last tick.
    pub slo_running: crate::latency::running::Local,
    /// Training samples not yet pushed to the shared queue.
    pub samples: Vec<Sample>,
    /// Routing decisions made by this VM (plugins are timed in a sample of them).
    pub decisions: u64,
    /// Whether the pool has endpoints, and since when (which queue-wait budget applies).
    pub regime: crate::flow_control::ttl::Regime,
}

thread_local! {
    static VM: RefCell<Vm> = RefCell::new(Vm::default());
}

/// This VM's runtime, once configured.
pub fn runtime() -> Option<Rc<Runtime>> {
    with(|vm| vm.runtime.clone()).flatten()
}

/// Runs `f` on the VM state; `None` (logged) if the state is already borrowed.
pub fn with<R>(f: impl FnOnce(&mut Vm) -> R) -> Option<R> {
    VM.with(|cell| match cell.try_borrow_mut() {
        Ok(mut vm) => Some(f(&mut vm)),
        Err(_) => {
            log::error!("internal: nested access to the VM state");
            None
        }
    })
}

#[derive(Clone, PartialEq, Message)]
struct Seq {
    #[prost(uint64, tag = "1")]
    next: u64,
}

/// How many VM ids were handed out (ids are `1..=allocated()`); 0 if unknown.
pub fn allocated() -> u64 {
    crate::shared_store::read::<Seq>(&HostStore, VM_SEQ_KEY)
        .ok()
        .flatten()
        .map_or(0, |s| s.next)
}

/// This VM's process-unique id, allocated from a shared counter on first use.
pub fn id() -> u64 {
    let known = with(|vm| vm.id).unwrap_or(0);
    if known != 0 {
        return known;
    }
    let id = match update(&HostStore, VM_SEQ_KEY, |s: &mut Seq| {
        s.next += 1;
        s.next
    }) {
        Ok(id) => id,
        Err(e) => {
            // Without a unique id this VM's counts could merge with another's; a
            // clock-derived id is unique enough and keeps requests flowing.
            let fallback = host::now_ms().map_or(u64::MAX, |t| t.unsigned_abs() | (1 << 63));
            log::warn!("cannot allocate a VM id ({e:?}); using {fallback}");
            fallback
        }
    };
    with(|vm| vm.id = id);
    id
}
