//! `predicted-latency-producer` (and the first design's name, `slo-request-tracker`):
//! configuring it turns the predictor on. Every routed request then records its
//! features, its ground truth is measured on the response path and trained on, requests
//! with a TPOT SLO are listed on their endpoint, and SLO plugins get a prediction and
//! headroom per endpoint once the model is ready.
//!
//! Parameters (the reference's names and defaults): `sloBufferFactor` 1.0 (multiplies
//! the TPOT SLO headroom is computed against), `contextTTL` 5m (a running-list entry
//! older than this is dropped), `streamingMode` false (true: TPOT headroom counts),
//! `endpointRoleLabel` "" (the label whose value `prefill` makes an endpoint ignore
//! TPOT), `predictInProduce` true (accepted), `samplingMean` and
//! `maxDecodeTokenSamplesForPrediction` (accepted, ignored as in the reference). Ours:
//! `objective` `mean` (default, as the reference's Helm chart) or `quantile`,
//! `quantile` 0.9 (the level of the quantile objective), and `errorMargin` 1.0 (≥ 0):
//! the headroom is held against the prediction × (1 + errorMargin × the endpoint's
//! running error), so an endpoint whose recent predictions were far off needs more
//! room to count as meeting an objective (0: the bare prediction, as the reference).

use super::model::Objective;
use crate::config::quantity::parse_duration_ms;
use crate::config::validate::{as_str, err};
use crate::config::{ConfigError, Params};
use crate::endpoint::Candidate;
use serde_json::Value;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "predicted-latency-producer";
/// The first design's name for the same plugin (seed `slo-request-tracker`); it may
/// also be listed in profiles, where it filters nothing.
pub const TRACKER_TYPE: &str = "slo-request-tracker";

/// The predictor's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `sloBufferFactor`.
    pub buffer: f64,
    /// `contextTTL` in ms.
    pub context_ttl_ms: u64,
    /// `streamingMode`: TPOT headroom counts.
    pub streaming_mode: bool,
    /// `endpointRoleLabel`: the label naming an endpoint's P/D role ("" = none).
    pub role_label: String,
    /// `objective` / `quantile`.
    pub objective: Objective,
    /// `errorMargin`: how many running errors the headroom keeps in hand.
    pub error_margin: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            buffer: 1.0,
            context_ttl_ms: 300_000,
            streaming_mode: false,
            role_label: String::new(),
            objective: Objective::Mean,
            error_margin: DEFAULT_ERROR_MARGIN,
        }
    }
}

/// `errorMargin`'s default.
pub const DEFAULT_ERROR_MARGIN: f64 = 1.0;

const PARAMETERS: &[&str] = &[
    "sloBufferFactor",
    "contextTTL",
    "streamingMode",
    "endpointRoleLabel",
    "predictInProduce",
    "samplingMean",
    "maxDecodeTokenSamplesForPrediction",
    "objective",
    "quantile",
    "errorMargin",
];

impl Settings {
    /// The settings from the plugin's `parameters`.
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(Some(v), path, PARAMETERS)?;
        let buffer = p.f64("sloBufferFactor", 1.0)?;
        if buffer <= 0.0 {
            return Err(err(
                &p.path("sloBufferFactor"),
                format!("must be positive, got {buffer}"),
            ));
        }
        let context_ttl_ms = match p.get("contextTTL") {
            None => 300_000,
            Some(v) => {
                let at = p.path("contextTTL");
                parse_duration_ms(as_str(v, &at)?).map_err(|e| err(&at, e))?
            }
        };
        p.bool("predictInProduce", true)?;
        p.number("samplingMean")?;
        p.number("maxDecodeTokenSamplesForPrediction")?;
        let quantile = p.f64("quantile", 0.9)?;
        if !(quantile > 0.0 && quantile < 1.0) {
            return Err(err(
                &p.path("quantile"),
                format!("must be between 0 and 1 (exclusive), got {quantile}"),
            ));
        }
        let objective = match p.string("objective", "mean")?.as_str() {
            "mean" => Objective::Mean,
            "quantile" => Objective::Quantile(quantile),
            other => {
                return Err(err(
                    &p.path("objective"),
                    format!("\"{other}\" is not an objective; use mean or quantile"),
                ))
            }
        };
        let error_margin = p.non_negative("errorMargin", DEFAULT_ERROR_MARGIN)?;
        Ok(Self {
            error_margin,
            buffer,
            context_ttl_ms,
            streaming_mode: p.bool("streamingMode", false)?,
            role_label: p.string("endpointRoleLabel", "")?,
            objective,
        })
    }

    /// Whether `c` is a prefill endpoint (its TPOT does not count).
    pub fn is_prefill(&self, c: &Candidate) -> bool {
        !self.role_label.is_empty()
            && c.labels.get(&self.role_label).map(String::as_str) == Some("prefill")
    }

    /// The quantile level the model tracks.
    pub fn tau(&self) -> f64 {
        match self.objective {
            Objective::Quantile(q) => q,
            Objective::Mean => 0.9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn defaults_are_the_references() {
        let s = Settings::from_parameters(&Value::Null, "p").unwrap();
        assert_eq!(s, Settings::default());
        let s = Settings::from_parameters(
            &json!({"sloBufferFactor": 0.9, "contextTTL": "30s", "streamingMode": true,
                    "endpointRoleLabel": "llm-d.ai/role", "objective": "quantile", "quantile": 0.95,
                    "samplingMean": 100, "maxDecodeTokenSamplesForPrediction": 600}),
            "p",
        )
        .unwrap();
        assert_eq!(s.buffer, 0.9);
        assert_eq!(s.context_ttl_ms, 30_000);
        assert!(s.streaming_mode);
        assert_eq!(s.objective, Objective::Quantile(0.95));
        assert_eq!(s.error_margin, DEFAULT_ERROR_MARGIN);
        let bare = Settings::from_parameters(&json!({"errorMargin": 0}), "p").unwrap();
        assert_eq!(bare.error_margin, 0.0);
        let mut prefill = Candidate::new("a");
        prefill
            .labels
            .insert("llm-d.ai/role".into(), "prefill".into());
        assert!(s.is_prefill(&prefill));
        assert!(!s.is_prefill(&Candidate::new("b")));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn bad_values_name_the_field() {
        for (v, field) in [
            (json!({"sloBufferFactor": 0}), "sloBufferFactor"),
            (json!({"contextTTL": "soon"}), "contextTTL"),
            (json!({"objective": "median"}), "objective"),
            (json!({"quantile": 1.5}), "quantile"),
            (json!({"streamingMode": "yes"}), "streamingMode"),
            (json!({"errorMargin": -1}), "errorMargin"),
        ] {
            let e = Settings::from_parameters(&v, "plugins[0].parameters").unwrap_err();
            assert_eq!(e.path, format!("plugins[0].parameters.{field}"), "{v}");
        }
    }
}
