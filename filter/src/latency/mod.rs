//! SLO-aware routing's core: the latency predictor that learns inside the filter, the
//! per-endpoint headroom against the requests' TTFT/TPOT objectives, and the
//! cross-worker records it lives in.
//!
//! * [`features`] — the predictor's inputs for one (request, endpoint) pair.
//! * [`model`] — the incremental model (RLS global term × per-endpoint speed, mean or
//!   quantile objective, running error) and its training samples.
//! * [`predictor`] — the published model as picks use it (per-endpoint factors computed
//!   once per model version).
//! * [`headroom`] — a prediction against the request's SLO and the tightest TPOT SLO
//!   already running on the endpoint.
//! * [`observe`] — ground truth (TTFT, TPOT) from the response stream.
//! * [`producer`] — `predicted-latency-producer` / `slo-request-tracker`: the settings.
//! * [`running`] — the shared per-endpoint list of running requests with their SLOs.
//! * [`shared`] — the shared sample queue and the published model: every worker
//!   pushes ground truth, one trains, every worker reads.
//!
//! Host-independent: time comes in as arguments, shared data through `SharedStore`.

pub mod features;
pub mod headroom;
pub mod model;
pub mod observe;
pub mod predictor;
pub mod producer;
pub mod running;
pub mod shared;

use crate::endpoint::Candidate;
use crate::prefix::index::PrefixMatch;
use hashbrown::HashMap;
use std::rc::Rc;

pub use headroom::Prediction;
pub use model::{Model, Objective, Sample, Target};
pub use producer::Settings;

/// A request's latency objectives (ms); `None` = no objective.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Slo {
    /// Time to first token.
    pub ttft_ms: Option<f64>,
    /// Time per output token.
    pub tpot_ms: Option<f64>,
}

impl Slo {
    /// Reads one SLO header as the reference does: a float in ms; missing, unparsable,
    /// non-finite or ≤ 0 means no objective.
    pub fn parse(value: Option<&str>) -> Option<f64> {
        value
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v > 0.0)
    }

    /// Whether any objective is set.
    pub fn any(&self) -> bool {
        self.ttft_ms.is_some() || self.tpot_ms.is_some()
    }
}

/// What a pick knows of the predictor and of the SLO requests running: the model as
/// last published, and the tightest TPOT SLO running on each endpoint.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// The published model (`None` before the first training).
    pub model: Option<Rc<predictor::Predictor>>,
    /// The tightest TPOT SLO (ms) among the requests running on each endpoint.
    pub min_tpot_slo: Rc<HashMap<String, f64>>,
}

/// The features and predictions of one request on one endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// The features (a training sample's input).
    pub x: [f64; features::N],
    /// The prediction with its headroom, when the model is ready.
    pub prediction: Option<Prediction>,
}

/// Estimates every candidate for one request: the features always (for training),
/// the predictions and headroom once the model is ready for TTFT.
pub fn estimate(
    settings: &Settings,
    view: Option<&View>,
    input_tokens: u64,
    slo: Slo,
    candidates: &[Candidate],
    prefix: &[PrefixMatch],
) -> Vec<Estimate> {
    let model = view.and_then(|v| v.model.as_deref());
    candidates
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let ratio = prefix.get(i).map_or(0.0, PrefixMatch::ratio);
            let x = features::of(input_tokens, ratio, c);
            let prediction = model.and_then(|m| {
                let factors = m.factors(&c.address);
                let ttft = m.predict(Target::Ttft, factors, &x, settings.objective)?;
                let tpot = m.predict(Target::Tpot, factors, &x, settings.objective);
                let running_min = view.and_then(|v| v.min_tpot_slo.get(&c.address).copied());
                let margin = |t| 1.0 + settings.error_margin * factors.error(t);
                Some(headroom::assess(
                    settings,
                    headroom::Predicted {
                        ttft,
                        tpot,
                        ttft_margin: margin(Target::Ttft),
                        tpot_margin: margin(Target::Tpot),
                    },
                    slo,
                    running_min,
                    settings.is_prefill(c),
                ))
            });
            Estimate { x, prediction }
        })
        .collect()
}

/// `latency-slo-admitter`'s rule for a sheddable request: it may go when some endpoint
/// is predicted to meet its objectives, or is idle (nothing in flight), or has almost
/// no KV cache in use (< 2 %). Before the predictor is ready nothing is refused.
pub fn admits(estimates: &[Estimate], candidates: &[Candidate]) -> bool {
    if estimates.iter().all(|e| e.prediction.is_none()) {
        return true;
    }
    estimates.iter().zip(candidates).any(|(e, c)| {
        e.prediction.is_some_and(|p| p.valid()) || c.in_flight == 0 || c.metrics.kv_usage < 0.02
    })
}

/// The plugin type of the admitter.
pub const ADMITTER_TYPE: &str = "latency-slo-admitter";

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn slo_headers_are_floats_in_ms_and_anything_else_is_no_slo() {
        assert_eq!(Slo::parse(Some("250")), Some(250.0));
        assert_eq!(Slo::parse(Some(" 42.5 ")), Some(42.5));
        assert_eq!(Slo::parse(Some("0")), None);
        assert_eq!(Slo::parse(Some("-3")), None);
        assert_eq!(Slo::parse(Some("fast")), None);
        assert_eq!(Slo::parse(Some("inf")), None);
        assert_eq!(Slo::parse(Some("")), None);
        assert_eq!(Slo::parse(None), None);
    }

    fn with_prediction(ttft_headroom: f64, tpot_headroom: f64) -> Estimate {
        Estimate {
            x: [0.0; features::N],
            prediction: Some(Prediction {
                ttft_ms: 1.0,
                tpot_ms: None,
                ttft_headroom,
                tpot_headroom,
            }),
        }
    }

    fn busy(n: usize) -> Vec<Candidate> {
        (0..n)
            .map(|i| {
                let mut c = Candidate::new(&format!("10.0.0.{i}:8000"));
                c.in_flight = 3;
                c.metrics.kv_usage = 0.5;
                c
            })
            .collect()
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_admitter_refuses_only_when_no_endpoint_can_serve() {
        let c = busy(2);
        // Every endpoint predicted to miss: refused.
        let miss = [with_prediction(-5.0, 0.0), with_prediction(10.0, -1.0)];
        assert!(!admits(&miss, &c));
        // One meets both objectives: admitted.
        let fits = [with_prediction(-5.0, 0.0), with_prediction(10.0, 0.0)];
        assert!(admits(&fits, &c));
        // An idle endpoint, or one with an almost empty KV cache, admits too.
        let mut idle = busy(2);
        idle[1].in_flight = 0;
        assert!(admits(&miss, &idle));
        let mut empty = busy(2);
        empty[0].metrics.kv_usage = 0.01;
        assert!(admits(&miss, &empty));
        // Before the predictor is ready nothing is refused.
        let cold = [
            Estimate {
                x: [0.0; features::N],
                prediction: None,
            },
            Estimate {
                x: [0.0; features::N],
                prediction: None,
            },
        ];
        assert!(admits(&cold, &c));
    }
}
