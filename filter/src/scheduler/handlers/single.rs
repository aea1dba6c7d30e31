//! `single-profile-handler`: runs the one configured profile; its result is the primary.

use super::{Outcome, Scheduler};
use crate::rng::Rng;
use crate::scheduler::{Cycle, Probe, ScheduleError};

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "single-profile-handler";

/// The single-profile handler.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Single;

impl Single {
    /// Runs the scheduler's first (only) profile.
    pub fn run(
        &self,
        scheduler: &Scheduler,
        cx: &Cycle<'_>,
        rng: &mut Rng,
        probe: &mut Probe<'_>,
    ) -> Result<Outcome, ScheduleError> {
        let Some(profile) = scheduler.profiles.first() else {
            return Err(ScheduleError::NoCandidates);
        };
        let primary = profile.run(cx, rng, probe)?;
        Ok(Outcome {
            primary,
            prefill: None,
            disaggregated: false,
        })
    }
}
