//! `max-score-picker`: shuffles, then stable-sorts by score descending and takes the top
//! N, so equal best scores are chosen uniformly at random.

use crate::rng::Rng;
use crate::scheduler::Picker;

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
}
