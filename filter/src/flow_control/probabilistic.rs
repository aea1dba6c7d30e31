//! `probabilistic-admitter` (llm-d-router #959): sheds sheddable requests (priority < 0)
//! with a probability that rises steeply with the pool's saturation, instead of the
//! all-or-nothing gate; requests of priority ≥ 0 always pass.
//!
//! `saturation` = mean over the request's candidates of
//! `max(waiting / queueDepthThreshold, kv / kvCacheUtilThreshold)` (an endpoint never
//! scraped counts 1.0); `p = min(saturation^power × k, 1)`. Defaults as the reference:
//! 5, 0.8, 5.0, 300 (all sheddable traffic refused from saturation ≈ 0.34). It runs when
//! the request is scheduled (after flow control released it, with the candidates of that
//! moment); a refused request gets 429. No candidates: admitted (the pick answers 503).

use crate::config::validate::err;
use crate::config::{ConfigError, Params};
use crate::endpoint::Candidate;
use serde_json::Value;

/// The type name.
pub const TYPE: &str = "probabilistic-admitter";

/// The admitter's parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Probabilistic {
    /// Waiting requests at which an endpoint's contribution is 1.
    pub queue_depth_threshold: f64,
    /// KV-cache usage at which an endpoint's contribution is 1.
    pub kv_cache_util_threshold: f64,
    /// Steepness.
    pub power: f64,
    /// Scale.
    pub k: f64,
}

impl Probabilistic {
    /// Reads the parameters.
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(
            Some(v),
            path,
            &["queueDepthThreshold", "kvCacheUtilThreshold", "power", "k"],
        )?;
        let positive = |name: &str, default: f64| -> Result<f64, ConfigError> {
            let x = p.f64(name, default)?;
            if x <= 0.0 {
                return Err(err(&p.path(name), format!("must be positive, got {x}")));
            }
            Ok(x)
        };
        let kv = positive("kvCacheUtilThreshold", 0.8)?;
        if kv > 1.0 {
            return Err(err(
                &p.path("kvCacheUtilThreshold"),
                "must be at most 1 (a fraction of the cache)",
            ));
        }
        Ok(Self {
            queue_depth_threshold: positive("queueDepthThreshold", 5.0)?,
            kv_cache_util_threshold: kv,
            power: positive("power", 5.0)?,
            k: positive("k", 300.0)?,
        })
    }

    /// The pool's saturation over `candidates` (0 when there are none).
    pub fn saturation(&self, candidates: &[Candidate]) -> f64 {
        if candidates.is_empty() {
            return 0.0;
        }
        let sum: f64 = candidates
            .iter()
            .map(|c| {
                if c.metrics.updated_ms.is_none() {
                    return 1.0;
                }
                let q = c.metrics.waiting as f64 / self.queue_depth_threshold;
                let kv = c.metrics.kv_usage / self.kv_cache_util_threshold;
                if q > kv {
                    q
                } else {
                    kv
                }
            })
            .sum();
        sum / candidates.len() as f64
    }

    /// The probability of shedding a sheddable request at `saturation`.
    pub fn shed_probability(&self, saturation: f64) -> f64 {
        let p = saturation.powf(self.power) * self.k;
        if p >= 1.0 {
            1.0
        } else if p > 0.0 {
            p
        } else {
            0.0
        }
    }

    /// Whether a request of `priority` is shed; `draw` is uniform in [0, 1).
    pub fn sheds(&self, priority: i32, candidates: &[Candidate], draw: f64) -> bool {
        priority < 0
            && !candidates.is_empty()
            && draw < self.shed_probability(self.saturation(candidates))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::Metrics;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn cand(waiting: u64, kv: f64) -> Candidate {
        Candidate {
            metrics: Metrics {
                waiting,
                kv_usage: kv,
                updated_ms: Some(0),
                ..Metrics::default()
            },
            ..Candidate::new("10.0.0.1:8000")
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_reference_curve() {
        let a = Probabilistic::from_parameters(&Value::Null, "p").unwrap();
        // Idle pool: nothing shed.
        assert_eq!(a.shed_probability(a.saturation(&[cand(0, 0.0)])), 0.0);
        // 0.15 → about 2.3 %, 0.34 and above → all.
        let p = a.shed_probability(0.15);
        assert!((p - 0.0228).abs() < 0.001, "{p}");
        assert_eq!(a.shed_probability(0.35), 1.0);
        // Saturation: mean of max(queue/5, kv/0.8); a never-scraped endpoint counts 1.
        let s = a.saturation(&[cand(1, 0.4), cand(0, 0.0), Candidate::new("x:1")]);
        assert!((s - (0.5 + 0.0 + 1.0) / 3.0).abs() < 1e-9, "{s}");
        // Priority ≥ 0 is never shed; sheddable is, at a full pool, whatever the draw.
        let full = [cand(50, 0.9)];
        assert!(!a.sheds(0, &full, 0.0));
        assert!(a.sheds(-1, &full, 0.999));
        assert!(!a.sheds(-1, &[], 0.0));
        let e = Probabilistic::from_parameters(&json!({"power": 0}), "p").unwrap_err();
        assert_eq!(e.path, "p.power");
    }
}
