//! `utilization-detector`: the unweighted mean over endpoints of each endpoint's
//! "roofline" `max(waiting / queueDepthThreshold, kv / kvCacheUtilThreshold)`; an
//! endpoint with stale or missing metrics counts 1.0, and an empty pool is 1.0.
//! `headroom` only loosens the filter role, as in the reference; `queueDepthMeanFactor`
//! (ours) only changes the filter role too.

use super::EndpointLoad;
use crate::config::quantity::parse_duration_ms;
use crate::config::{ConfigError, Params as Parameters};
use serde_json::Value;

/// Plugin type name.
pub const TYPE: &str = "utilization-detector";

/// Parameters, with the reference's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// `queueDepthThreshold` (default 5).
    pub queue_depth_threshold: f64,
    /// `kvCacheUtilThreshold` (default 0.8), in (0, 1].
    pub kv_cache_util_threshold: f64,
    /// `metricsStalenessThreshold` (default 200ms).
    pub staleness_ms: u64,
    /// `headroom` (default 0).
    pub headroom: f64,
    /// `stalenessPolicy` (llm-d): `saturated` (default, as the reference: a stale
    /// endpoint counts 1.0) or `ignore` (stale endpoints leave the mean; all stale → 1.0).
    pub ignore_stale: bool,
    /// `queueDepthMeanFactor` (ours; default 0: off). Filter role only: the queue bound
    /// is the larger of `queueDepthThreshold·(1+headroom)` and this factor × the mean
    /// scraped queue of the fresh endpoints in play, so in a pool-wide queue the filter
    /// leaves out only the endpoints queueing well above the others.
    pub queue_depth_mean_factor: f64,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            queue_depth_threshold: 5.0,
            kv_cache_util_threshold: 0.8,
            staleness_ms: 200,
            headroom: 0.0,
            ignore_stale: false,
            queue_depth_mean_factor: 0.0,
        }
    }
}

impl Params {
    /// Parses and validates the plugin parameters.
    pub fn parse(params: &Value, path: &str) -> Result<Self, ConfigError> {
        let params = Parameters::new(
            Some(params),
            path,
            &[
                "queueDepthThreshold",
                "kvCacheUtilThreshold",
                "metricsStalenessThreshold",
                "headroom",
                "stalenessPolicy",
                "queueDepthMeanFactor",
            ],
        )?;
        let err = |key: &str, reason: &str| ConfigError {
            path: params.path(key),
            reason: reason.into(),
        };
        let mut p = Params::default();
        if let Some(q) = params.number("queueDepthThreshold")? {
            if q <= 0.0 || q.fract() != 0.0 {
                return Err(err("queueDepthThreshold", "must be a positive integer"));
            }
            p.queue_depth_threshold = q;
        }
        if let Some(k) = params.number("kvCacheUtilThreshold")? {
            if !(k > 0.0 && k <= 1.0) {
                return Err(err("kvCacheUtilThreshold", "must be in (0, 1]"));
            }
            p.kv_cache_util_threshold = k;
        }
        if let Some(v) = params.get("metricsStalenessThreshold") {
            let s = v.as_str().ok_or_else(|| {
                err(
                    "metricsStalenessThreshold",
                    "must be a duration string such as \"200ms\"",
                )
            })?;
            let ms = parse_duration_ms(s).map_err(|r| err("metricsStalenessThreshold", &r))?;
            if ms == 0 {
                return Err(err("metricsStalenessThreshold", "must be positive"));
            }
            p.staleness_ms = ms;
        }
        if let Some(h) = params.number("headroom")? {
            if h < 0.0 {
                return Err(err("headroom", "must be non-negative"));
            }
            p.headroom = h;
        }
        if let Some(v) = params.get("stalenessPolicy") {
            p.ignore_stale = match v.as_str() {
                Some("saturated") => false,
                Some("ignore") => true,
                _ => {
                    return Err(err(
                        "stalenessPolicy",
                        "must be \"saturated\" or \"ignore\"",
                    ))
                }
            };
        }
        if let Some(f) = params.number("queueDepthMeanFactor")? {
            if !(f == 0.0 || f >= 1.0) {
                return Err(err("queueDepthMeanFactor", "must be 0 (off) or at least 1"));
            }
            p.queue_depth_mean_factor = f;
        }
        Ok(p)
    }

    fn fresh(&self, e: &EndpointLoad, now_ms: u64) -> bool {
        e.updated_ms
            .is_some_and(|t| now_ms.saturating_sub(t) <= self.staleness_ms)
    }

    /// Endpoints whose metrics are missing or older than the staleness threshold.
    pub fn stale(&self, endpoints: &[EndpointLoad], now_ms: u64) -> u64 {
        endpoints.iter().filter(|e| !self.fresh(e, now_ms)).count() as u64
    }

    /// One endpoint's score.
    pub fn endpoint_score(&self, e: &EndpointLoad, now_ms: u64) -> f64 {
        if !self.fresh(e, now_ms) {
            return 1.0;
        }
        (e.waiting / self.queue_depth_threshold).max(e.kv_usage / self.kv_cache_util_threshold)
    }

    /// The pool's saturation: mean endpoint score; 1.0 for an empty pool (and, with
    /// `stalenessPolicy: ignore`, for a pool with no fresh endpoint).
    pub fn saturation(&self, endpoints: &[EndpointLoad], now_ms: u64) -> f64 {
        let counted: Vec<&EndpointLoad> = endpoints
            .iter()
            .filter(|e| !self.ignore_stale || self.fresh(e, now_ms))
            .collect();
        if counted.is_empty() {
            return 1.0;
        }
        let sum: f64 = counted.iter().map(|e| self.endpoint_score(e, now_ms)).sum();
        sum / counted.len() as f64
    }

    /// Filter role: the endpoints with fresh metrics under both thresholds (loosened by
    /// `headroom`; the queue bound raised to `queueDepthMeanFactor` × the fresh
    /// endpoints' mean queue when that is higher); all of them if none qualifies (fail
    /// open).
    pub fn keep(&self, endpoints: &[EndpointLoad], now_ms: u64) -> Vec<bool> {
        let fits = self.fits(endpoints.iter().copied(), now_ms);
        let keep: Vec<bool> = endpoints.iter().map(fits).collect();
        if keep.iter().any(|k| *k) {
            keep
        } else {
            vec![true; endpoints.len()]
        }
    }

    /// [`Params::keep`] in place: leaves in `endpoints` the ones whose load (`load`)
    /// qualifies, all of them if none does. No allocation: a pick runs it over every
    /// candidate.
    pub fn retain<T>(
        &self,
        endpoints: &mut Vec<T>,
        load: impl Fn(&T) -> EndpointLoad,
        now_ms: u64,
    ) {
        let fits = self.fits(endpoints.iter().map(&load), now_ms);
        let kept = endpoints.iter().filter(|e| fits(&load(e))).count();
        if kept > 0 && kept < endpoints.len() {
            endpoints.retain(|e| fits(&load(e)));
        }
    }

    /// Whether one endpoint qualifies in the filter role, among the pool `loads`.
    fn fits(
        &self,
        loads: impl Iterator<Item = EndpointLoad>,
        now_ms: u64,
    ) -> impl Fn(&EndpointLoad) -> bool + '_ {
        let q = (self.queue_depth_threshold * (1.0 + self.headroom))
            .max(self.queue_depth_mean_factor * self.mean_fresh_waiting(loads, now_ms));
        // A KV cache cannot be more than full: headroom past 1.0 would keep full servers.
        let k = (self.kv_cache_util_threshold * (1.0 + self.headroom)).min(1.0);
        move |e| self.fresh(e, now_ms) && e.waiting < q && e.kv_usage < k
    }

    /// The mean scraped queue of the endpoints with fresh metrics (0 if none).
    fn mean_fresh_waiting(&self, loads: impl Iterator<Item = EndpointLoad>, now_ms: u64) -> f64 {
        if self.queue_depth_mean_factor <= 0.0 {
            return 0.0;
        }
        let (n, sum) = loads
            .filter(|e| self.fresh(e, now_ms))
            .fold((0u32, 0.0), |(n, s), e| (n + 1, s + e.waiting));
        if n == 0 {
            0.0
        } else {
            sum / f64::from(n)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn ep(waiting: f64, kv_usage: f64, updated_ms: Option<u64>) -> EndpointLoad {
        EndpointLoad {
            waiting,
            kv_usage,
            updated_ms,
            other_requests: 0,
            own_at_scrape: 0,
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn mean_of_rooflines_with_stale_endpoints_counting_full() {
        let p = Params::default();
        let now = 1_000;
        let pool = [
            ep(5.0, 0.4, Some(now)),       // queue 5/5 = 1.0, kv 0.5 → 1.0
            ep(1.0, 0.4, Some(now)),       // 0.2 vs 0.5 → 0.5
            ep(0.0, 0.0, Some(now - 201)), // stale → 1.0
            ep(0.0, 0.0, None),            // never scraped → 1.0
        ];
        assert!((p.saturation(&pool, now) - (1.0 + 0.5 + 1.0 + 1.0) / 4.0).abs() < 1e-9);
        assert_eq!(p.saturation(&[], now), 1.0);
        // Overload reads above 1.
        assert!((p.saturation(&[ep(10.0, 0.0, Some(now))], now) - 2.0).abs() < 1e-9);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn staleness_policy_ignore_leaves_stale_endpoints_out() {
        let p = Params {
            ignore_stale: true,
            ..Params::default()
        };
        let now = 1_000;
        let pool = [ep(1.0, 0.0, Some(now)), ep(0.0, 0.0, None)];
        assert!((p.saturation(&pool, now) - 0.2).abs() < 1e-9);
        assert_eq!(p.saturation(&[ep(0.0, 0.0, None)], now), 1.0);
        let parsed = Params::parse(&json!({"stalenessPolicy": "ignore"}), "p").unwrap();
        assert!(parsed.ignore_stale);
        assert_eq!(
            Params::parse(&json!({"stalenessPolicy": "maybe"}), "p")
                .unwrap_err()
                .path,
            "p.stalenessPolicy"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn filter_keeps_the_unloaded_and_fails_open() {
        let p = Params {
            headroom: 0.2,
            ..Params::default()
        };
        let now = 5;
        let pool = [
            ep(5.9, 0.1, Some(now)),
            ep(6.0, 0.1, Some(now)),
            ep(0.0, 0.95, Some(now)),
        ];
        // waiting < 6.0 and kv < 0.96
        assert_eq!(p.keep(&pool, now), vec![true, false, true]);
        assert_eq!(p.keep(&[ep(9.0, 0.0, Some(now))], now), vec![true]);
        // kvCacheUtilThreshold·(1+headroom) is capped at a full cache: 0.9·1.2 would keep
        // an endpoint at 100 %.
        let p = Params {
            headroom: 0.2,
            kv_cache_util_threshold: 0.9,
            ..Params::default()
        };
        let full = [ep(0.0, 1.0, Some(now)), ep(0.0, 0.5, Some(now))];
        assert_eq!(p.keep(&full, now), vec![false, true]);
        assert_eq!(
            p.stale(&[ep(0.0, 0.0, None), ep(0.0, 0.0, Some(now))], now),
            1
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn mean_factor_keeps_a_pool_wide_queue_and_leaves_out_the_outliers() {
        let now = 5;
        // Every queue above 5: the reference's bound keeps the one below it alone.
        let pool = [
            ep(4.0, 0.5, Some(now)),
            ep(14.0, 0.5, Some(now)),
            ep(16.0, 0.5, Some(now)),
            ep(30.0, 0.5, Some(now)),
            ep(1.0, 0.5, None), // stale: out, and not in the mean
        ];
        let absolute = Params::default();
        assert_eq!(
            absolute.keep(&pool, now),
            vec![true, false, false, false, false]
        );
        // Mean of the fresh queues 16: the bound is 1.5 × 16 = 24.
        let relative = Params::parse(&json!({"queueDepthMeanFactor": 1.5}), "p").unwrap();
        assert_eq!(
            relative.keep(&pool, now),
            vec![true, true, true, false, false]
        );
        // Below the absolute bound's mean the reference's bound decides.
        let light = [ep(0.0, 0.1, Some(now)), ep(5.0, 0.1, Some(now))];
        assert_eq!(relative.keep(&light, now), vec![true, false]);
        // The flow-control role is unchanged.
        assert_eq!(
            relative.saturation(&pool, now),
            absolute.saturation(&pool, now)
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn parameters_are_validated_by_name() {
        let ok = Params::parse(
            &json!({"queueDepthThreshold": 10, "kvCacheUtilThreshold": 0.9,
            "metricsStalenessThreshold": "1s", "headroom": 0.1}),
            "plugins[0].parameters",
        )
        .unwrap();
        assert_eq!(ok.staleness_ms, 1000);
        for (params, field) in [
            (json!({"queueDepthThreshold": 0}), "queueDepthThreshold"),
            (json!({"kvCacheUtilThreshold": 1.5}), "kvCacheUtilThreshold"),
            (
                json!({"metricsStalenessThreshold": "fast"}),
                "metricsStalenessThreshold",
            ),
            (json!({"headroom": -1}), "headroom"),
            (json!({"queueDepthMeanFactor": 0.5}), "queueDepthMeanFactor"),
            (json!({"queueDepthMeanFactor": "2"}), "queueDepthMeanFactor"),
            (json!({"queueDepth": 3}), "queueDepth"),
        ] {
            let e = Params::parse(&params, "p").unwrap_err();
            assert_eq!(e.path, format!("p.{field}"), "{params}");
        }
    }
}
