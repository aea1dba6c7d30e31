//! `metrics-data-source`: where and how often the lease holder scrapes each endpoint's
//! metrics. Its parameters become the data layer's [`Settings`] (the mapping comes from
//! the extractor, `core-metrics-extractor`, in [`super::mapping`]).

use super::Settings;
use crate::config::quantity::parse_duration_ms;
use crate::config::validate::err;
use crate::config::{ConfigError, Params};
use serde_json::Value;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "metrics-data-source";

impl Settings {
    /// The source's settings from its `parameters`: `scheme` (only `http`: scrapes go
    /// through an Envoy cluster), `path`, `refreshInterval`, `timeout`, `cluster`,
    /// `insecureSkipVerify` (accepted, unused).
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let params = Params::new(
            Some(v),
            path,
            &[
                "scheme",
                "path",
                "insecureSkipVerify",
                "refreshInterval",
                // llm-d-router's per-source name for the same period (#2214).
                "interval",
                "timeout",
                "cluster",
            ],
        )?;
        let mut s = Settings::default();
        let scheme = params.string("scheme", "http")?;
        if scheme != "http" {
            return Err(err(
                &params.path("scheme"),
                format!(
                    "\"{scheme}\" is not supported: scrapes go through an Envoy cluster over http"
                ),
            ));
        }
        params.bool("insecureSkipVerify", true)?;
        s.path = params.string("path", "/metrics")?;
        if !s.path.starts_with('/') {
            return Err(err(&params.path("path"), "must start with /"));
        }
        let duration = |name: &str, default: &str| -> Result<u64, ConfigError> {
            let v = params.string(name, default)?;
            let ms = parse_duration_ms(&v).map_err(|e| err(&params.path(name), e))?;
            if ms == 0 {
                return Err(err(&params.path(name), "must be positive"));
            }
            Ok(ms)
        };
        s.interval_ms = match (params.get("interval"), params.get("refreshInterval")) {
            (Some(_), Some(_)) => {
                return Err(err(
                    &params.path("interval"),
                    "set interval or refreshInterval, not both (the same period)",
                ))
            }
            (Some(_), None) => duration("interval", "50ms")?,
            _ => duration("refreshInterval", "50ms")?,
        };
        s.timeout_ms = duration("timeout", "1s")?;
        s.cluster = params.string("cluster", super::DEFAULT_CLUSTER)?;
        Ok(s)
    }
}
