//! `max-score-picker`: the top N by score descending, equal scores in uniformly random
//! order. The reference shuffles every candidate, then stable-sorts; the same
//! distribution comes here from drawing only among the equal entries that reach the top
//! N: for N = 1 one draw among the equal best (none when one is best), whatever the pool
//! size.
//!
//! Knowing the requests in flight ([`Picker::pick_with_load`], what the scheduler calls),
//! equal scores go to the endpoint with the fewest requests in flight through this
//! gateway first, and only then at random: with stale or equal metrics a burst spreads
//! instead of piling onto one endpoint (the reference breaks ties at random only).

use crate::config::{ConfigError, Params};
use crate::rng::Rng;
use crate::scheduler::Picker;
use serde_json::Value;
use std::cmp::Ordering;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "max-score-picker";

/// The max-score picker.
#[derive(Debug)]
pub struct MaxScore {
    /// `maxNumOfEndpoints`.
    pub max_endpoints: usize,
}

/// `Less` when `a` (score, in flight) ranks before `b`: the higher score, then the fewer
/// requests in flight.
fn rank(a: (f64, u64), b: (f64, u64)) -> Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// The best entry: one pass for the best rank and how many share it, one draw among
/// those, one pass to find the drawn one. The `r`-th of the equal best in candidate order
/// for the draw `r`: what [`MaxScore::ranked`] puts first with the same draw.
fn best(scored: &[(usize, f64)], load: impl Fn(usize) -> u64, rng: &mut Rng) -> Option<usize> {
    let mut top: Option<(f64, u64)> = None;
    let mut ties = 0usize;
    for (k, &(_, s)) in scored.iter().enumerate() {
        let e = (s, load(k));
        match top.map(|t| rank(e, t)) {
            Some(Ordering::Greater) => {}
            Some(Ordering::Equal) => ties += 1,
            _ => {
                top = Some(e);
                ties = 1;
            }
        }
    }
    let top = top?;
    let mut r = if ties > 1 { rng.below(ties) } else { 0 };
    for (k, &(i, s)) in scored.iter().enumerate() {
        if rank((s, load(k)), top).is_eq() {
            if r == 0 {
                return Some(i);
            }
            r -= 1;
        }
    }
    None
}

impl MaxScore {
    /// The top `max_endpoints`, best first: sorted by rank (stable, so equal entries keep
    /// candidate order), then each run of equal entries reaching into the top N replaced
    /// by a random ordered sample of itself.
    fn ranked(
        &self,
        scored: &[(usize, f64)],
        load: impl Fn(usize) -> u64,
        rng: &mut Rng,
    ) -> Vec<usize> {
        let mut entries: Vec<(usize, f64, u64)> = scored
            .iter()
            .enumerate()
            .map(|(k, &(i, s))| (i, s, load(k)))
            .collect();
        let key = |e: &(usize, f64, u64)| (e.1, e.2);
        entries.sort_by(|a, b| rank(key(a), key(b)));
        let n = self.max_endpoints.min(entries.len());
        let mut placed = 0;
        for run in entries.chunk_by_mut(|a, b| rank(key(a), key(b)).is_eq()) {
            if placed >= n {
                break;
            }
            rng.shuffle_front(run, n - placed);
            placed += run.len();
        }
        entries.into_iter().take(n).map(|(i, _, _)| i).collect()
    }
}

impl Picker for MaxScore {
    fn pick(&self, scored: Vec<(usize, f64)>, rng: &mut Rng) -> Vec<usize> {
        self.pick_with_load(scored, &[], rng)
    }

    fn pick_with_load(
        &self,
        scored: Vec<(usize, f64)>,
        in_flight: &[u64],
        rng: &mut Rng,
    ) -> Vec<usize> {
        let load = |k: usize| in_flight.get(k).copied().unwrap_or(0);
        if self.max_endpoints == 1 {
            return best(&scored, load, rng).into_iter().collect();
        }
        self.ranked(&scored, load, rng)
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
    fn the_fallbacks_are_a_uniformly_random_ordered_sample_of_the_equal_scores() {
        // Endpoint 0 is best; three share the next score, so the two fallbacks are any
        // ordered pair of them (6), each about a sixth of the time; 4 never makes it.
        let p = MaxScore { max_endpoints: 3 };
        let mut rng = Rng::new(5);
        let mut pairs = std::collections::BTreeMap::new();
        for _ in 0..6000 {
            let got = p.pick(
                vec![(0, 2.0), (1, 1.0), (2, 1.0), (3, 1.0), (4, 0.5)],
                &mut rng,
            );
            assert_eq!(got.len(), 3);
            assert_eq!(got[0], 0);
            *pairs.entry((got[1], got[2])).or_insert(0u32) += 1;
        }
        assert_eq!(pairs.len(), 6, "{pairs:?}");
        assert!(pairs.values().all(|c| (850..1150).contains(c)), "{pairs:?}");
        // Asking for more than there are gives them all, best first.
        let all = MaxScore { max_endpoints: 9 }.pick(vec![(0, 0.1), (1, 0.9)], &mut rng);
        assert_eq!(all, vec![1, 0]);
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
