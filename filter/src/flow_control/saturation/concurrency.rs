//! `concurrency-detector`: requests (or estimated tokens) in flight over the pool's
//! capacity, `Σ in-flight / (endpoints × maxConcurrency)`; an empty pool is 1.0.
//! In-flight counts come from the gateway's own cross-worker accounting, so they are
//! exact (the reference's version reads zero here: a known bug not copied).
//!
//! They are exact *per gateway*: R gateway replicas (Envoy pods) each count their own. With
//! `gatewayReplicas: R` each replica takes `1/R` of the capacity, so the pool-wide bound
//! stays near `maxConcurrency` per endpoint without a shared store.

use super::PoolLoad;
use crate::config::{ConfigError, Params as Parameters};
use serde_json::Value;

/// Plugin type name.
pub const TYPE: &str = "concurrency-detector";

/// What is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Requests in flight.
    Requests,
    /// Estimated tokens in flight.
    Tokens,
}

/// Parameters, with the reference's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// `concurrencyMode` (default `requests`).
    pub mode: Mode,
    /// `maxConcurrency` per endpoint (default 100).
    pub max_concurrency: u64,
    /// `maxTokenConcurrency` per endpoint (default 1,000,000).
    pub max_token_concurrency: u64,
    /// `headroom` (default 0): loosens the filter role only.
    pub headroom: f64,
    /// `gatewayReplicas` (default 1): gateway replicas sharing the capacity equally.
    pub gateway_replicas: u64,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            mode: Mode::Requests,
            max_concurrency: 100,
            max_token_concurrency: 1_000_000,
            headroom: 0.0,
            gateway_replicas: 1,
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
                "concurrencyMode",
                "maxConcurrency",
                "maxTokenConcurrency",
                "headroom",
                "gatewayReplicas",
            ],
        )?;
        let err = |key: &str, reason: &str| ConfigError {
            path: params.path(key),
            reason: reason.into(),
        };
        let mut p = Params::default();
        if let Some(v) = params.get("concurrencyMode") {
            p.mode = match v.as_str() {
                Some("requests") => Mode::Requests,
                Some("tokens") => Mode::Tokens,
                _ => return Err(err("concurrencyMode", "must be \"requests\" or \"tokens\"")),
            };
        }
        let positive = |key: &str| -> Result<Option<u64>, ConfigError> {
            match params.number(key)? {
                None => Ok(None),
                Some(n) if n >= 1.0 && n.fract() == 0.0 => Ok(Some(n as u64)),
                Some(_) => Err(err(key, "must be a positive integer")),
            }
        };
        if let Some(n) = positive("maxConcurrency")? {
            p.max_concurrency = n;
        }
        if let Some(n) = positive("maxTokenConcurrency")? {
            p.max_token_concurrency = n;
        }
        if let Some(n) = positive("gatewayReplicas")? {
            p.gateway_replicas = n;
        }
        if let Some(h) = params.number("headroom")? {
            if h < 0.0 {
                return Err(err("headroom", "must be non-negative"));
            }
            p.headroom = h;
        }
        Ok(p)
    }

    /// This gateway's capacity per endpoint: its share of `maxConcurrency` (or
    /// `maxTokenConcurrency`) among `gatewayReplicas`.
    fn capacity(&self) -> f64 {
        let whole = match self.mode {
            Mode::Requests => self.max_concurrency,
            Mode::Tokens => self.max_token_concurrency,
        };
        whole as f64 / self.gateway_replicas.max(1) as f64
    }

    /// Pool saturation.
    pub fn saturation(&self, pool: &PoolLoad<'_>) -> f64 {
        let total = self.capacity() * pool.endpoint_count as f64;
        if total <= 0.0 {
            return 1.0;
        }
        let load = match self.mode {
            Mode::Requests => pool.in_flight_requests,
            Mode::Tokens => pool.in_flight_tokens,
        };
        load as f64 / total
    }

    /// Filter role: whether an endpoint with this load stays a candidate
    /// (`load < capacity × (1 + headroom)`; no fail-open, as in the reference).
    pub fn keep(&self, requests: u64, tokens: u64) -> bool {
        let limit = (self.capacity() * (1.0 + self.headroom)) as u64;
        let load = match self.mode {
            Mode::Requests => requests,
            Mode::Tokens => tokens,
        };
        load < limit
    }
}

/// The reference's token estimate of a request: input `max(body_bytes / 4, 1)` plus
/// output `round(input × 1.5)`.
pub fn estimate_tokens(body_bytes: u64) -> u64 {
    let input = (body_bytes / 4).max(1);
    input + (input as f64 * 1.5).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn pool(endpoints: usize, requests: u64, tokens: u64) -> PoolLoad<'static> {
        PoolLoad {
            endpoints: &[],
            endpoint_count: endpoints,
            available: endpoints,
            in_flight_requests: requests,
            in_flight_tokens: tokens,
            now_ms: 0,
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn in_flight_over_capacity() {
        let p = Params {
            max_concurrency: 10,
            ..Params::default()
        };
        assert!((p.saturation(&pool(3, 15, 0)) - 0.5).abs() < 1e-9);
        assert!((p.saturation(&pool(3, 30, 0)) - 1.0).abs() < 1e-9);
        assert_eq!(
            p.saturation(&pool(0, 0, 0)),
            1.0,
            "an empty pool is saturated"
        );
        let t = Params {
            mode: Mode::Tokens,
            max_token_concurrency: 1000,
            ..Params::default()
        };
        assert!((t.saturation(&pool(2, 1, 500)) - 0.25).abs() < 1e-9);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn each_of_r_gateway_replicas_takes_its_share_of_the_capacity() {
        let p = Params::parse(&json!({"maxConcurrency": 8, "gatewayReplicas": 4}), "x").unwrap();
        // 16 endpoints × 8 = 128 pool-wide; this replica's share is 32.
        assert!((p.saturation(&pool(16, 16, 0)) - 0.5).abs() < 1e-9);
        assert!((p.saturation(&pool(16, 32, 0)) - 1.0).abs() < 1e-9);
        assert!(
            p.keep(1, 0) && !p.keep(2, 0),
            "2 per endpoint from this replica"
        );
        // Shares need not be whole: 8 over 3 replicas is 2.67 per endpoint.
        let p = Params::parse(&json!({"maxConcurrency": 8, "gatewayReplicas": 3}), "x").unwrap();
        assert!((p.saturation(&pool(3, 8, 0)) - 1.0).abs() < 1e-9);
        for bad in [
            json!({"gatewayReplicas": 0}),
            json!({"gatewayReplicas": 1.5}),
        ] {
            assert_eq!(
                Params::parse(&bad, "x").unwrap_err().path,
                "x.gatewayReplicas"
            );
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn filter_limit_includes_headroom() {
        let p = Params {
            max_concurrency: 10,
            headroom: 0.5,
            ..Params::default()
        };
        assert!(p.keep(14, 0));
        assert!(!p.keep(15, 0));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn token_estimate_as_the_reference() {
        assert_eq!(estimate_tokens(400), 100 + 150);
        assert_eq!(estimate_tokens(0), 1 + 2);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn parameters_are_validated_by_name() {
        let p = Params::parse(
            &json!({"maxConcurrency": 15, "concurrencyMode": "tokens"}),
            "x",
        )
        .unwrap();
        assert_eq!((p.max_concurrency, p.mode), (15, Mode::Tokens));
        assert_eq!(
            Params::parse(&json!({"maxConcurrency": 0}), "x")
                .unwrap_err()
                .path,
            "x.maxConcurrency"
        );
        assert_eq!(
            Params::parse(&json!({"concurrencyMode": "hybrid"}), "x")
                .unwrap_err()
                .path,
            "x.concurrencyMode"
        );
    }
}
