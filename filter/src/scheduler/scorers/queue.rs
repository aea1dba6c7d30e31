//! `queue-scorer` (also registered as `queue-depth-scorer`): min-max over the candidates
//! of the engine's waiting queue, `(maxQ − q)/(maxQ − minQ)`; all equal → 1.0.

use super::lower_is_better;
use crate::scheduler::{Cycle, Scorer};

/// The queue scorer.
#[derive(Debug, Default)]
pub struct Queue;

impl Scorer for Queue {
    fn score(&self, cx: &Cycle<'_>, endpoints: &[usize]) -> Vec<f64> {
        let q: Vec<f64> = endpoints
            .iter()
            .map(|&i| cx.candidate(i).map_or(0.0, |c| c.metrics.waiting as f64))
            .collect();
        lower_is_better(&q)
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
    fn equal_queues_all_score_one() {
        let c = candidates(&[(3, 0, 0.0), (3, 0, 0.0)]);
        let s = with_cycle(&c, &[], |cx| Queue.score(cx, &all(&c)));
        assert_eq!(s, vec![1.0, 1.0]);
    }
}
