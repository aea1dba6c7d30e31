//! `token-load-scorer`: load = estimated tokens in flight to the endpoint (all workers);
//! a load ≤ 0 scores 1, else `1 − min(load, T)/T` with `T = queueThresholdTokens`
//! (default 4,194,304; a value ≤ 0 resets to the default).

use crate::config::{ConfigError, Params};
use crate::scheduler::{Cycle, Scorer};
use serde_json::Value;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "token-load-scorer";

/// Default `queueThresholdTokens`: 128 requests × 32K tokens.
pub const DEFAULT_QUEUE_THRESHOLD_TOKENS: i64 = 4_194_304;

/// The token-load scorer.
#[derive(Debug)]
pub struct TokenLoad {
    /// `queueThresholdTokens`.
    pub threshold: u64,
}

impl TokenLoad {
    /// With the configured threshold (≤ 0 means the default).
    pub fn new(threshold: i64) -> Self {
        let t = if threshold <= 0 {
            DEFAULT_QUEUE_THRESHOLD_TOKENS
        } else {
            threshold
        };
        Self {
            threshold: t.unsigned_abs(),
        }
    }
}

impl Scorer for TokenLoad {
    fn score(&self, cx: &Cycle<'_>, endpoints: &[usize]) -> Vec<f64> {
        let t = self.threshold as f64;
        endpoints
            .iter()
            .map(|&i| {
                let load = cx.candidate(i).map_or(0, |c| c.in_flight_tokens);
                if load == 0 {
                    1.0
                } else {
                    1.0 - (load as f64).min(t) / t
                }
            })
            .collect()
    }
}

impl TokenLoad {
    /// Builds the scorer from its `parameters`: `queueThresholdTokens` (0 or absent: the
    /// default).
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(Some(v), path, &["queueThresholdTokens"])?;
        Ok(Self::new(p.i64("queueThresholdTokens", 0)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn token_load_against_the_threshold() {
        let mut c = candidates(&[(0, 0, 0.0); 3]);
        c[0].in_flight_tokens = 0;
        c[1].in_flight_tokens = 250;
        c[2].in_flight_tokens = 5000;
        let s = with_cycle(&c, &[], |cx| TokenLoad::new(1000).score(cx, &all(&c)));
        assert_eq!(s, vec![1.0, 0.75, 0.0]);
        assert_eq!(TokenLoad::new(0).threshold, 4_194_304);
        assert_eq!(TokenLoad::new(-5).threshold, 4_194_304);
    }
}
