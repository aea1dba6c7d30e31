//! `active-request-scorer` (llm-d-router): requests in flight through this gateway to
//! each endpoint (every worker's, from the in-flight ledger — what the reference's
//! `inflight-load-producer` counts). An endpoint with at most `idleThreshold` (default 0)
//! scores 1; a busier one `(max − n)/max × maxBusyScore` (default 1.0), `max` the
//! busiest candidate's count. `requestTimeout` is accepted and unused, as in the
//! reference (deprecated there: the ledger ends a request at its end).

use crate::config::validate::err;
use crate::config::{ConfigError, Params};
use crate::scheduler::{Cycle, Scorer};
use serde_json::Value;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "active-request-scorer";

/// The active-request scorer.
#[derive(Debug)]
pub struct ActiveRequest {
    /// Requests at or below which an endpoint is idle (score 1).
    pub idle_threshold: u64,
    /// The best score of a busy endpoint.
    pub max_busy_score: f64,
}

impl ActiveRequest {
    /// Builds the scorer from its `parameters`.
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(
            Some(v),
            path,
            &["idleThreshold", "maxBusyScore", "requestTimeout"],
        )?;
        let idle = p.i64("idleThreshold", 0)?;
        if idle < 0 {
            return Err(err(&p.path("idleThreshold"), "must not be negative"));
        }
        let max_busy_score = p.unit("maxBusyScore", 1.0)?;
        p.string("requestTimeout", "")?;
        Ok(Self {
            idle_threshold: idle.unsigned_abs(),
            max_busy_score,
        })
    }
}

impl Scorer for ActiveRequest {
    fn score(&self, cx: &Cycle<'_>, endpoints: &[usize]) -> Vec<f64> {
        let count = |i: usize| cx.candidate(i).map_or(0, |c| c.in_flight);
        let max = endpoints.iter().map(|&i| count(i)).max().unwrap_or(0);
        endpoints
            .iter()
            .map(|&i| {
                let n = count(i);
                if n <= self.idle_threshold || max == 0 {
                    1.0
                } else {
                    (max - n) as f64 / max as f64 * self.max_busy_score
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::*;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn idle_endpoints_score_one_and_busy_ones_scale_down_from_max_busy_score() {
        let mut c = candidates(&[(0, 0, 0.0); 4]);
        for (cand, n) in c.iter_mut().zip([0, 1, 2, 4]) {
            cand.in_flight = n;
        }
        let s =
            ActiveRequest::from_parameters(&json!({"idleThreshold": 1, "maxBusyScore": 0.5}), "p")
                .unwrap();
        let got = with_cycle(&c, &[], |cx| s.score(cx, &all(&c)));
        assert_eq!(got, vec![1.0, 1.0, 0.25, 0.0]);
        let e = ActiveRequest::from_parameters(&json!({"maxBusyScore": 2}), "p").unwrap_err();
        assert_eq!(e.path, "p.maxBusyScore");
    }
}
