//! `slo-headroom-tier-filter`: keeps the endpoints predicted to meet every objective
//! of the request (both headrooms ≥ 0) when there are any; endpoints without a
//! prediction count as not meeting them. When both tiers are non-empty, the other tier
//! is kept instead with probability `epsilonExploreNeg` (default 0.01), so the
//! predictor keeps seeing what happens on the endpoints it rules out. Also the
//! pass-through filter of `slo-request-tracker` when a profile lists it.

use crate::config::{ConfigError, Params};
use crate::rng::Rng;
use crate::scheduler::{Cycle, Filter};
use serde_json::Value;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "slo-headroom-tier-filter";

/// The tier filter.
#[derive(Debug, Clone, PartialEq)]
pub struct SloTier {
    /// `epsilonExploreNeg`.
    pub explore: f64,
}

impl SloTier {
    /// Builds the filter from its `parameters`.
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(Some(v), path, &["epsilonExploreNeg"])?;
        Ok(Self {
            explore: p.unit("epsilonExploreNeg", 0.01)?,
        })
    }
}

impl Filter for SloTier {
    fn filter(&self, cx: &Cycle<'_>, endpoints: Vec<usize>, rng: &mut Rng) -> Vec<usize> {
        let (positive, negative): (Vec<usize>, Vec<usize>) = endpoints
            .iter()
            .partition(|&&i| cx.prediction(i).is_some_and(|p| p.valid()));
        if positive.is_empty() || negative.is_empty() {
            return endpoints;
        }
        if rng.next_f64() < self.explore {
            negative
        } else {
            positive
        }
    }
}

/// What `slo-request-tracker` does in a profile: nothing (its work is the producer's).
#[derive(Debug, Clone, Copy, Default)]
pub struct PassThrough;

impl Filter for PassThrough {
    fn filter(&self, _cx: &Cycle<'_>, endpoints: Vec<usize>, _rng: &mut Rng) -> Vec<usize> {
        endpoints
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latency::{features::N, Estimate, Prediction};
    use crate::scheduler::testing::candidates;
    use crate::scheduler::Request;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn est(headroom: Option<f64>) -> Estimate {
        Estimate {
            x: [0.0; N],
            prediction: headroom.map(|h| Prediction {
                ttft_ms: 1.0,
                tpot_ms: None,
                ttft_headroom: h,
                tpot_headroom: 0.0,
            }),
        }
    }

    fn run(f: &SloTier, e: &[Estimate], seed: u64) -> Vec<usize> {
        let c = candidates(&vec![(0, 0, 0.0); e.len()]);
        let request = Request::default();
        let cx = Cycle {
            request: &request,
            candidates: &c,
            prefix: &[],
            prior: &[],
            rendezvous_key: None,
            estimates: e,
        };
        f.filter(&cx, (0..e.len()).collect(), &mut Rng::new(seed))
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn keeps_the_endpoints_that_fit_and_explores_the_others_rarely() {
        let e = [est(Some(5.0)), est(Some(-5.0)), est(None), est(Some(0.0))];
        let f = SloTier { explore: 0.0 };
        assert_eq!(run(&f, &e, 1), vec![0, 3]);
        let f = SloTier { explore: 0.1 };
        let explored = (0..2_000).filter(|s| run(&f, &e, *s) == vec![1, 2]).count();
        assert!((120..=280).contains(&explored), "{explored} of 2000");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn one_tier_alone_is_kept_whole() {
        let f = SloTier { explore: 0.5 };
        assert_eq!(run(&f, &[est(Some(-1.0)), est(None)], 3), vec![0, 1]);
        assert_eq!(run(&f, &[est(Some(1.0)), est(Some(2.0))], 3), vec![0, 1]);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn parameters() {
        assert_eq!(
            SloTier::from_parameters(&Value::Null, "p").unwrap().explore,
            0.01
        );
        let e = SloTier::from_parameters(&json!({"epsilonExploreNeg": 2}), "p").unwrap_err();
        assert_eq!(e.path, "p.epsilonExploreNeg");
    }
}
