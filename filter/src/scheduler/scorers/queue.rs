//! `queue-scorer` (also registered as `queue-depth-scorer`): min-max over the candidates
//! of the engine's waiting queue, `(maxQ − q)/(maxQ − minQ)`; all equal → 1.0.
//!
//! `q` is [`Candidate::waiting_estimate`](crate::scheduler::Candidate::waiting_estimate):
//! the scraped `num_requests_waiting`, or the requests this gateway has in flight there
//! beyond the scraped `num_requests_running` when that is more (dispatches since the last
//! scrape). A deliberate difference from the reference, which reads only the scrape.

use super::{lower_is_better_each, weigh};
use crate::config::{ConfigError, Params};
use crate::scheduler::{Cycle, Scorer};
use serde_json::Value;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "queue-scorer";
/// Another name the reference accepts for it.
pub const ALIAS: &str = "queue-depth-scorer";

/// The queue scorer.
#[derive(Debug, Default)]
pub struct Queue;

impl Scorer for Queue {
    fn score(&self, cx: &Cycle<'_>, endpoints: &[usize]) -> Vec<f64> {
        Self::scores(cx, endpoints).collect()
    }

    fn add_weighted(&self, cx: &Cycle<'_>, endpoints: &[usize], weight: f64, totals: &mut [f64]) {
        weigh(totals, weight, Self::scores(cx, endpoints));
    }
}

impl Queue {
    /// The score of each entry of `endpoints`, in order.
    fn scores<'a>(cx: &'a Cycle<'_>, endpoints: &'a [usize]) -> impl Iterator<Item = f64> + 'a {
        let q = endpoints
            .iter()
            .map(|&i| cx.candidate(i).map_or(0.0, |c| c.waiting_estimate() as f64));
        lower_is_better_each(q)
    }

    /// Builds the scorer from its `parameters` (it takes none).
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        Params::new(Some(v), path, &[])?;
        Ok(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn min_max_normalised_queue_depth() {
        let c = candidates(&[(2, 0, 0.0), (10, 0, 0.0), (4, 0, 0.0)]);
        let s = with_cycle(&c, &[], |cx| Queue.score(cx, &all(&c)));
        // (10-2)/8 = 1, (10-10)/8 = 0, (10-4)/8 = 0.75
        assert_eq!(s, vec![1.0, 0.0, 0.75]);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn dispatches_since_the_last_scrape_count_as_waiting() {
        // Scraped: both idle. Since then this gateway sent 3 requests to the first.
        let mut c = candidates(&[(0, 0, 0.0), (0, 0, 0.0), (0, 2, 0.0)]);
        c[0].in_flight = 3;
        c[2].in_flight = 2; // the engine already shows these two running
        assert_eq!(c[0].waiting_estimate(), 3);
        assert_eq!(c[2].waiting_estimate(), 0);
        let s = with_cycle(&c, &[], |cx| Queue.score(cx, &all(&c)));
        assert_eq!(s, vec![0.0, 1.0, 1.0]);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn equal_queues_all_score_one() {
        let c = candidates(&[(3, 0, 0.0), (3, 0, 0.0)]);
        let s = with_cycle(&c, &[], |cx| Queue.score(cx, &all(&c)));
        assert_eq!(s, vec![1.0, 1.0]);
    }
}
