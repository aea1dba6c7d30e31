//! Per-endpoint metric snapshots, published by the scraping VM for every worker.
//!
//! Two shared-data keys: [`SNAPSHOTS_KEY`] holds every endpoint's latest snapshot in one
//! record, [`VERSION_KEY`] a small counter bumped on each publication. A picking VM reads
//! the counter (a few bytes) and fetches and decodes the record only when it changed.
//! Only the lease holder writes, once per scrape round, so there is no write contention.
//!
//! Staleness, as the reference: scorers use the last value whatever its age; an endpoint
//! whose last scrape **failed** (connect error, timeout, non-200) leaves the candidates
//! until it answers again; the pool gauges count only endpoints scraped within
//! [`POOL_FRESHNESS_MS`].

use crate::endpoint::Metrics;
use prost::Message;

/// Shared-data key of the snapshot record.
pub const SNAPSHOTS_KEY: &str = "epp.v1.snapshots";
/// Shared-data key of the publication counter.
pub const VERSION_KEY: &str = "epp.v1.snapshots.version";
/// Endpoints scraped within this window count in the `inference_pool_*` gauges (the
/// reference's `--metrics-staleness-threshold`).
pub const POOL_FRESHNESS_MS: i64 = 2_000;

/// The publication counter.
#[derive(Clone, PartialEq, Message)]
pub struct Version {
    /// Bumped on each publication.
    #[prost(uint64, tag = "1")]
    pub version: u64,
}

/// Every endpoint's snapshot.
#[derive(Clone, PartialEq, Message)]
pub struct Snapshots {
    /// The publication this is.
    #[prost(uint64, tag = "1")]
    pub version: u64,
    /// When it was published (ms).
    #[prost(int64, tag = "2")]
    pub published_ms: i64,
    /// One entry per endpoint scraped at least once.
    #[prost(message, repeated, tag = "3")]
    pub endpoints: Vec<EndpointSnapshot>,
}

/// One endpoint's state.
#[derive(Clone, PartialEq, Message)]
pub struct EndpointSnapshot {
    /// `ip:port`.
    #[prost(string, tag = "1")]
    pub address: String,
    /// Waiting requests.
    #[prost(uint64, tag = "2")]
    pub waiting: u64,
    /// Running requests.
    #[prost(uint64, tag = "3")]
    pub running: u64,
    /// KV usage 0..1.
    #[prost(double, tag = "4")]
    pub kv_usage: f64,
    /// Running LoRA adapters.
    #[prost(string, repeated, tag = "5")]
    pub active_models: Vec<String>,
    /// Waiting LoRA adapters.
    #[prost(string, repeated, tag = "6")]
    pub waiting_models: Vec<String>,
    /// `max_lora` (0: unknown).
    #[prost(uint64, tag = "7")]
    pub max_lora: u64,
    /// Block size in tokens (0: unknown).
    #[prost(uint64, tag = "8")]
    pub block_size: u64,
    /// Number of KV blocks (0: unknown).
    #[prost(uint64, tag = "9")]
    pub num_blocks: u64,
    /// Last successful scrape (ms; 0: never).
    #[prost(int64, tag = "10")]
    pub updated_ms: i64,
    /// The last scrape failed: the endpoint is not a candidate.
    #[prost(bool, tag = "11")]
    pub failing: bool,
    /// Why it failed.
    #[prost(string, tag = "12")]
    pub error: String,
    /// Requests this gateway had in flight there when the last successful scrape was sent.
    #[prost(uint64, tag = "13")]
    pub gateway_in_flight: u64,
}

impl EndpointSnapshot {
    /// A snapshot of successfully scraped metrics.
    pub fn from_metrics(address: &str, m: &Metrics) -> Self {
        Self {
            address: address.to_string(),
            waiting: m.waiting,
            running: m.running,
            kv_usage: m.kv_usage,
            active_models: m.active_models.clone(),
            waiting_models: m.waiting_models.clone(),
            max_lora: m.max_lora.unwrap_or(0),
            block_size: m.block_size.unwrap_or(0),
            num_blocks: m.num_blocks.unwrap_or(0),
            updated_ms: m.updated_ms.unwrap_or(0),
            failing: false,
            error: String::new(),
            gateway_in_flight: m.gateway_in_flight,
        }
    }

    /// The metrics the scheduler sees.
    pub fn metrics(&self) -> Metrics {
        let opt = |v: u64| (v > 0).then_some(v);
        Metrics {
            waiting: self.waiting,
            running: self.running,
            kv_usage: self.kv_usage,
            active_models: self.active_models.clone(),
            waiting_models: self.waiting_models.clone(),
            max_lora: opt(self.max_lora),
            block_size: opt(self.block_size),
            num_blocks: opt(self.num_blocks),
            updated_ms: (self.updated_ms != 0).then_some(self.updated_ms),
            gateway_in_flight: self.gateway_in_flight,
        }
    }
}

/// Pool-level aggregates for the `inference_pool_*` gauges.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PoolStats {
    /// Endpoints with fresh metrics (`inference_pool_ready_pods`).
    pub ready: u64,
    /// Mean KV usage 0..1 over fresh endpoints.
    pub average_kv: f64,
    /// Mean waiting queue over fresh endpoints.
    pub average_queue: f64,
    /// Mean running requests over fresh endpoints.
    pub average_running: f64,
}

/// Aggregates over endpoints scraped within [`POOL_FRESHNESS_MS`] of `now_ms`.
pub fn pool_stats(endpoints: &[EndpointSnapshot], now_ms: i64) -> PoolStats {
    let fresh: Vec<&EndpointSnapshot> = endpoints
        .iter()
        .filter(|e| {
            !e.failing
                && e.updated_ms != 0
                && now_ms.saturating_sub(e.updated_ms) <= POOL_FRESHNESS_MS
        })
        .collect();
    let n = fresh.len() as f64;
    if fresh.is_empty() {
        return PoolStats::default();
    }
    PoolStats {
        ready: fresh.len() as u64,
        average_kv: fresh.iter().map(|e| e.kv_usage).sum::<f64>() / n,
        average_queue: fresh.iter().map(|e| e.waiting as f64).sum::<f64>() / n,
        average_running: fresh.iter().map(|e| e.running as f64).sum::<f64>() / n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn pool_averages_use_fresh_endpoints_only() {
        let e = |a: &str, w, r, kv, t, failing| EndpointSnapshot {
            address: a.into(),
            waiting: w,
            running: r,
            kv_usage: kv,
            updated_ms: t,
            failing,
            ..EndpointSnapshot::default()
        };
        let eps = [
            e("a", 2, 4, 0.2, 10_000, false),
            e("b", 4, 6, 0.6, 9_500, false),
            e("c", 100, 100, 1.0, 5_000, false), // stale
            e("d", 100, 100, 1.0, 10_000, true), // failing
        ];
        let s = pool_stats(&eps, 10_000);
        assert_eq!(s.ready, 2);
        assert!((s.average_kv - 0.4).abs() < 1e-12);
        assert_eq!((s.average_queue, s.average_running), (3.0, 5.0));
        assert_eq!(pool_stats(&[], 0), PoolStats::default());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn snapshots_round_trip_metrics() {
        let m = Metrics {
            waiting: 1,
            running: 2,
            kv_usage: 0.5,
            block_size: Some(16),
            updated_ms: Some(7),
            gateway_in_flight: 2,
            ..Metrics::default()
        };
        let s = EndpointSnapshot::from_metrics("a", &m);
        let back = EndpointSnapshot::decode(s.encode_to_vec().as_slice()).unwrap();
        assert_eq!(back.metrics(), m);
    }
}
