//! `prefix-cache-affinity-filter`: keeps only the "sticky" endpoints, those whose prefix
//! match `matched/total ≥ affinityThreshold`, so a conversation stays where its KV cache is.
//!
//! * ≤ 1 endpoint, a threshold ≤ 0, or an exploration draw (`explorationProbability`):
//!   every endpoint is kept;
//! * no sticky endpoint: every endpoint is kept;
//! * **TTFT load gate**: if `maxTTFTPenaltyMs > 0` and non-sticky endpoints exist, the best
//!   estimated TTFT among sticky endpoints is compared with the best among the others; if
//!   it is worse by more than the penalty, stickiness is broken (everything is kept).
//!
//! The TTFT estimate is the router's `ttftSource`: `prefillThroughput` (default), tokens
//! in flight to the endpoint ÷ `peakPrefillThroughput` (tokens/s) × 1000 ms; or
//! `latencyPredictor`, the latency predictor's TTFT for the endpoint (needs a
//! `predicted-latency-producer`; before the predictor is ready, and for endpoints without
//! a prediction, the throughput estimate). (GIE's version reads latency predictions
//! only, and without them its gate does nothing; this one always works.)
//! Defaults are GIE's: threshold 0.80, exploration 0.01, penalty 5000 ms.

use crate::config::validate::err;
use crate::config::{ConfigError, Params};
use crate::rng::Rng;
use crate::scheduler::{Cycle, Filter};
use serde_json::Value;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "prefix-cache-affinity-filter";

/// Default `peakPrefillThroughput` (tokens/s), the router's calibration.
pub const DEFAULT_PEAK_PREFILL_THROUGHPUT: f64 = 15_928.0;

/// The prefix-cache affinity filter.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixAffinity {
    /// `affinityThreshold` (≤ 0 disables the filter).
    pub threshold: f64,
    /// `explorationProbability`.
    pub exploration: f64,
    /// `maxTTFTPenaltyMs` (0: always stick).
    pub max_ttft_penalty_ms: f64,
    /// `peakPrefillThroughput`, tokens/s.
    pub peak_prefill_throughput: f64,
    /// `ttftSource: latencyPredictor`.
    pub use_predictor: bool,
}

impl Default for PrefixAffinity {
    fn default() -> Self {
        Self {
            threshold: 0.80,
            exploration: 0.01,
            max_ttft_penalty_ms: 5000.0,
            peak_prefill_throughput: DEFAULT_PEAK_PREFILL_THROUGHPUT,
            use_predictor: false,
        }
    }
}

impl PrefixAffinity {
    fn ttft_ms(&self, cx: &Cycle<'_>, i: usize) -> f64 {
        if self.use_predictor {
            if let Some(p) = cx.prediction(i) {
                return p.ttft_ms;
            }
        }
        let tokens = cx.candidate(i).map_or(0, |c| c.in_flight_tokens) as f64;
        tokens / self.peak_prefill_throughput * 1000.0
    }
}

impl Filter for PrefixAffinity {
    fn filter(&self, cx: &Cycle<'_>, endpoints: Vec<usize>, rng: &mut Rng) -> Vec<usize> {
        if endpoints.len() <= 1 || self.threshold <= 0.0 {
            return endpoints;
        }
        if self.exploration > 0.0 && rng.next_f64() < self.exploration {
            return endpoints;
        }
        let (sticky, rest): (Vec<usize>, Vec<usize>) = endpoints
            .iter()
            .partition(|&&i| cx.prefix_affinity(i).ratio() >= self.threshold);
        if sticky.is_empty() {
            return endpoints;
        }
        if self.max_ttft_penalty_ms > 0.0 && !rest.is_empty() {
            let best = |set: &[usize]| {
                set.iter()
                    .map(|&i| self.ttft_ms(cx, i))
                    .fold(f64::INFINITY, f64::min)
            };
            if best(&sticky) - best(&rest) > self.max_ttft_penalty_ms {
                return endpoints;
            }
        }
        sticky
    }
}

impl PrefixAffinity {
    /// Builds the filter from its `parameters` (defaults as in [`PrefixAffinity::default`]).
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(
            Some(v),
            path,
            &[
                "affinityThreshold",
                "explorationProbability",
                "maxTTFTPenaltyMs",
                "ttftSource",
                "peakPrefillThroughput",
            ],
        )?;
        let threshold = p.f64("affinityThreshold", 0.80)?;
        if threshold > 1.0 {
            return Err(err(
                &p.path("affinityThreshold"),
                format!("must be at most 1.0, got {threshold}"),
            ));
        }
        let use_predictor = match p.string("ttftSource", "prefillThroughput")?.as_str() {
            "prefillThroughput" => false,
            "latencyPredictor" => true,
            other => {
                return Err(err(
                    &p.path("ttftSource"),
                    format!(
                    "\"{other}\" is not a TTFT source; use prefillThroughput or latencyPredictor"
                ),
                ))
            }
        };
        let peak = p.f64("peakPrefillThroughput", DEFAULT_PEAK_PREFILL_THROUGHPUT)?;
        if peak <= 0.0 {
            return Err(err(&p.path("peakPrefillThroughput"), "must be positive"));
        }
        Ok(Self {
            threshold,
            exploration: p.unit("explorationProbability", 0.01)?,
            max_ttft_penalty_ms: p.non_negative("maxTTFTPenaltyMs", 5000.0)?,
            peak_prefill_throughput: peak,
            use_predictor,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prefix::index::PrefixMatch;
    use crate::scheduler::testing::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn m(matched: u32) -> PrefixMatch {
        PrefixMatch {
            matched,
            total: 10,
            block_size_tokens: 16,
        }
    }

    fn no_explore() -> PrefixAffinity {
        PrefixAffinity {
            exploration: 0.0,
            ..PrefixAffinity::default()
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn keeps_only_sticky_endpoints() {
        let c = candidates(&[(0, 0, 0.0); 3]);
        let p = [m(9), m(8), m(7)];
        let mut rng = Rng::new(0);
        let got = with_cycle(&c, &p, |cx| no_explore().filter(cx, all(&c), &mut rng));
        assert_eq!(
            got,
            vec![0, 1],
            "0.9 and 0.8 reach the 0.8 threshold, 0.7 does not"
        );
        let none = [m(1), m(2), m(3)];
        let got = with_cycle(&c, &none, |cx| no_explore().filter(cx, all(&c), &mut rng));
        assert_eq!(got, vec![0, 1, 2], "no sticky endpoint: keep all");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_ttft_gate_breaks_stickiness_when_sticky_endpoints_are_overloaded() {
        let mut c = candidates(&[(0, 0, 0.0); 2]);
        let p = [m(10), m(0)];
        let mut rng = Rng::new(0);
        // 15,928 tokens in flight = 1 s estimated TTFT: within the 5 s penalty.
        c[0].in_flight_tokens = 15_928;
        let got = with_cycle(&c, &p, |cx| no_explore().filter(cx, all(&c), &mut rng));
        assert_eq!(got, vec![0]);
        // 10 s behind the idle endpoint: more than 5 s, stickiness broken.
        c[0].in_flight_tokens = 159_280;
        let got = with_cycle(&c, &p, |cx| no_explore().filter(cx, all(&c), &mut rng));
        assert_eq!(got, vec![0, 1]);
        // A penalty of 0 always sticks.
        let always = PrefixAffinity {
            max_ttft_penalty_ms: 0.0,
            ..no_explore()
        };
        let got = with_cycle(&c, &p, |cx| always.filter(cx, all(&c), &mut rng));
        assert_eq!(got, vec![0]);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn exploration_keeps_everything_at_its_rate() {
        let c = candidates(&[(0, 0, 0.0); 2]);
        let p = [m(10), m(0)];
        let f = PrefixAffinity {
            exploration: 0.25,
            ..PrefixAffinity::default()
        };
        let mut rng = Rng::new(5);
        let n = 8000;
        let explored = (0..n)
            .filter(|_| with_cycle(&c, &p, |cx| f.filter(cx, all(&c), &mut rng)).len() == 2)
            .count();
        let rate = explored as f64 / f64::from(n);
        assert!((rate - 0.25).abs() < 0.02, "{rate}");
    }
}
