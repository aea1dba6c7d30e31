//! The pool's endpoints as data: an endpoint of the configuration, the metrics the data
//! layer scrapes for it, and a candidate as the scheduler sees it (endpoint + metrics +
//! requests in flight through this gateway). Plain data; a leaf that imports nothing
//! else of the crate.

use std::collections::BTreeMap;

/// One model-server endpoint of the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `ip:port`, as written into `x-gateway-destination-endpoint`.
    pub address: String,
    /// Labels (role, engine type, zone, ...), used by label filters and metric mapping.
    pub labels: BTreeMap<String, String>,
}

/// Model-server metrics of one endpoint, as the data layer publishes them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Metrics {
    /// Requests waiting in the engine's queue (`num_requests_waiting`).
    pub waiting: u64,
    /// Requests running (`num_requests_running`).
    pub running: u64,
    /// KV-cache usage, 0..1 (`kv_cache_usage_perc`).
    pub kv_usage: f64,
    /// LoRA adapters running.
    pub active_models: Vec<String>,
    /// LoRA adapters waiting.
    pub waiting_models: Vec<String>,
    /// `max_lora`.
    pub max_lora: Option<u64>,
    /// KV block size in tokens (`cache_config_info{block_size}`).
    pub block_size: Option<u64>,
    /// KV blocks (`cache_config_info{num_gpu_blocks}`).
    pub num_blocks: Option<u64>,
    /// When the metrics were scraped (ms); `None` if never.
    pub updated_ms: Option<i64>,
    /// Requests this gateway had in flight there when the scrape was sent: the part of
    /// `running + waiting` that is its own (see [`Metrics::other_load`]).
    pub gateway_in_flight: u64,
    /// The rendezvous prior's weight in 1/1024 of the full weight, as the scraper
    /// published it from the servers' load (`crate::datalayer::prior_weights`); 0: none
    /// published, read as full.
    pub prior_weight: u16,
}

impl Metrics {
    /// Requests at the server, by its last scrape, beyond this gateway's own in flight
    /// there at that moment: what other gateway replicas (or clients bypassing the
    /// gateway) sent. Every replica scrapes the same servers, so this is how one replica
    /// sees the others' load without a shared store. 0 when never scraped.
    pub fn other_load(&self) -> u64 {
        if self.updated_ms.is_none() {
            return 0;
        }
        other_requests(self.running, self.waiting, self.gateway_in_flight)
    }
}

/// A server's `running + waiting` beyond `own`, the requests this gateway had in flight
/// there when it was scraped (never below 0: a request this gateway just sent may not
/// have arrived yet).
pub fn other_requests(running: u64, waiting: u64, own: u64) -> u64 {
    running.saturating_add(waiting).saturating_sub(own)
}

/// The 64-bit key that names the endpoint at `address` in shared records (the in-flight
/// ledger, `crate::inflight`): its xxh64. Two addresses of one pool sharing a key is as
/// likely as a random 64-bit collision, about 1 in 10^13 for 500 endpoints.
pub fn key(address: &str) -> u64 {
    xxhash_rust::xxh64::xxh64(address.as_bytes(), KEY_SEED)
}

const KEY_SEED: u64 = 0x6570_705f_6c65_6467;

/// A map keyed by endpoint [`key`]s. The keys are already uniform 64-bit hashes, so the
/// map uses each as its own hash ([`KeyHasher`]) instead of hashing it again: a lookup
/// per candidate per pick costs a probe, not a hash.
pub type KeyMap<V> = hashbrown::HashMap<u64, V, std::hash::BuildHasherDefault<KeyHasher>>;

/// The hasher of [`KeyMap`], and of any map whose keys are uniform 64-bit hashes already:
/// a `u64` is its own hash (other input, which such a map never hashes, is folded in byte
/// by byte).
#[derive(Debug, Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// An endpoint the scheduler may choose.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Candidate {
    /// `ip:port`.
    pub address: String,
    /// [`key`] of the address, computed once where the candidate is built; 0 when not
    /// computed ([`Candidate::key`] then hashes the address).
    pub key: u64,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its latest metrics.
    pub metrics: Metrics,
    /// Requests in flight through this gateway (all workers).
    pub in_flight: u64,
    /// Estimated tokens in flight through this gateway (all workers).
    pub in_flight_tokens: u64,
    /// Of `in_flight`, requests still in prefill (no response chunk yet; counted only
    /// with a latency producer).
    pub prefilling: u64,
    /// Their uncached input tokens: the prefill work queued ahead of a new request.
    pub prefill_tokens: u64,
}

impl Candidate {
    /// Requests waiting at the engine, as well as we know now: the scraped queue, or, when
    /// this gateway has more requests in flight there than the engine reported running,
    /// the excess (dispatches made since the last scrape, which it cannot show yet; the
    /// idea of llm-d PR #2066). Without it a burst between two scrapes sees equal queues
    /// everywhere and piles onto one endpoint.
    pub fn waiting_estimate(&self) -> u64 {
        self.metrics
            .waiting
            .max(self.in_flight.saturating_sub(self.metrics.running))
    }

    /// A candidate with an address and nothing else.
    pub fn new(address: &str) -> Self {
        Self {
            address: address.to_string(),
            key: key(address),
            ..Self::default()
        }
    }

    /// The address's [`key`].
    pub fn key(&self) -> u64 {
        if self.key != 0 {
            self.key
        } else {
            key(&self.address)
        }
    }
}
