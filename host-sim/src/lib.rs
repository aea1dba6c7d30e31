//! host-sim: the real filter `.wasm` in a simulated Envoy 1.40, in virtual time.
//!
//! * [`host`] — a Proxy-Wasm host on wasmtime: every import of ABI 0.2.1 plus the WASI
//!   functions a `wasm32-wasip1` filter links, with Envoy's semantics (several VMs per
//!   process, shared data with CAS, last-registrant shared queues, deferred continue and
//!   local reply, effective contexts, body buffering, callouts, process-wide metrics,
//!   `FAIL_RELOAD`, injectable host-call failures).
//! * [`world`] — the discrete-event world: clock, events, clients and workloads,
//!   network, model servers ([`world::upstream::Upstream`]; [`VllmUpstream`] runs the
//!   `vllm-sim` engine), outcomes, invariants.
//! * [`sim`] — [`Sim`], which runs a scenario: Envoy's stream handling around the VMs.
//! * [`prometheus`] — the `/stats/prometheus` view with the bootstrap's tag rules.
//!
//! See the crate README for how to write a scenario.

pub mod host;
pub mod prometheus;
pub mod sim;
pub mod world;

pub use host::faults::{Fault, FaultAction};
pub use sim::{Control, Crash, FailurePolicy, RootShutdown, Sim, SimConfig};
pub use vllm_sim;
pub use world::clock::{ms, us, Nanos, MS, SEC, US};
pub use world::outcomes::{Final, Outcome};
pub use world::upstream::{Condition, SimpleUpstream, Upstream};
pub use world::vllm::{VllmConfig, VllmUpstream};
pub use world::workload::{Poisson, RequestSpec};

/// Thread slot of Envoy's main-thread "base" VM (configuration only, no ticks).
pub const SLOT_BASE: usize = 0;
/// Thread slot of the main thread's thread-local VM (ticks, queues).
pub const SLOT_MAIN: usize = 1;
/// Thread slot of worker `w` (of the first replica).
pub const fn slot_of_worker(w: usize) -> usize {
    w + 2
}
/// Thread slot of local slot `local` ([`SLOT_BASE`], [`SLOT_MAIN`], [`slot_of_worker`]) in
/// gateway replica `replica` of a sim with `workers` workers per replica: each replica's
/// slots follow the previous replica's, so replica 0's are the plain ones.
pub const fn replica_slot(replica: usize, workers: usize, local: usize) -> usize {
    replica * (workers + 2) + local
}
