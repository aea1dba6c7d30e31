//! The saturation detectors in their **filter** role (they act only when placed in a
//! profile).
//!
//! * `utilization-detector`: keeps an endpoint whose metrics are fresh
//!   (`now − updated ≤ metricsStalenessThreshold`), with
//!   `waiting < queueDepthThreshold·(1+headroom)` and `kv < kvCacheUtilThreshold·(1+headroom)`;
//!   if that removes every endpoint, all are kept (fail open).
//! * `concurrency-detector`: keeps an endpoint whose in-flight load (requests, or tokens
//!   in `tokens` mode) is below `int(capacity·(1+headroom))`; no fail-open.

use crate::rng::Rng;
use crate::scheduler::{Cycle, Filter};

/// `utilization-detector` parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Utilization {
    /// `queueDepthThreshold` (default 5).
    pub queue_depth_threshold: f64,
    /// `kvCacheUtilThreshold` (default 0.8).
    pub kv_cache_util_threshold: f64,
    /// `metricsStalenessThreshold` in ms (default 200).
    pub staleness_ms: i64,
    /// `headroom` (default 0).
    pub headroom: f64,
}

impl Default for Utilization {
    fn default() -> Self {
        Self {
            queue_depth_threshold: 5.0,
            kv_cache_util_threshold: 0.8,
            staleness_ms: 200,
            headroom: 0.0,
        }
    }
}

impl Filter for Utilization {
    fn filter(&self, cx: &Cycle<'_>, endpoints: Vec<usize>, _rng: &mut Rng) -> Vec<usize> {
        let q = self.queue_depth_threshold * (1.0 + self.headroom);
        let kv = self.kv_cache_util_threshold * (1.0 + self.headroom);
        let now = cx.request.now_ms;
        let kept: Vec<usize> = endpoints
            .iter()
            .copied()
            .filter(|&i| {
                cx.candidate(i).is_some_and(|c| {
                    let fresh = c
                        .metrics
                        .updated_ms
                        .is_some_and(|t| now.saturating_sub(t) <= self.staleness_ms);
                    fresh && (c.metrics.waiting as f64) < q && c.metrics.kv_usage < kv
                })
            })
            .collect();
        if kept.is_empty() {
            endpoints
        } else {
            kept
        }
    }
}

/// `concurrency-detector` parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Concurrency {
    /// `concurrencyMode` is `tokens`.
    pub tokens: bool,
    /// `maxConcurrency` (default 100).
    pub max_concurrency: i64,
    /// `maxTokenConcurrency` (default 1,000,000).
    pub max_token_concurrency: i64,
    /// `headroom` (default 0).
    pub headroom: f64,
}

impl Default for Concurrency {
    fn default() -> Self {
        Self {
            tokens: false,
            max_concurrency: 100,
            max_token_concurrency: 1_000_000,
            headroom: 0.0,
        }
    }
}

impl Filter for Concurrency {
    fn filter(&self, cx: &Cycle<'_>, endpoints: Vec<usize>, _rng: &mut Rng) -> Vec<usize> {
        let cap = if self.tokens {
            self.max_token_concurrency
        } else {
            self.max_concurrency
        };
        let limit = (cap as f64 * (1.0 + self.headroom)).floor();
        endpoints
            .into_iter()
            .filter(|&i| {
                cx.candidate(i).is_some_and(|c| {
                    let load = if self.tokens {
                        c.in_flight_tokens
                    } else {
                        c.in_flight
                    };
                    (load as f64) < limit
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::*;
    use crate::scheduler::Request;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn utilization_keeps_fresh_unsaturated_endpoints_and_fails_open() {
        let mut c = candidates(&[(4, 0, 0.5), (5, 0, 0.5), (0, 0, 0.8), (0, 0, 0.1)]);
        c[3].metrics.updated_ms = Some(-1000); // stale at now = 0
        let request = Request::default();
        let cx = Cycle {
            request: &request,
            candidates: &c,
            prefix: &[],
        };
        let mut rng = Rng::new(0);
        let f = Utilization::default();
        assert_eq!(f.filter(&cx, all(&c), &mut rng), vec![0]);
        // All saturated: everything is kept.
        assert_eq!(f.filter(&cx, vec![1, 2], &mut rng), vec![1, 2]);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn concurrency_keeps_endpoints_below_the_limit_without_fail_open() {
        let mut c = candidates(&[(0, 0, 0.0); 2]);
        c[0].in_flight = 9;
        c[1].in_flight = 10;
        let f = Concurrency {
            max_concurrency: 10,
            ..Concurrency::default()
        };
        let mut rng = Rng::new(0);
        assert_eq!(
            with_cycle(&c, &[], |cx| f.filter(cx, all(&c), &mut rng)),
            vec![0]
        );
        assert!(with_cycle(&c, &[], |cx| f.filter(cx, vec![1], &mut rng)).is_empty());
    }
}
