//! `max-score-picker`: shuffles, then stable-sorts by score descending and takes the top
//! N, so equal best scores are chosen uniformly at random.
//!
//! Knowing the requests in flight ([`Picker::pick_with_load`], what the scheduler calls),
//! equal scores go to the endpoint with the fewest requests in flight through this
//! gateway first, and only then at random: with stale or equal metrics a burst spreads
//! instead of piling onto one endpoint (the reference breaks ties at random only).

use crate::config::{ConfigError, Params};
use crate::rng::Rng;
use crate::scheduler::Picker;
use serde_json::Value;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "max-score-picker";

/// The max-score picker.
#[derive(Debug)]
pub struct MaxScore {
    /// `maxNumOfEndpoints`.
    pub max_endpoints: usize,
}

impl Picker for MaxScore {
    fn pick(&self, mut scored: Vec<(usize, f64)>, rng: &mut Rng) -> Vec<usize> {
        rng.shuffle(&mut scored);
        scored.sort_by(|a, b| b.1.total_cmp(&a.1));
        scored
            .into_iter()
            .take(self.max_endpoints)
            .map(|(i, _)| i)
            .collect()
    }

    fn pick_with_load(
        &self,
        scored: Vec<(usize, f64)>,
        in_flight: &[u64],
        rng: &mut Rng,
    ) -> Vec<usize> {
        let mut entries: Vec<(usize, f64, u64)> = scored
            .into_iter()
            .enumerate()
            .map(|(k, (i, s))| (i, s, in_flight.get(k).copied().unwrap_or(0)))
            .collect();
        rng.shuffle(&mut entries);
        let order =
            |a: &(usize, f64, u64), b: &(usize, f64, u64)| b.1.total_cmp(&a.1).then(a.2.cmp(&b.2));
        if self.max_endpoints == 1 {
            // The first of the best in shuffled order: what the stable sort puts first,
            // in one pass.
            let mut best: Option<&(usize, f64, u64)> = None;
            for e in &entries {
                if best.is_none_or(|b| order(e, b).is_lt()) {
                    best = Some(e);
                }
            }
            return best.map(|(i, _, _)| *i).into_iter().collect();
        }
        entries.sort_by(order);
        entries
            .into_iter()
            .take(self.max_endpoints)
            .map(|(i, _, _)| i)
            .collect()
    }
}

impl MaxScore {
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
    fn highest_score_wins_and_fallbacks_follow_in_order() {
        let p = MaxScore { max_endpoints: 3 };
        let mut rng = Rng::new(1);
        let got = p.pick(vec![(0, 0.5), (1, 2.1), (2, 1.0), (3, 0.1)], &mut rng);
        assert_eq!(got, vec![1, 2, 0]);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn ties_go_to_the_fewest_in_flight_first() {
        let p = MaxScore { max_endpoints: 3 };
        let mut rng = Rng::new(4);
        for _ in 0..20 {
            let got = p.pick_with_load(
                vec![(0, 1.0), (1, 1.0), (2, 1.0), (3, 2.0)],
                &[5, 2, 9, 7],
                &mut rng,
            );
            // The best score wins whatever its load; then the tie by load.
            assert_eq!(got, vec![3, 1, 0]);
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn ties_are_broken_uniformly() {
        let p = MaxScore { max_endpoints: 1 };
        let mut rng = Rng::new(42);
        let mut counts = [0u32; 3];
        for _ in 0..3000 {
            let got = p.pick(vec![(0, 1.0), (1, 1.0), (2, 0.5)], &mut rng);
            counts[got[0]] += 1;
        }
        assert_eq!(counts[2], 0);
        assert!(counts[0] > 1300 && counts[1] > 1300, "{counts:?}");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_one_endpoint_picked_is_the_first_of_the_list_picked_with_the_same_draws() {
        let (one, all) = (MaxScore { max_endpoints: 1 }, MaxScore { max_endpoints: 8 });
        let scored: Vec<(usize, f64)> = (0..8).map(|i| (i, f64::from(i as u32 % 3))).collect();
        let loads = [3, 1, 1, 0, 2, 1, 0, 1];
        let mut spread = [0u32; 8];
        for seed in 0..200 {
            let first = one.pick_with_load(scored.clone(), &loads, &mut Rng::new(seed));
            let list = all.pick_with_load(scored.clone(), &loads, &mut Rng::new(seed));
            assert_eq!(first[..], list[..1], "seed {seed}");
            spread[first[0]] += 1;
        }
        // Score 2: endpoints 2 and 5, as loaded as each other: either, at random.
        assert_eq!(spread[2] + spread[5], 200, "{spread:?}");
        assert!(spread[2] > 50 && spread[5] > 50, "{spread:?}");
    }
}
