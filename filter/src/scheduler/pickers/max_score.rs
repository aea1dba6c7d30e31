//! `max-score-picker`: shuffles, then stable-sorts by score descending and takes the top
//! N, so equal best scores are chosen uniformly at random.
//!
//! Knowing the requests in flight ([`Picker::pick_with_load`], what the scheduler calls),
//! equal scores go to the endpoint with the fewest requests in flight through this
//! gateway first, and only then at random: with stale or equal metrics a burst spreads
//! instead of piling onto one endpoint (the reference breaks ties at random only).
//!
//! With one endpoint to return (the default) no shuffle is needed for the same
//! distribution: one pass finds the best and counts the entries equal to it, one draw
//! chooses among them uniformly.

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
        if self.max_endpoints == 1 {
            return best_at_random(&scored, in_flight, rng)
                .into_iter()
                .collect();
        }
        let mut entries: Vec<(usize, f64, u64)> = scored
            .into_iter()
            .enumerate()
            .map(|(k, (i, s))| (i, s, in_flight.get(k).copied().unwrap_or(0)))
            .collect();
        rng.shuffle(&mut entries);
        let order =
            |a: &(usize, f64, u64), b: &(usize, f64, u64)| b.1.total_cmp(&a.1).then(a.2.cmp(&b.2));
        entries.sort_by(order);
        entries
            .into_iter()
            .take(self.max_endpoints)
            .map(|(i, _, _)| i)
            .collect()
    }
}

/// The highest score, then the fewest in flight (`in_flight`, same order as `scored`);
/// among the entries equal on both, one uniformly at random (one draw when there are
/// several): what a shuffle followed by a stable sort puts first, in distribution.
fn best_at_random(scored: &[(usize, f64)], in_flight: &[u64], rng: &mut Rng) -> Option<usize> {
    let load = |k: usize| in_flight.get(k).copied().unwrap_or(0);
    // The best (score, load), the first entry with it, and how many share it.
    let mut best: Option<(f64, u64, usize)> = None;
    let mut ties = 0usize;
    for (k, &(i, s)) in scored.iter().enumerate() {
        let l = load(k);
        let order = best.map(|(bs, bl, _)| s.total_cmp(&bs).then(bl.cmp(&l)));
        match order {
            Some(std::cmp::Ordering::Less) => {}
            Some(std::cmp::Ordering::Equal) => ties += 1,
            _ => {
                best = Some((s, l, i));
                ties = 1;
            }
        }
    }
    let (bs, bl, first) = best?;
    if ties == 1 {
        return Some(first);
    }
    let mut nth = rng.below(ties);
    for (k, &(i, s)) in scored.iter().enumerate() {
        if s.total_cmp(&bs).is_eq() && load(k) == bl {
            if nth == 0 {
                return Some(i);
            }
            nth -= 1;
        }
    }
    None
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
    fn the_one_endpoint_picked_is_one_a_longer_list_could_start_with_uniformly() {
        let (one, all) = (MaxScore { max_endpoints: 1 }, MaxScore { max_endpoints: 8 });
        let scored: Vec<(usize, f64)> = (0..8).map(|i| (i, f64::from(i as u32 % 3))).collect();
        let loads = [3, 1, 1, 0, 2, 1, 0, 1];
        let (mut spread, mut firsts) = ([0u32; 8], [0u32; 8]);
        for seed in 0..2000 {
            let first = one.pick_with_load(scored.clone(), &loads, &mut Rng::new(seed));
            let list = all.pick_with_load(scored.clone(), &loads, &mut Rng::new(seed));
            assert_eq!(first.len(), 1);
            assert_eq!(list.len(), 8);
            spread[first[0]] += 1;
            firsts[list[0]] += 1;
        }
        // Score 2: endpoints 2 and 5, as loaded as each other: either, at random, both
        // for the one endpoint and for the head of the list.
        for counts in [spread, firsts] {
            assert_eq!(counts[2] + counts[5], 2000, "{counts:?}");
            assert!(counts[2] > 850 && counts[5] > 850, "{counts:?}");
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn one_endpoint_ties_are_uniform_over_many_equal_best() {
        let p = MaxScore { max_endpoints: 1 };
        let mut rng = Rng::new(9);
        let scored: Vec<(usize, f64)> = (0..6)
            .map(|i| (i, if i == 4 { 0.5 } else { 1.0 }))
            .collect();
        let loads = [0, 0, 1, 0, 0, 0];
        let mut counts = [0u32; 6];
        for _ in 0..4000 {
            counts[p.pick_with_load(scored.clone(), &loads, &mut rng)[0]] += 1;
        }
        // 2 carries more in flight, 4 scores less: the other four share the picks.
        assert_eq!(counts[2] + counts[4], 0, "{counts:?}");
        for i in [0, 1, 3, 5] {
            assert!((850..1150).contains(&counts[i]), "{counts:?}");
        }
        assert!(p.pick_with_load(Vec::new(), &[], &mut rng).is_empty());
    }
}
