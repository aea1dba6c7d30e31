//! `load-aware-scorer` (llm-d-router): the engine's waiting queue against a threshold,
//! capped at 0.5 as the reference — `0.5` for an empty queue, `0.5 × (1 − q/T)` below
//! `T = threshold` (default 128), `0` at or beyond it. The queue is the best estimate we
//! have now ([`crate::endpoint::Candidate::waiting_estimate`]: the scraped queue, or the
//! requests this gateway sent there since that the engine could not report yet).
//! A `threshold` ≤ 0 is replaced by the default, as the reference.

use crate::config::{ConfigError, Params};
use crate::scheduler::{Cycle, Scorer};
use serde_json::Value;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "load-aware-scorer";
/// Default `threshold`.
pub const DEFAULT_THRESHOLD: i64 = 128;

/// The load-aware scorer.
#[derive(Debug)]
pub struct LoadAware {
    /// Queue depth at which the score reaches 0.
    pub threshold: f64,
}

impl LoadAware {
    /// The score of a queue of `waiting` requests.
    pub fn score_of(&self, waiting: u64) -> f64 {
        let w = waiting as f64;
        if waiting == 0 {
            0.5
        } else if w >= self.threshold {
            0.0
        } else {
            0.5 * (1.0 - w / self.threshold)
        }
    }

    /// Builds the scorer from its `parameters`: `threshold`.
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(Some(v), path, &["threshold"])?;
        let t = p.i64("threshold", DEFAULT_THRESHOLD)?;
        let t = if t <= 0 { DEFAULT_THRESHOLD } else { t };
        Ok(Self {
            threshold: t as f64,
        })
    }
}

impl Scorer for LoadAware {
    fn score(&self, cx: &Cycle<'_>, endpoints: &[usize]) -> Vec<f64> {
        endpoints
            .iter()
            .map(|&i| self.score_of(cx.candidate(i).map_or(0, |c| c.waiting_estimate())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::*;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn half_for_an_empty_queue_falling_to_zero_at_the_threshold() {
        let s = LoadAware::from_parameters(&json!({"threshold": 10}), "p").unwrap();
        // (waiting, running, kv)
        let c = candidates(&[(0, 3, 0.0), (5, 0, 0.0), (10, 0, 0.0), (40, 0, 0.0)]);
        let got = with_cycle(&c, &[], |cx| s.score(cx, &all(&c)));
        assert_eq!(got, vec![0.5, 0.25, 0.0, 0.0]);
        // Non-positive thresholds take the default, as the reference.
        let d = LoadAware::from_parameters(&json!({"threshold": 0}), "p").unwrap();
        assert_eq!(d.threshold, 128.0);
        assert_eq!(d.score_of(64), 0.25);
    }
}
