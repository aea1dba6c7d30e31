//! `latency-scorer` (the first design's `slo-scorer`): scores endpoints by their
//! predicted headroom against the request's objectives.
//!
//! Which endpoints score (the others get 0):
//! 1. the endpoints predicted to meet every objective (both headrooms ≥ 0), if any;
//! 2. else the idle ones (nothing in flight), scored by the composite below;
//! 3. else the least bad deficit bucket: only TPOT short, then only TTFT short, then both.
//!
//! Within the set, |headroom| is min-max normalised per dimension and blended
//! `c = ttftWeight·TTFT + tpotWeight·TPOT` (a dimension with no spread gives its weight
//! to the other). `headroomSelectionStrategy: least` scores `(⌊(1−c)·100⌋+1)/100`, so a
//! weighted random draw favours the endpoints that just fit (keeping roomy ones for
//! demanding requests); `most` scores `(⌊c·100⌋+1)/100` (spreading load). Deficit
//! buckets always use `least`: the least overloaded endpoint is favoured.
//!
//! Before the predictor is ready: the composite
//! `(kvW·(1 − kv) + queueW·(1 − q/maxQ) + prefixW·prefix) / (kvW + queueW + prefixW)`.

use crate::config::validate::err;
use crate::config::{ConfigError, Params};
use crate::latency::Prediction;
use crate::scheduler::{Cycle, Scorer};
use serde_json::Value;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "latency-scorer";
/// The first design's name for it.
pub const SLO_SCORER: &str = "slo-scorer";

/// How headroom is favoured among endpoints that fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Just enough headroom first.
    Least,
    /// Most headroom first.
    Most,
}

/// The latency scorer.
#[derive(Debug, Clone, PartialEq)]
pub struct Latency {
    /// `ttftWeight`.
    pub ttft_weight: f64,
    /// `tpotWeight`.
    pub tpot_weight: f64,
    /// `headroomSelectionStrategy`.
    pub strategy: Strategy,
    /// `compositeKVWeight`.
    pub kv_weight: f64,
    /// `compositeQueueWeight`.
    pub queue_weight: f64,
    /// `compositePrefixWeight`.
    pub prefix_weight: f64,
}

impl Default for Latency {
    fn default() -> Self {
        Self {
            ttft_weight: 0.8,
            tpot_weight: 0.2,
            strategy: Strategy::Least,
            kv_weight: 1.0,
            queue_weight: 1.0,
            prefix_weight: 1.0,
        }
    }
}

impl Latency {
    /// Builds the scorer from its `parameters`.
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(
            Some(v),
            path,
            &[
                "ttftWeight",
                "tpotWeight",
                "headroomSelectionStrategy",
                "compositeKVWeight",
                "compositeQueueWeight",
                "compositePrefixWeight",
            ],
        )?;
        let strategy = match p.string("headroomSelectionStrategy", "least")?.as_str() {
            "least" => Strategy::Least,
            "most" => Strategy::Most,
            other => {
                return Err(err(
                    &p.path("headroomSelectionStrategy"),
                    format!("\"{other}\" is not a strategy; use least or most"),
                ))
            }
        };
        Ok(Self {
            ttft_weight: p.non_negative("ttftWeight", 0.8)?,
            tpot_weight: p.non_negative("tpotWeight", 0.2)?,
            strategy,
            kv_weight: p.non_negative("compositeKVWeight", 1.0)?,
            queue_weight: p.non_negative("compositeQueueWeight", 1.0)?,
            prefix_weight: p.non_negative("compositePrefixWeight", 1.0)?,
        })
    }

    /// The composite score of each of `endpoints`.
    fn composite(&self, cx: &Cycle<'_>, endpoints: &[usize]) -> Vec<f64> {
        let queue = |i: usize| cx.candidate(i).map_or(0, |c| c.waiting_estimate()) as f64;
        let max_q = endpoints.iter().map(|&i| queue(i)).fold(0.0, f64::max);
        let total = self.kv_weight + self.queue_weight + self.prefix_weight;
        endpoints
            .iter()
            .map(|&i| {
                let kv_free = cx.candidate(i).map_or(0.0, |c| 1.0 - c.metrics.kv_usage);
                let rel_queue = if max_q > 0.0 {
                    1.0 - queue(i) / max_q
                } else {
                    1.0
                };
                let prefix = cx.prefix_match(i).ratio();
                let v = self.kv_weight * kv_free
                    + self.queue_weight * rel_queue
                    + self.prefix_weight * prefix;
                if total > 0.0 {
                    v / total
                } else {
                    0.0
                }
            })
            .collect()
    }

    /// Scores `set` (positions into `preds`) by headroom with `strategy`.
    fn by_headroom(
        &self,
        preds: &[Option<&Prediction>],
        set: &[usize],
        strategy: Strategy,
    ) -> Vec<(usize, f64)> {
        let dims: Vec<(f64, f64)> = set
            .iter()
            .filter_map(|&k| preds.get(k).copied().flatten())
            .map(|p| (p.ttft_headroom.abs(), p.tpot_headroom.abs()))
            .collect();
        let range = |f: fn(&(f64, f64)) -> f64| {
            let lo = dims.iter().map(f).fold(f64::INFINITY, f64::min);
            let hi = dims.iter().map(f).fold(f64::NEG_INFINITY, f64::max);
            (lo, hi)
        };
        let (t_lo, t_hi) = range(|d| d.0);
        let (p_lo, p_hi) = range(|d| d.1);
        let (mut a, mut b) = (self.ttft_weight, self.tpot_weight);
        if t_hi <= t_lo {
            b += a;
            a = 0.0;
        }
        if p_hi <= p_lo {
            a += b;
            b = 0.0;
        }
        let sum = a + b;
        let norm = |v: f64, lo: f64, hi: f64| if hi > lo { (v - lo) / (hi - lo) } else { 0.0 };
        set.iter()
            .zip(&dims)
            .map(|(&k, d)| {
                let c = if sum > 0.0 {
                    (a * norm(d.0, t_lo, t_hi) + b * norm(d.1, p_lo, p_hi)) / sum
                } else {
                    0.0
                };
                let w = match strategy {
                    Strategy::Least => ((1.0 - c) * 100.0).floor() + 1.0,
                    Strategy::Most => (c * 100.0).floor() + 1.0,
                };
                (k, w / 100.0)
            })
            .collect()
    }
}

impl Scorer for Latency {
    fn score(&self, cx: &Cycle<'_>, endpoints: &[usize]) -> Vec<f64> {
        let preds: Vec<Option<&Prediction>> = endpoints.iter().map(|&i| cx.prediction(i)).collect();
        if preds.iter().all(Option::is_none) {
            return self.composite(cx, endpoints);
        }
        let mut scores = vec![0.0; endpoints.len()];
        let positions = |keep: &dyn Fn(&Prediction) -> bool| -> Vec<usize> {
            preds
                .iter()
                .enumerate()
                .filter(|(_, p)| p.is_some_and(keep))
                .map(|(k, _)| k)
                .collect()
        };
        let valid = positions(&|p| p.valid());
        if !valid.is_empty() {
            for (k, s) in self.by_headroom(&preds, &valid, self.strategy) {
                if let Some(v) = scores.get_mut(k) {
                    *v = s;
                }
            }
            return scores;
        }
        let idle: Vec<usize> = endpoints
            .iter()
            .enumerate()
            .filter(|(_, &i)| cx.candidate(i).is_some_and(|c| c.in_flight == 0))
            .map(|(k, _)| k)
            .collect();
        if !idle.is_empty() {
            let chosen: Vec<usize> = idle
                .iter()
                .filter_map(|&k| endpoints.get(k).copied())
                .collect();
            for (k, s) in idle.iter().zip(self.composite(cx, &chosen)) {
                if let Some(v) = scores.get_mut(*k) {
                    // Above 0 even with a zero composite, so the draw stays among them.
                    *v = s.max(0.01);
                }
            }
            return scores;
        }
        let buckets: [&dyn Fn(&Prediction) -> bool; 3] = [
            &|p| p.ttft_headroom >= 0.0 && p.tpot_headroom < 0.0,
            &|p| p.ttft_headroom < 0.0 && p.tpot_headroom >= 0.0,
            &|p| p.ttft_headroom < 0.0 && p.tpot_headroom < 0.0,
        ];
        for keep in buckets {
            let set = positions(keep);
            if !set.is_empty() {
                for (k, s) in self.by_headroom(&preds, &set, Strategy::Least) {
                    if let Some(v) = scores.get_mut(k) {
                        *v = s;
                    }
                }
                break;
            }
        }
        scores
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latency::{features::N, Estimate};
    use crate::scheduler::testing::candidates;
    use crate::scheduler::{Candidate, Request};
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn est(p: Option<(f64, f64)>) -> Estimate {
        Estimate {
            x: [0.0; N],
            prediction: p.map(|(t, p)| Prediction {
                ttft_ms: 100.0,
                tpot_ms: Some(10.0),
                ttft_headroom: t,
                tpot_headroom: p,
            }),
        }
    }

    fn score(s: &Latency, c: &[Candidate], e: &[Estimate]) -> Vec<f64> {
        let request = Request::default();
        let cx = Cycle {
            request: &request,
            candidates: c,
            prefix: &[],
            prior: &[],
            rendezvous_key: None,
            estimates: e,
        };
        let all: Vec<usize> = (0..c.len()).collect();
        s.score(&cx, &all)
    }

    fn busy(n: usize) -> Vec<Candidate> {
        let mut c = candidates(&vec![(0, 1, 0.3); n]);
        c.iter_mut().for_each(|c| c.in_flight = 2);
        c
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn only_endpoints_that_fit_score_and_least_favours_the_tightest_fit() {
        let c = busy(3);
        let e = [
            est(Some((100.0, 0.0))),
            est(Some((10.0, 0.0))),
            est(Some((-5.0, 0.0))),
        ];
        let s = score(&Latency::default(), &c, &e);
        assert_eq!(s[2], 0.0, "the endpoint predicted to miss is not drawn");
        assert!(s[1] > s[0], "least: just enough headroom first: {s:?}");
        let most = Latency {
            strategy: Strategy::Most,
            ..Latency::default()
        };
        let s = score(&most, &c, &e);
        assert!(s[0] > s[1], "most: the roomiest first: {s:?}");
        assert_eq!(s[2], 0.0);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn with_none_fitting_idle_endpoints_come_next() {
        let mut c = busy(3);
        c[1].in_flight = 0;
        let e = [
            est(Some((-1.0, 0.0))),
            est(Some((-50.0, 0.0))),
            est(Some((-2.0, 0.0))),
        ];
        let s = score(&Latency::default(), &c, &e);
        assert!(s[1] > 0.0 && s[0] == 0.0 && s[2] == 0.0, "{s:?}");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn then_the_least_bad_deficit_bucket_and_the_least_negative_in_it() {
        let c = busy(4);
        // Only-TPOT-short endpoints (0, 1) come before a TTFT-short one (2) and a
        // both-short one (3), however small their deficits.
        let e = [
            est(Some((50.0, -30.0))),
            est(Some((50.0, -5.0))),
            est(Some((-1.0, 0.0))),
            est(Some((-1.0, -1.0))),
        ];
        let s = score(&Latency::default(), &c, &e);
        assert_eq!((s[2], s[3]), (0.0, 0.0), "{s:?}");
        assert!(s[1] > s[0] && s[0] > 0.0, "least negative first: {s:?}");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn without_predictions_the_composite_score() {
        let c = candidates(&[(4, 0, 0.9), (0, 0, 0.1)]);
        let s = score(&Latency::default(), &c, &[est(None), est(None)]);
        // (0.1 + 0 + 0)/3 and (0.9 + 1 + 0)/3
        assert!(
            (s[0] - 0.1 / 3.0).abs() < 1e-9 && (s[1] - 1.9 / 3.0).abs() < 1e-9,
            "{s:?}"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn parameters_and_refusals() {
        let s = Latency::from_parameters(
            &json!({"ttftWeight": 0.5, "tpotWeight": 0.5, "headroomSelectionStrategy": "most",
                    "compositeKVWeight": 2, "compositeQueueWeight": 0, "compositePrefixWeight": 1}),
            "p",
        )
        .unwrap();
        assert_eq!(s.strategy, Strategy::Most);
        assert_eq!(s.kv_weight, 2.0);
        let e = Latency::from_parameters(&json!({"headroomSelectionStrategy": "composite"}), "p")
            .unwrap_err();
        assert_eq!(e.path, "p.headroomSelectionStrategy");
        let e = Latency::from_parameters(&json!({"ttftWeight": -1}), "p").unwrap_err();
        assert_eq!(e.path, "p.ttftWeight");
    }
}
