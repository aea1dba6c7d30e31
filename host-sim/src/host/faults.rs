//! Injectable host-call failures: make chosen imports fail (or trap) for chosen VMs,
//! at chosen virtual times, to test the filter's error paths.

use crate::world::clock::{Nanos, Rng};

/// What an injected fault does instead of the import's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Return this proxy-wasm status (use codes the SDK knows: 1,2,3,4,7,8,10).
    Status(u32),
    /// Trap: the VM crashes in this host call.
    Trap,
}

/// One fault rule.
#[derive(Debug, Clone)]
pub struct Fault {
    /// Import name, e.g. `proxy_set_shared_data`.
    pub import: String,
    /// Only in this thread slot (0 base VM, 1 main-thread VM, [`crate::slot_of_worker`] for workers).
    pub slot: Option<usize>,
    /// Active from this virtual time.
    pub from: Nanos,
    /// Active until this virtual time (exclusive).
    pub until: Nanos,
    /// Skip this many matching calls first.
    pub skip: u64,
    /// Fire at most this many times.
    pub times: u64,
    /// What to do.
    pub action: FaultAction,
    /// Chance that a matching call fires (seeded by the run).
    pub probability: f64,
    pub(crate) rng: Rng,
    pub(crate) seen: u64,
    pub(crate) fired: u64,
}

impl Fault {
    /// A fault on every call to `import` from now on, in every VM.
    pub fn new(import: &str, action: FaultAction) -> Fault {
        Fault {
            import: import.to_string(),
            slot: None,
            from: 0,
            until: Nanos::MAX,
            skip: 0,
            times: u64::MAX,
            action,
            probability: 1.0,
            rng: Rng::new(0, 5),
            seen: 0,
            fired: 0,
        }
    }

    /// Only in thread slot `slot`.
    pub fn in_slot(mut self, slot: usize) -> Fault {
        self.slot = Some(slot);
        self
    }

    /// Only during `[from, until)`.
    pub fn between(mut self, from: Nanos, until: Nanos) -> Fault {
        self.from = from;
        self.until = until;
        self
    }

    /// Let the first `n` matching calls through.
    pub fn after(mut self, n: u64) -> Fault {
        self.skip = n;
        self
    }

    /// Fire at most `n` times.
    pub fn times(mut self, n: u64) -> Fault {
        self.times = n;
        self
    }

    /// Fire on each matching call with probability `p` (drawn from the run's seed).
    pub fn probability(mut self, p: f64) -> Fault {
        self.probability = p;
        self
    }

    /// How many times it fired.
    pub fn fired(&self) -> u64 {
        self.fired
    }
}

/// The active rules of a run.
#[derive(Debug, Default)]
pub struct Faults {
    /// The rules, checked in order; the first that fires wins.
    pub rules: Vec<Fault>,
}

impl Faults {
    /// The action for a call to `import` from `slot` at `now`, if a rule fires.
    pub fn check(&mut self, import: &str, slot: usize, now: Nanos) -> Option<FaultAction> {
        for f in &mut self.rules {
            if f.import != import
                || f.slot.is_some_and(|s| s != slot)
                || now < f.from
                || now >= f.until
            {
                continue;
            }
            f.seen += 1;
            if f.seen <= f.skip || f.fired >= f.times {
                continue;
            }
            if f.probability < 1.0 && f.rng.unit() >= f.probability {
                continue;
            }
            f.fired += 1;
            return Some(f.action);
        }
        None
    }
}
