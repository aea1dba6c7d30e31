//! `weighted-random-picker`: A-Res weighted sampling without replacement. Each endpoint
//! gets `key = U^(1/score)` (U uniform in (0,1), 0 replaced by 1e-10; score ≤ 0 → key 0);
//! the top N keys win. When every score is ≤ 0 it behaves as the random picker. Scores
//! are the weighted sums, so they may exceed 1.

use super::random::Random;
use crate::config::{ConfigError, Params};
use crate::rng::Rng;
use crate::scheduler::Picker;
use serde_json::Value;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "weighted-random-picker";

/// The weighted random picker.
#[derive(Debug)]
pub struct WeightedRandom {
    /// `maxNumOfEndpoints`.
    pub max_endpoints: usize,
}

impl Picker for WeightedRandom {
    fn pick(&self, scored: Vec<(usize, f64)>, rng: &mut Rng) -> Vec<usize> {
        if scored.iter().all(|(_, s)| *s <= 0.0) {
            return Random {
                max_endpoints: self.max_endpoints,
            }
            .pick(scored, rng);
        }
        let mut keyed: Vec<(usize, f64)> = scored
            .into_iter()
            .map(|(i, s)| {
                let mut u = rng.next_f64();
                if u == 0.0 {
                    u = 1e-10;
                }
                let key = if s > 0.0 { u.powf(1.0 / s) } else { 0.0 };
                (i, key)
            })
            .collect();
        keyed.sort_by(|a, b| b.1.total_cmp(&a.1));
        keyed
            .into_iter()
            .take(self.max_endpoints)
            .map(|(i, _)| i)
            .collect()
    }
}

impl WeightedRandom {
    /// Builds the picker from its `parameters`: `maxNumOfEndpoints` (default 1).
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(Some(v), path, &["maxNumOfEndpoints"])?;
        Ok(Self {
            max_endpoints: super::max_endpoints(p.i64("maxNumOfEndpoints", 1)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn picks_in_proportion_to_score() {
        let p = WeightedRandom { max_endpoints: 1 };
        let mut rng = Rng::new(9);
        let mut counts = [0u32; 3];
        let n = 20_000;
        for _ in 0..n {
            counts[p.pick(vec![(0, 3.0), (1, 1.0), (2, 0.0)], &mut rng)[0]] += 1;
        }
        // P(0) = 3/4, P(1) = 1/4, P(2) = 0.
        assert_eq!(counts[2], 0);
        let share = f64::from(counts[0]) / f64::from(n);
        assert!((share - 0.75).abs() < 0.02, "{counts:?}");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn all_zero_scores_fall_back_to_random() {
        let p = WeightedRandom { max_endpoints: 2 };
        let mut rng = Rng::new(1);
        let got = p.pick(vec![(0, 0.0), (1, 0.0), (2, 0.0)], &mut rng);
        assert_eq!(got.len(), 2);
    }
}
