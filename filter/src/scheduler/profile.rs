//! A scheduling profile: filters in order (stopping when none is left), then the weighted
//! scorers (each clamped to [0, 1], times its weight, summed), then the picker.

use super::{Cycle, Filter, Picker, Probe, ProfileResult, ScheduleError, Scorer};
use crate::rng::Rng;
use std::rc::Rc;

/// A plugin instance with its configured name and type.
pub struct Named<T: ?Sized> {
    /// Configured name.
    pub name: String,
    /// Registered type.
    pub type_name: String,
    /// The plugin.
    pub plugin: Rc<T>,
}

/// A scorer and its weight.
pub struct WeightedScorer {
    /// Configured name.
    pub name: String,
    /// Registered type.
    pub type_name: String,
    /// The scorer.
    pub plugin: Rc<dyn Scorer>,
    /// Its weight.
    pub weight: f64,
}

/// A configured profile.
pub struct Profile {
    /// Its name.
    pub name: String,
    /// Filters, in order.
    pub filters: Vec<Named<dyn Filter>>,
    /// Weighted scorers.
    pub scorers: Vec<WeightedScorer>,
    /// The picker.
    pub picker: Named<dyn Picker>,
}

impl Profile {
    /// Total weighted score of each endpoint in `endpoints`.
    pub fn scores(&self, cx: &Cycle<'_>, endpoints: &[usize], probe: &mut Probe<'_>) -> Vec<f64> {
        let mut total = vec![0.0; endpoints.len()];
        for s in &self.scorers {
            let start = probe.now();
            s.plugin.add_weighted(cx, endpoints, s.weight, &mut total);
            probe.record("Scorer", &s.type_name, &s.name, start);
        }
        total
    }

    /// Runs the profile over every candidate of `cx`.
    pub fn run(
        &self,
        cx: &Cycle<'_>,
        rng: &mut Rng,
        probe: &mut Probe<'_>,
    ) -> Result<ProfileResult, ScheduleError> {
        let mut endpoints: Vec<usize> = (0..cx.candidates.len()).collect();
        for f in &self.filters {
            let start = probe.now();
            endpoints = f.plugin.filter(cx, endpoints, rng);
            probe.record("Filter", &f.type_name, &f.name, start);
            if endpoints.is_empty() {
                break;
            }
        }
        if endpoints.is_empty() {
            return Err(ScheduleError::NoEndpoints {
                profile: self.name.clone(),
            });
        }
        let totals = self.scores(cx, &endpoints, probe);
        let start = probe.now();
        let targets = self.picker.plugin.pick_among(cx, &endpoints, &totals, rng);
        probe.record("Picker", &self.picker.type_name, &self.picker.name, start);
        if targets.is_empty() {
            return Err(ScheduleError::NoEndpoints {
                profile: self.name.clone(),
            });
        }
        Ok(ProfileResult {
            profile: self.name.clone(),
            targets,
        })
    }
}
