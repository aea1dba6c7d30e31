//! `concurrency-detector`: requests (or estimated tokens) in flight over the pool's
//! capacity, `Σ in-flight / (endpoints × maxConcurrency)`; an empty pool is 1.0.
//! In-flight counts come from the gateway's own cross-worker accounting, so they are
//! exact (the reference's version reads zero here: a known bug not copied).
//!
//! They are exact *per gateway*: R gateway replicas (Envoy pods) each count their own. Two
//! ways keep the pool-wide bound near `maxConcurrency` per endpoint without a shared store:
//! * `gatewayReplicas: R`: each replica takes `1/R` of the capacity (a static, even split);
//! * `inFlightSource: servers`: each replica adds to its own count what the servers' last
//!   scrape shows beyond it (`running + waiting` minus this gateway's in flight there when
//!   the scrape was sent), i.e. the other replicas' requests. Every replica scrapes the
//!   same servers, so they share one view of the pool, late by at most a scrape interval;
//!   a replica with more of the traffic may use the capacity another leaves idle.
//! * both: each replica may always use its `1/R` share, and borrow beyond it `1/R` of the
//!   room the servers' last scrape showed (so a replica that was idle gets its share back
//!   at once, and R replicas seeing the same room at once do not each fill all of it).

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

/// Whose in-flight requests are counted (`inFlightSource`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// This gateway's own (the reference's behaviour).
    Gateway,
    /// This gateway's own plus the other replicas', read from the servers' scraped
    /// `running + waiting` (requests mode only: servers do not report tokens).
    Servers,
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
    /// `inFlightSource` (default `gateway`).
    pub source: Source,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            mode: Mode::Requests,
            max_concurrency: 100,
            max_token_concurrency: 1_000_000,
            headroom: 0.0,
            gateway_replicas: 1,
            source: Source::Gateway,
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
                "inFlightSource",
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
        if let Some(v) = params.get("inFlightSource") {
            p.source = match v.as_str() {
                Some("gateway") => Source::Gateway,
                Some("servers") => Source::Servers,
                _ => return Err(err("inFlightSource", "must be \"gateway\" or \"servers\"")),
            };
            if p.source == Source::Servers && p.mode == Mode::Tokens {
                return Err(err(
                    "inFlightSource",
                    "\"servers\" needs concurrencyMode \"requests\": servers report requests, not tokens",
                ));
            }
        }
        Ok(p)
    }

    /// The configured capacity per endpoint (`maxConcurrency` or `maxTokenConcurrency`).
    fn whole(&self) -> f64 {
        match self.mode {
            Mode::Requests => self.max_concurrency as f64,
            Mode::Tokens => self.max_token_concurrency as f64,
        }
    }

    /// This gateway's capacity per endpoint: its share of the whole among `gatewayReplicas`.
    fn capacity(&self) -> f64 {
        self.whole() / self.gateway_replicas.max(1) as f64
    }

    /// Pool saturation: this gateway's in flight over its capacity. With
    /// `inFlightSource: servers`, the pool's (this gateway's plus the other replicas', by
    /// the last scrape) over the whole capacity; with `gatewayReplicas: R` as well, the
    /// lower of the two: each replica may always use its `1/R` share and borrow beyond it
    /// `1/R` of the room the last scrape showed (every replica sees that room at once; the
    /// other `(R − 1)/R` counts as taken).
    pub fn saturation(&self, pool: &PoolLoad<'_>) -> f64 {
        let endpoints = pool.endpoint_count as f64;
        let total = self.capacity() * endpoints;
        if total <= 0.0 {
            return 1.0;
        }
        let load = match self.mode {
            Mode::Requests => pool.in_flight_requests,
            Mode::Tokens => pool.in_flight_tokens,
        };
        let own = load as f64 / total;
        match self.source {
            Source::Gateway => own,
            Source::Servers => {
                let others: u64 = pool.endpoints.iter().map(|e| e.other_requests).sum();
                let whole = self.whole() * endpoints;
                if self.gateway_replicas > 1 {
                    // Borrowing: of the room the last scrape showed, this replica takes
                    // its 1/R (every replica sees the same room at once).
                    let then: u64 = pool.endpoints.iter().map(|e| e.own_at_scrape).sum();
                    let room = (whole - (then + others) as f64).max(0.0);
                    let others_share = room * (1.0 - 1.0 / self.gateway_replicas as f64);
                    own.min((load + others) as f64 / whole + others_share / whole)
                } else {
                    (load + others) as f64 / whole
                }
            }
        }
    }

    /// Filter role: whether an endpoint with this load from this gateway (`requests`,
    /// `tokens`) and `others` requests of other replicas (by the last scrape) stays a
    /// candidate: `load < capacity × (1 + headroom)`; with `inFlightSource: servers`,
    /// `load + others < whole × (1 + headroom)` (or, with `gatewayReplicas` > 1, either);
    /// no fail-open, as in the reference.
    pub fn keep(&self, requests: u64, tokens: u64, others: u64) -> bool {
        let limit = |capacity: f64| (capacity * (1.0 + self.headroom)) as u64;
        let load = match self.mode {
            Mode::Requests => requests,
            Mode::Tokens => tokens,
        };
        let share = load < limit(self.capacity());
        match self.source {
            Source::Gateway => share,
            Source::Servers => {
                (self.gateway_replicas > 1 && share) || load + others < limit(self.whole())
            }
        }
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
    use crate::flow_control::saturation::EndpointLoad;
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
            p.keep(1, 0, 0) && !p.keep(2, 0, 0),
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
    fn with_the_servers_counts_other_replicas_requests_fill_the_pool() {
        let p = Params::parse(
            &json!({"maxConcurrency": 8, "inFlightSource": "servers"}),
            "x",
        )
        .unwrap();
        // 4 endpoints × 8 = 32 pool-wide. Other replicas have 6 requests at each endpoint.
        let loads = [EndpointLoad::scraped(0, 0.1, Some(1)).with_other_requests(6); 4];
        let with_others = |requests: u64| PoolLoad {
            endpoints: &loads,
            ..pool(4, requests, 0)
        };
        assert!((p.saturation(&with_others(0)) - 0.75).abs() < 1e-9);
        assert!(p.saturation(&with_others(7)) < 1.0);
        assert!(
            (p.saturation(&with_others(8)) - 1.0).abs() < 1e-9,
            "8 of this gateway's own + 24 of the others fill the pool"
        );
        // Without the servers' counts this replica alone could send 32.
        let alone = Params::parse(&json!({"maxConcurrency": 8}), "x").unwrap();
        assert!(alone.saturation(&with_others(31)) < 1.0);
        // Filter role: 3 of its own + 5 of the others reach the endpoint's 8.
        assert!(p.keep(2, 0, 5) && !p.keep(3, 0, 5));
        assert!(alone.keep(7, 0, 5));
        // With a share as well, a replica may always use its share (4 per endpoint here)
        // and borrow beyond it what the others leave idle.
        let both = Params::parse(
            &json!({"maxConcurrency": 8, "gatewayReplicas": 2, "inFlightSource": "servers"}),
            "x",
        )
        .unwrap();
        assert!(
            both.keep(3, 0, 7),
            "within its share whatever the others do"
        );
        assert!(
            both.keep(6, 0, 1) && !both.keep(7, 0, 1),
            "borrowing up to the whole"
        );
        assert!(!both.keep(4, 0, 4));
        assert!(
            (both.saturation(&with_others(8)) - 0.5).abs() < 1e-9,
            "half its share used: 8 of 16"
        );
        assert!(
            both.saturation(&with_others(16)) >= 1.0,
            "its share is used and the pool is full"
        );
        // The other replica is idle; this one had 16 in flight at the last scrape, which
        // showed 16 free. Every replica sees that room at once, so it borrows half of it.
        let idle = [EndpointLoad::scraped(0, 0.1, Some(1)).with_own_at_scrape(4); 4];
        let at = |requests: u64| PoolLoad {
            endpoints: &idle,
            ..pool(4, requests, 0)
        };
        assert!(
            (both.saturation(&at(20)) - 0.875).abs() < 1e-9,
            "20 + the other's half of the room (8) of 32"
        );
        assert!(
            (both.saturation(&at(24)) - 1.0).abs() < 1e-9,
            "its half of the room taken"
        );
        // Alone (no share), a replica may take the whole room.
        assert!(p.saturation(&at(31)) < 1.0);
        for bad in [
            json!({"inFlightSource": "shared"}),
            json!({"inFlightSource": "servers", "concurrencyMode": "tokens"}),
        ] {
            assert_eq!(
                Params::parse(&bad, "x").unwrap_err().path,
                "x.inFlightSource"
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
        assert!(p.keep(14, 0, 0));
        assert!(!p.keep(15, 0, 0));
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
