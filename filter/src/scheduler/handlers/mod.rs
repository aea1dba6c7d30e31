//! Profile handlers: which profiles run for a request and how their results combine.
//!
//! * [`single`] — `single-profile-handler`: the one profile is the primary.
//! * [`pd`] — `disagg-profile-handler`: decode (primary) then, if the decider approves,
//!   prefill; the prefill endpoint goes in `x-prefiller-host-port`.
//! * [`slo_aware`] — `slo-aware-profile-handler`: the SLO profile for requests that ask
//!   for prediction-based scheduling, the default one for the others.

pub mod pd;
pub mod single;
pub mod slo_aware;

use super::{Cycle, Probe, ProfileResult, ScheduleError, Scheduler};
use crate::rng::Rng;

/// What a handler produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The primary profile's result.
    pub primary: ProfileResult,
    /// The prefill endpoint, when disaggregated.
    pub prefill: Option<usize>,
    /// Whether disaggregation was decided (even if no prefill endpoint was found).
    pub disaggregated: bool,
    /// The encode endpoints, when the encode stage ran (E/P/D).
    pub encoders: Vec<usize>,
}

/// The configured handler.
#[derive(Debug, Clone, PartialEq)]
pub enum Handler {
    /// `single-profile-handler`.
    Single(single::Single),
    /// `disagg-profile-handler`.
    Disagg(pd::Disagg),
    /// `slo-aware-profile-handler`.
    SloAware(slo_aware::SloAware),
}

impl Handler {
    /// Runs the profiles for one request.
    pub fn run(
        &self,
        scheduler: &Scheduler,
        cx: &Cycle<'_>,
        rng: &mut Rng,
        probe: &mut Probe<'_>,
    ) -> Result<Outcome, ScheduleError> {
        match self {
            Handler::Single(h) => h.run(scheduler, cx, rng, probe),
            Handler::Disagg(h) => h.run(scheduler, cx, rng, probe),
            Handler::SloAware(h) => h.run(scheduler, cx, rng, probe),
        }
    }
}
