//! Saturation detectors: how full the pool is. A value ≥ 1.0 means saturated (dispatch
//! halts); values above 1 measure the depth of overload.

pub mod concurrency;
pub mod utilization;

use crate::config::ConfigError;
use serde_json::Value;

/// One endpoint's scraped load, as the utilization detector reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EndpointLoad {
    /// Requests waiting in the model server's queue, plus those the gateway sent since
    /// the scrape (which the scrape cannot show yet).
    pub waiting: f64,
    /// KV-cache usage, 0..1.
    pub kv_usage: f64,
    /// When the metrics were scraped (ms); `None` if never.
    pub updated_ms: Option<u64>,
    /// Requests at the server, by the scrape, that other gateway replicas sent
    /// (`Metrics::other_load`; read by `concurrency-detector` with `inFlightSource: servers`).
    pub other_requests: u64,
    /// This gateway's requests in flight there when the scrape was sent.
    pub own_at_scrape: u64,
}

impl EndpointLoad {
    /// The load of an endpoint with `waiting` requests queued and `kv_usage` KV use,
    /// scraped at `updated_ms` (`None`: never scraped, or its scrape failed).
    pub fn scraped(waiting: u64, kv_usage: f64, updated_ms: Option<i64>) -> Self {
        Self {
            waiting: waiting as f64,
            kv_usage,
            updated_ms: updated_ms.and_then(|t| u64::try_from(t).ok()),
            other_requests: 0,
            own_at_scrape: 0,
        }
    }

    /// The same load with `n` requests of other gateway replicas at the server.
    pub fn with_other_requests(self, n: u64) -> Self {
        Self {
            other_requests: n,
            ..self
        }
    }

    /// The same load with `n` requests of this gateway there at the scrape.
    pub fn with_own_at_scrape(self, n: u64) -> Self {
        Self {
            own_at_scrape: n,
            ..self
        }
    }

    /// The load of an endpoint whose metrics are unknown (reads as never scraped).
    pub const UNKNOWN: Self = Self {
        waiting: 0.0,
        kv_usage: 0.0,
        updated_ms: None,
        other_requests: 0,
        own_at_scrape: 0,
    };
}

/// `loads` with the requests dispatched since each endpoint's scrape added to its queue:
/// `unseen(t)` is how many the gateway dispatched after time `t` (pool-wide; which
/// endpoint each went to is decided later, so each endpoint takes an equal share). Without
/// this, a dispatch cycle between two scrapes sees the old queues and can release far more
/// than the pool has room for. An endpoint never scraped is left as it is (it already
/// reads as saturated).
pub fn with_unseen(loads: &[EndpointLoad], unseen: impl Fn(u64) -> u64) -> Vec<EndpointLoad> {
    let share = 1.0 / loads.len().max(1) as f64;
    loads
        .iter()
        .map(|l| match l.updated_ms {
            Some(t) => EndpointLoad {
                waiting: l.waiting + unseen(t) as f64 * share,
                ..*l
            },
            None => *l,
        })
        .collect()
}

/// The pool as the detectors see it at one instant.
#[derive(Debug, Clone, Copy)]
pub struct PoolLoad<'a> {
    /// Scraped load of every candidate endpoint.
    pub endpoints: &'a [EndpointLoad],
    /// Number of endpoints in the pool (for capacity-based detectors).
    pub endpoint_count: usize,
    /// Endpoints a request could be sent to now (not failing): with none, nothing can be
    /// dispatched whatever the detector says ([`EMPTY_POOL`]).
    pub available: usize,
    /// Requests dispatched by the gateway and not finished, pool-wide.
    pub in_flight_requests: u64,
    /// Their estimated tokens.
    pub in_flight_tokens: u64,
    /// Now (ms).
    pub now_ms: u64,
}

/// The saturation of a pool with no endpoint to send to: above any ceiling, so requests
/// wait (scale from zero, an outage of every endpoint). Reported as 1.0, as the reference
/// reports an empty pool ([`reported`]).
pub const EMPTY_POOL: f64 = f64::INFINITY;

/// The value to report for a saturation: an empty pool reads 1.0.
pub fn reported(saturation: f64) -> f64 {
    if saturation.is_finite() {
        saturation
    } else {
        1.0
    }
}

/// A configured detector.
#[derive(Debug, Clone, PartialEq)]
pub enum Detector {
    /// `utilization-detector` (the default).
    Utilization(utilization::Params),
    /// `concurrency-detector`.
    Concurrency(concurrency::Params),
}

impl Default for Detector {
    fn default() -> Self {
        Detector::Utilization(utilization::Params::default())
    }
}

impl Detector {
    /// Every detector type name, for error messages.
    pub const TYPES: [&'static str; 2] = [utilization::TYPE, concurrency::TYPE];

    /// Builds a detector from its plugin type and parameters; `path` names the
    /// parameters in errors.
    pub fn from_plugin(
        type_name: &str,
        params: &Value,
        path: &str,
    ) -> Result<Option<Self>, ConfigError> {
        Ok(match type_name {
            utilization::TYPE => Some(Self::Utilization(utilization::Params::parse(params, path)?)),
            concurrency::TYPE => Some(Self::Concurrency(concurrency::Params::parse(params, path)?)),
            _ => None,
        })
    }

    /// The detector's type name (metric label `detector`).
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Utilization(_) => utilization::TYPE,
            Self::Concurrency(_) => concurrency::TYPE,
        }
    }

    /// Endpoints whose metrics are missing or stale for this detector (`None`: it reads
    /// no model-server metrics).
    pub fn stale(&self, pool: &PoolLoad<'_>) -> Option<u64> {
        match self {
            Self::Utilization(p) => Some(p.stale(pool.endpoints, pool.now_ms)),
            Self::Concurrency(_) => None,
        }
    }

    /// The pool's saturation ([`EMPTY_POOL`] when no endpoint is available).
    pub fn saturation(&self, pool: &PoolLoad<'_>) -> f64 {
        if pool.available == 0 {
            return EMPTY_POOL;
        }
        match self {
            Self::Utilization(p) => p.saturation(pool.endpoints, pool.now_ms),
            Self::Concurrency(p) => p.saturation(pool),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn dispatches_after_a_scrape_raise_the_utilization_it_reads() {
        let loads = [
            EndpointLoad::scraped(2, 0.1, Some(1_000)),
            EndpointLoad::scraped(2, 0.1, Some(1_050)),
        ];
        let detector = Detector::default(); // queueDepthThreshold 5
        let pool = |l: &[EndpointLoad]| {
            detector.saturation(&PoolLoad {
                endpoints: l,
                endpoint_count: 2,
                available: 2,
                in_flight_requests: 0,
                in_flight_tokens: 0,
                now_ms: 1_100,
            })
        };
        assert!(pool(&loads) < 1.0);
        // Six dispatches at 1_060: both scrapes predate them, each endpoint takes three.
        let dispatched = [1_060_u64; 6];
        let unseen = |t: u64| dispatched.iter().filter(|d| **d > t).count() as u64;
        let adjusted = with_unseen(&loads, unseen);
        assert_eq!(adjusted[0].waiting, 5.0);
        assert_eq!(adjusted[1].waiting, 5.0);
        assert!(
            pool(&adjusted) >= 1.0,
            "the pool reads full after the burst"
        );
        // A scrape after the dispatches already shows them: nothing is added.
        let fresh = [EndpointLoad::scraped(5, 0.1, Some(1_070))];
        assert_eq!(with_unseen(&fresh, unseen)[0].waiting, 5.0);
        // Never scraped: unchanged.
        assert_eq!(
            with_unseen(&[EndpointLoad::UNKNOWN], |_| 9)[0],
            EndpointLoad::UNKNOWN
        );
    }
}
