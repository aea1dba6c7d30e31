//! Named settings shared by the command line and the admin endpoint: the
//! latency knobs and failure injection. Names are the flag names; the admin
//! endpoint also accepts them with `_` instead of `-`.

use crate::engine::latency::LatencyProfile;
use crate::failures::{self, FailureConfig};
use crate::time::{format_duration, parse_duration};
use serde_json::{json, Value};

/// Settings that can be changed at run time.
pub const RUNTIME_SETTINGS: &[&str] = &[
    "profile",
    "time-to-first-token",
    "prefill-overhead",
    "prefill-time-per-token",
    "inter-token-latency",
    "time-factor-under-load",
    "batch-slowdown",
    "kv-slowdown",
    "kv-cache-transfer-latency",
    "kv-cache-transfer-time-per-token",
    "latency-jitter",
    "latency-scale",
    "failure-injection-rate",
    "failure-types",
];

/// Applies one setting. Returns `Ok(false)` if `name` is not a runtime setting.
pub fn apply(
    name: &str,
    value: &str,
    latency: &mut LatencyProfile,
    failures: &mut FailureConfig,
    max_num_seqs: usize,
) -> Result<bool, String> {
    let name = name.replace('_', "-");
    let dur = || parse_duration(value).map_err(|e| format!("--{name}: {e}"));
    let num = || -> Result<f64, String> {
        value
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| format!("--{name}: expected a non-negative number, got {value:?}"))
    };
    match name.as_str() {
        "profile" | "latency-profile" => {
            let scale = latency.scale;
            *latency = LatencyProfile::by_name(value.trim())
                .ok_or_else(|| format!("unknown profile {value:?} (known: h100-llama-8b, zero)"))?;
            latency.scale = scale;
        }
        "time-to-first-token" => {
            latency.prefill_overhead = dur()?;
            latency.prefill_per_token = std::time::Duration::ZERO;
        }
        "prefill-overhead" => latency.prefill_overhead = dur()?,
        "prefill-time-per-token" => latency.prefill_per_token = dur()?,
        "inter-token-latency" => latency.inter_token_latency = dur()?,
        "time-factor-under-load" => {
            let f = num()?;
            if f < 1.0 {
                return Err("--time-factor-under-load must be >= 1".into());
            }
            latency.batch_slowdown = if max_num_seqs > 1 {
                (f - 1.0) / (max_num_seqs - 1) as f64
            } else {
                0.0
            };
        }
        "batch-slowdown" => latency.batch_slowdown = num()?,
        "kv-slowdown" => latency.kv_slowdown = num()?,
        "kv-cache-transfer-latency" => latency.kv_transfer_overhead = dur()?,
        "kv-cache-transfer-time-per-token" => latency.kv_transfer_per_token = dur()?,
        "latency-jitter" => latency.jitter = num()?.min(0.5),
        "latency-scale" => latency.scale = num()?,
        "failure-injection-rate" => {
            let r = num()?;
            if r > 100.0 {
                return Err("--failure-injection-rate is a percentage (0-100)".into());
            }
            failures.rate_percent = r;
        }
        "failure-types" => failures.types = failures::parse_types(value)?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// Applies a JSON object of settings (admin endpoint). Values may be strings,
/// numbers, or (for failure types) arrays of strings.
pub fn apply_json(
    body: &Value,
    latency: &mut LatencyProfile,
    failures: &mut FailureConfig,
    max_num_seqs: usize,
) -> Result<(), String> {
    let Some(map) = body.as_object() else {
        return Err("expected a JSON object".into());
    };
    // Apply to copies, so a bad setting changes nothing.
    let (mut l, mut f) = (latency.clone(), failures.clone());
    // A profile first, so the other settings override it.
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort_by_key(|k| {
        !matches!(
            k.as_str(),
            "profile" | "latency_profile" | "latency-profile"
        )
    });
    for key in keys {
        let value = match &map[key] {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Array(items) => items
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(","),
            other => return Err(format!("{key}: unsupported value {other}")),
        };
        if !apply(key, &value, &mut l, &mut f, max_num_seqs)? {
            return Err(format!(
                "unknown setting {key:?}; known: {}",
                RUNTIME_SETTINGS.join(", ")
            ));
        }
    }
    *latency = l;
    *failures = f;
    Ok(())
}

/// The current runtime settings as JSON (admin endpoint).
pub fn to_json(latency: &LatencyProfile, failures: &FailureConfig) -> Value {
    json!({
        "profile": latency.name,
        "prefill_overhead": format_duration(latency.prefill_overhead),
        "prefill_time_per_token": format_duration(latency.prefill_per_token),
        "inter_token_latency": format_duration(latency.inter_token_latency),
        "batch_slowdown": latency.batch_slowdown,
        "kv_slowdown": latency.kv_slowdown,
        "kv_cache_transfer_latency": format_duration(latency.kv_transfer_overhead),
        "kv_cache_transfer_time_per_token": format_duration(latency.kv_transfer_per_token),
        "latency_jitter": latency.jitter,
        "latency_scale": latency.scale,
        "failure_injection_rate": failures.rate_percent,
        "failure_types": failures.types.iter().map(|t| t.name()).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn json_settings_apply_atomically_with_profile_first() {
        let mut l = LatencyProfile::h100_llama_8b();
        let mut f = FailureConfig::default();
        apply_json(
            &json!({"inter_token_latency": "50ms", "profile": "zero", "failure_injection_rate": 10, "failure_types": ["rate_limit"]}),
            &mut l,
            &mut f,
            5,
        )
        .unwrap();
        assert_eq!(l.name, "zero");
        assert_eq!(l.inter_token_latency, Duration::from_millis(50));
        assert_eq!(f.rate_percent, 10.0);
        let before = (l.clone(), f.clone());
        assert!(apply_json(&json!({"latency_scale": 3, "bogus": 1}), &mut l, &mut f, 5).is_err());
        assert!(apply_json(&json!({"failure_injection_rate": 101}), &mut l, &mut f, 5).is_err());
        assert_eq!((l, f), before);
    }

    #[test]
    fn time_factor_under_load_maps_to_batch_slowdown() {
        let mut l = LatencyProfile::zero();
        let mut f = FailureConfig::default();
        assert!(apply("time-factor-under-load", "2", &mut l, &mut f, 16).unwrap());
        assert!((l.batch_slowdown - 1.0 / 15.0).abs() < 1e-12);
        assert!(!apply("port", "1", &mut l, &mut f, 16).unwrap());
    }
}
