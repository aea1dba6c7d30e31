//! What the whole simulated process holds for its VMs: the compiled filter, the linker
//! with host-sim's imports, and the state every VM shares. With several gateway replicas
//! each replica (an Envoy process of its own) has its own shared data, queues, stats and
//! callout count; the module, the log and the fault rules are the simulation's.

use super::config::SimConfig;
use crate::host::abi;
use crate::host::calls::CallCounts;
use crate::host::faults::Faults;
use crate::host::module::{self, Compiled};
use crate::host::shared::Shared;
use crate::host::vm::{Cluster, HostState, LogLine, Vm, VmInit};
use anyhow::Result;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use wasmtime::Linker;

/// The compiled filter and the process-wide state its VMs share.
pub(super) struct Process {
    /// The compiled module (cached per process and on disk).
    compiled: Arc<Compiled>,
    /// The module's imports bound to host-sim's.
    linker: Linker<HostState>,
    /// Shared data, shared queues and stats, per replica.
    pub(super) shared: Vec<Arc<Mutex<Shared>>>,
    /// Injected host-call failures.
    pub(super) faults: Arc<Mutex<Faults>>,
    /// Every VM's log lines.
    pub(super) log: Arc<Mutex<Vec<LogLine>>>,
    /// Calls across every VM's boundary.
    pub(super) calls: Arc<Mutex<CallCounts>>,
    /// The clusters callouts may go to.
    pub(super) clusters: Arc<Vec<Cluster>>,
    /// Callouts in flight process-wide (the circuit breaker counts them), per replica.
    pub(super) callouts_in_flight: Vec<Arc<AtomicU32>>,
}

impl Process {
    /// Loads (or reuses) the compiled module of `cfg` and binds its imports.
    pub(super) fn new(cfg: &SimConfig) -> Result<Process> {
        let compiled = module::load(&cfg.wasm)?;
        let linker = abi::linker(&compiled.engine, &compiled.module)?;
        Ok(Process {
            compiled,
            linker,
            shared: (0..cfg.replicas).map(|_| Arc::default()).collect(),
            faults: Arc::default(),
            log: Arc::default(),
            calls: Arc::default(),
            clusters: Arc::new(cfg.clusters.clone()),
            callouts_in_flight: (0..cfg.replicas).map(|_| Arc::default()).collect(),
        })
    }

    /// A new VM on thread `slot` with the plugin of `cfg`, its randomness from `seed`
    /// (instantiated; no context created yet), in the replica the slot belongs to.
    pub(super) fn new_vm(&self, cfg: &SimConfig, slot: usize, seed: u64) -> Result<Vm> {
        let replica = slot / cfg.slots_per_replica();
        Vm::new(
            &self.compiled.engine,
            &self.linker,
            &self.compiled.module,
            VmInit {
                slot,
                vm_id: cfg.vm_id.clone(),
                plugin_name: cfg.plugin_name.clone(),
                root_id_name: cfg.root_id.clone(),
                plugin_config: cfg.plugin_config.clone().into_bytes(),
                vm_config: cfg.vm_config.clone().into_bytes(),
                seed,
                shared: self.shared[replica].clone(),
                faults: self.faults.clone(),
                log: self.log.clone(),
                calls: self.calls.clone(),
                clusters: self.clusters.clone(),
                callouts_in_flight: self.callouts_in_flight[replica].clone(),
                callout_limit: cfg.callout_limit,
                preempt_probability: cfg.preempt_probability,
            },
        )
    }
}
