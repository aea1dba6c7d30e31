//! Invariants checked while a run goes (after every event, when enabled) and what
//! [`Sim::run`] checks at its end: no violation, no leaked or still-held stream, no root
//! still draining, every request answered.

use super::Sim;
use crate::world::invariants::{Invariant, Violation};
use crate::world::outcomes::Final;
use anyhow::{bail, Result};

/// The invariants and what they found.
#[derive(Default)]
pub(super) struct Checks {
    /// The scenario's invariants.
    pub(super) invariants: Vec<Invariant>,
    /// Violations found so far (the host's own, such as a second final outcome, too).
    pub(super) violations: Vec<Violation>,
    /// Streams the filter paused and never released (Envoy's idle timeout ended them).
    pub(super) leaked: Vec<usize>,
}

impl Sim {
    /// Runs every invariant now, recording violations.
    pub(super) fn check_invariants(&mut self) {
        let invs = std::mem::take(&mut self.checks.invariants);
        for inv in &invs {
            if let Err(message) = (inv.check)(self) {
                self.checks.violations.push(Violation {
                    invariant: inv.name.clone(),
                    at: self.now,
                    after_event: self.events.current.clone(),
                    message,
                });
            }
        }
        self.checks.invariants = invs;
    }

    /// The end-of-run checks; `Err` lists every problem.
    pub(super) fn finish_checks(&mut self) -> Result<()> {
        self.check_invariants();
        let mut problems: Vec<String> = self
            .checks
            .violations
            .iter()
            .map(ToString::to_string)
            .collect();
        let leaked = &self.checks.leaked;
        if !leaked.is_empty() {
            problems.push(format!(
                "{} stream(s) paused by the filter and never released (ended by Envoy's stream idle timeout): {:?}",
                leaked.len(),
                &leaked[..leaked.len().min(20)]
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
            let slots: Vec<usize> = draining.iter().map(|&v| self.vms.slot[v]).collect();
            problems.push(format!(
                "{} root context(s) answered on_done with false and never called proxy_done (slots {slots:?})",
                draining.len()
            ));
        }
        let pending: Vec<usize> = self
            .requests
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

    /// Whether every request has its final outcome.
    pub(super) fn all_final(&self) -> bool {
        self.requests
            .outcomes
            .iter()
            .all(|o| o.fin != Final::Pending)
    }
}
