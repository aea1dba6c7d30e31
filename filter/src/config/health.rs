//! `pool.passiveHealth`: outlier detection in the picker. Envoy's own outlier detection
//! does not act on an `ORIGINAL_DST` pick, so the picker ejects an endpoint whose
//! requests fail in a row (5xx answers, including Envoy's own 503 for a refused or reset
//! connection and 504 for a timeout) for a time that doubles with each ejection.
//!
//! ```yaml
//! pool:
//!   passiveHealth: {consecutiveFailures: 5, baseEjectionTime: 1s, maxEjectionTime: 30s}
//! ```
//!
//! `consecutiveFailures: 0` turns it off (no response header is read then).

use super::quantity::parse_duration_ms;
use super::validate::{as_object, as_str, err, join, only_fields, ConfigError};
use serde_json::Value;

/// Default failures in a row that eject an endpoint (Envoy's `consecutive_5xx`).
pub const DEFAULT_CONSECUTIVE_FAILURES: u32 = 5;
/// Default first ejection.
pub const DEFAULT_BASE_EJECTION_MS: u64 = 1_000;
/// Default longest ejection.
pub const DEFAULT_MAX_EJECTION_MS: u64 = 30_000;

/// `pool.passiveHealth`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassiveHealth {
    /// Failures in a row that eject an endpoint (0: off).
    pub consecutive_failures: u32,
    /// The first ejection's length; the n-th lasts `base × 2^(n-1)`.
    pub base_ejection_ms: u64,
    /// The longest ejection.
    pub max_ejection_ms: u64,
}

impl Default for PassiveHealth {
    fn default() -> Self {
        Self {
            consecutive_failures: DEFAULT_CONSECUTIVE_FAILURES,
            base_ejection_ms: DEFAULT_BASE_EJECTION_MS,
            max_ejection_ms: DEFAULT_MAX_EJECTION_MS,
        }
    }
}

impl PassiveHealth {
    /// Whether responses are watched at all.
    pub fn enabled(&self) -> bool {
        self.consecutive_failures > 0
    }
}

/// Parses `pool.passiveHealth`.
pub fn parse_passive_health(v: &Value) -> Result<PassiveHealth, ConfigError> {
    let path = "pool.passiveHealth";
    let o = as_object(v, path)?;
    only_fields(
        o,
        path,
        &["consecutiveFailures", "baseEjectionTime", "maxEjectionTime"],
    )?;
    let mut h = PassiveHealth::default();
    if let Some(n) = o.get("consecutiveFailures") {
        let p = join(path, "consecutiveFailures");
        h.consecutive_failures = n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n <= 1_000)
            .ok_or_else(|| err(&p, "must be an integer from 0 (off) to 1000"))?;
    }
    let duration = |field: &str| -> Result<Option<u64>, ConfigError> {
        let Some(v) = o.get(field) else {
            return Ok(None);
        };
        let p = join(path, field);
        let ms = parse_duration_ms(as_str(v, &p)?).map_err(|e| err(&p, e))?;
        if ms == 0 {
            return Err(err(&p, "must be positive"));
        }
        Ok(Some(ms))
    };
    if let Some(ms) = duration("baseEjectionTime")? {
        h.base_ejection_ms = ms;
    }
    if let Some(ms) = duration("maxEjectionTime")? {
        h.max_ejection_ms = ms;
    }
    if h.max_ejection_ms < h.base_ejection_ms {
        return Err(err(
            &join(path, "maxEjectionTime"),
            format!(
                "{} ms is shorter than baseEjectionTime ({} ms)",
                h.max_ejection_ms, h.base_ejection_ms
            ),
        ));
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn reads_the_section_and_defaults_like_envoy_but_faster() {
        let h = parse_passive_health(&json!({"consecutiveFailures": 3, "baseEjectionTime": "500ms", "maxEjectionTime": "1m"})).unwrap();
        assert_eq!(
            h,
            PassiveHealth {
                consecutive_failures: 3,
                base_ejection_ms: 500,
                max_ejection_ms: 60_000
            }
        );
        assert_eq!(
            parse_passive_health(&json!({})).unwrap(),
            PassiveHealth::default()
        );
        assert!(!parse_passive_health(&json!({"consecutiveFailures": 0}))
            .unwrap()
            .enabled());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn mistakes_name_the_field() {
        for (doc, path) in [
            (json!({"consecutive": 1}), "pool.passiveHealth.consecutive"),
            (
                json!({"consecutiveFailures": -1}),
                "pool.passiveHealth.consecutiveFailures",
            ),
            (
                json!({"baseEjectionTime": "0s"}),
                "pool.passiveHealth.baseEjectionTime",
            ),
            (
                json!({"baseEjectionTime": 5}),
                "pool.passiveHealth.baseEjectionTime",
            ),
            (
                json!({"baseEjectionTime": "10s", "maxEjectionTime": "1s"}),
                "pool.passiveHealth.maxEjectionTime",
            ),
        ] {
            let e = parse_passive_health(&doc).unwrap_err();
            assert_eq!(e.path, path, "{doc}: {e}");
        }
    }
}
