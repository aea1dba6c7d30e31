//! `single-profile-handler`: runs the one configured profile; its result is the primary.

use super::{Outcome, Scheduler};
use crate::rng::Rng;
use crate::scheduler::{Cycle, Probe, ScheduleError};

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "single-profile-handler";
/// llm-d-router's deprecated `data-parallel-profile-handler`: one profile, as this one.
/// The reference sends the request to the pod's `primaryPort` with the chosen rank in
/// `x-data-parallel-endpoint`, for meshes that could route only to a service port; here
/// Envoy connects to the chosen rank's own `ip:port` directly (what the reference's
/// replacement, `single-profile-handler` with Istio ≥ 1.28.1, does), so `primaryPort` is
/// checked (1–65535) and not used.
pub const DATA_PARALLEL_TYPE: &str = "data-parallel-profile-handler";

/// Checks `data-parallel-profile-handler`'s parameters.
pub fn data_parallel(v: &serde_json::Value, path: &str) -> Result<(), crate::config::ConfigError> {
    let p = crate::config::Params::new(Some(v), path, &["primaryPort"])?;
    let port = p.i64("primaryPort", 8000)?;
    if !(1..=65_535).contains(&port) {
        return Err(crate::config::validate::err(
            &p.path("primaryPort"),
            "must be a port (1-65535)",
        ));
    }
    Ok(())
}

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
            encoders: Vec::new(),
        })
    }
}
