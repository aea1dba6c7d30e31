//! `max-score-picker`: the top N by score descending, equal scores in uniformly random
//! order. The reference shuffles every candidate, then stable-sorts; the same
//! distribution comes here from drawing only among the equal entries that reach the top
//! N: for N = 1 one draw among the equal best (none when one is best), whatever the pool
//! size.
//!
//! Knowing the requests in flight ([`Picker::pick_among`], what the scheduler calls),
//! equal scores go to the endpoint with the fewest requests in flight through this
//! gateway first, and only then at random: with stale or equal metrics a burst spreads
//! instead of piling onto one endpoint (the reference breaks ties at random only).

use crate::config::{ConfigError, Params};
use crate::rng::Rng;
use crate::scheduler::{Cycle, Picker};
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

/// A score as an integer in [`f64::total_cmp`]'s order (what [`rank`] compares), so the
/// one-pass search compares integers.
fn order(score: f64) -> i64 {
    let bits = score.to_bits() as i64;
    bits ^ (((bits >> 63) as u64) >> 1) as i64
}

/// The best entry of `entries` (`(index, score, in flight)`, read twice at most): one
/// pass for the best rank, the first entry holding it and how many share it; when more
/// than one, one draw among those and one pass to find the drawn one. The `r`-th of the
/// equal best in candidate order for the draw `r`: what [`MaxScore::ranked`] puts first
/// with the same draw.
fn best(entries: impl Iterator<Item = (usize, f64, u64)> + Clone, rng: &mut Rng) -> Option<usize> {
    // (score's order, in flight, first such entry): higher score, then fewer in flight.
    let mut top: Option<(i64, u64, usize)> = None;
    let mut ties = 0usize;
    for (i, s, l) in entries.clone() {
        let s = order(s);
        match top {
            Some((ts, tl, _)) if s < ts || (s == ts && l > tl) => {}
            Some((ts, tl, _)) if s == ts && l == tl => ties += 1,
            _ => {
                top = Some((s, l, i));
                ties = 1;
            }
        }
    }
    let (ts, tl, first) = top?;
    if ties == 1 {
        return Some(first);
    }
    let mut r = rng.below(ties);
    for (i, s, l) in entries {
        if order(s) == ts && l == tl {
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
        entries: impl Iterator<Item = (usize, f64, u64)>,
        rng: &mut Rng,
    ) -> Vec<usize> {
        let mut entries: Vec<(usize, f64, u64)> = entries.collect();
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

    fn pick_among(
        &self,
        cx: &Cycle<'_>,
        endpoints: &[usize],
        scores: &[f64],
        rng: &mut Rng,
    ) -> Vec<usize> {
        let entries = endpoints
            .iter()
            .zip(scores)
            .map(|(&i, &s)| (i, s, cx.candidate(i).map_or(0, |c| c.in_flight)));
        self.choose(entries, rng)
    }
}

impl MaxScore {
    /// [`Picker::pick`] knowing each entry's requests in flight (same order; 0 where
    /// missing).
    pub fn pick_with_load(
        &self,
        scored: Vec<(usize, f64)>,
        in_flight: &[u64],
        rng: &mut Rng,
    ) -> Vec<usize> {
        let load = |k: usize| in_flight.get(k).copied().unwrap_or(0);
        let entries = scored
            .iter()
            .enumerate()
            .map(|(k, &(i, s))| (i, s, load(k)));
        self.choose(entries, rng)
    }

    /// The top `max_endpoints` of `entries` (`(index, score, in flight)`).
    fn choose(
        &self,
        entries: impl Iterator<Item = (usize, f64, u64)> + Clone,
        rng: &mut Rng,
    ) -> Vec<usize> {
        if self.max_endpoints == 1 {
            return best(entries, rng).into_iter().collect();
        }
        self.ranked(entries, rng)
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
