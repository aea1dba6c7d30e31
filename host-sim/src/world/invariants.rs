//! Invariants checked after every event (in test builds, or when enabled), and at the end
//! of a run.

use crate::sim::Sim;

/// The check of an invariant: `Err` describes the violation.
pub type Check = dyn Fn(&Sim) -> Result<(), String>;

/// A named check over the whole simulation; `Err` describes the violation.
pub struct Invariant {
    /// What it checks.
    pub name: String,
    /// The check.
    pub check: Box<Check>,
}

impl Invariant {
    /// A new invariant.
    pub fn new(name: &str, check: impl Fn(&Sim) -> Result<(), String> + 'static) -> Invariant {
        Invariant {
            name: name.to_string(),
            check: Box::new(check),
        }
    }
}

/// A violated invariant, with the virtual time and the event after which it was found.
#[derive(Debug, Clone)]
pub struct Violation {
    /// Which invariant.
    pub invariant: String,
    /// Virtual time.
    pub at: u64,
    /// The event just processed.
    pub after_event: String,
    /// The description.
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invariant `{}` violated at t={} ns after {}: {}",
            self.invariant, self.at, self.after_event, self.message
        )
    }
}
