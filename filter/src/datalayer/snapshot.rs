//! Per-endpoint metric snapshots, published by the scraping VM for every worker.
//!
//! Two shared-data keys: [`SNAPSHOTS_KEY`] holds every endpoint's latest snapshot in one
//! record, [`VERSION_KEY`] a small counter bumped on each publication. A picking VM reads
//! the counter (8 bytes) and fetches the record only when it changed. Only the lease
//! holder writes, once per scrape round, so there is no write contention.
//!
//! The record is read by every worker after each publication (every 50 ms by default),
//! and every endpoint's scrape time moves each round, so its layout is fixed and flat
//! ([`Snapshots::decode`]), as the in-flight ledger's: endpoints are named by their
//! 64-bit key (`crate::endpoint::key`), sorted by it, every value is a little-endian
//! number at a fixed place, and a reader keeps the bytes as they came and reads an entry
//! where it is needed: a refresh allocates nothing per endpoint.
//!
//! Hot reload: the keys carry the layout's version (`epp.v2.`). VMs of an older build
//! (still serving during a rolling plugin update in the same process) read and publish
//! the `epp.v1.` protobuf keys instead. The two never read each other's record; each
//! side's lease holder publishes only its own keys, so while the scrape lease is held by
//! the other build a VM keeps the last snapshots its own build published (none for a new
//! build's first VMs: their candidates count as never scraped until the lease passes to
//! a VM of their build, at the latest when the old VMs are gone and the lease expires).
//!
//! Staleness, as the reference: scorers use the last value whatever its age; an endpoint
//! whose last scrape **failed** (connect error, timeout, non-200) leaves the candidates
//! until it answers again; the pool gauges count only endpoints scraped within
//! [`POOL_FRESHNESS_MS`].

use crate::endpoint::Metrics;

/// Shared-data key of the snapshot record (versioned: a new layout gets a new key).
pub const SNAPSHOTS_KEY: &str = "epp.v2.snapshots";
/// Shared-data key of the publication counter (a little-endian u64).
pub const VERSION_KEY: &str = "epp.v2.snapshots.version";
/// Endpoints scraped within this window count in the `inference_pool_*` gauges (the
/// reference's `--metrics-staleness-threshold`).
pub const POOL_FRESHNESS_MS: i64 = 2_000;

/// The first 4 bytes of an encoded record: its layout's version.
const FORMAT: u32 = 2;
/// Bytes of the header: format, number of entries, version, publication time.
const HEADER_BYTES: usize = 4 + 4 + 8 + 8;
/// Bytes of one entry: key, waiting, running, KV usage, `max_lora`, block size, blocks,
/// scrape time, gateway in flight (8 each), where its LoRA names start (4), how many are
/// running and waiting (2 each), flags (2), the rendezvous prior's weight (2).
const ENTRY_BYTES: usize = 9 * 8 + 4 + 2 + 2 + 2 + 2;
/// Entry flag: the last scrape failed.
const FAILING: u16 = 1;

/// The publication counter as stored.
pub fn encode_version(version: u64) -> Vec<u8> {
    version.to_le_bytes().to_vec()
}

/// A stored publication counter; `None` when the bytes are not one.
pub fn decode_version(bytes: &[u8]) -> Option<u64> {
    bytes.first_chunk::<8>().map(|b| u64::from_le_bytes(*b))
}

/// One endpoint's state, as the lease holder keeps and publishes it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EndpointSnapshot {
    /// `ip:port`.
    pub address: String,
    /// Waiting requests.
    pub waiting: u64,
    /// Running requests.
    pub running: u64,
    /// KV usage 0..1.
    pub kv_usage: f64,
    /// Running LoRA adapters.
    pub active_models: Vec<String>,
    /// Waiting LoRA adapters.
    pub waiting_models: Vec<String>,
    /// `max_lora` (0: unknown).
    pub max_lora: u64,
    /// Block size in tokens (0: unknown).
    pub block_size: u64,
    /// Number of KV blocks (0: unknown).
    pub num_blocks: u64,
    /// Last successful scrape (ms; 0: never).
    pub updated_ms: i64,
    /// The last scrape failed: the endpoint is not a candidate.
    pub failing: bool,
    /// Requests this gateway had in flight there when the last successful scrape was sent.
    pub gateway_in_flight: u64,
    /// The rendezvous prior's weight in 1/1024 of the full weight (0: none published, read
    /// as full), set by the scraper (`super::prior_weights`).
    pub prior_weight: u16,
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
            gateway_in_flight: m.gateway_in_flight,
            prior_weight: m.prior_weight,
        }
    }
}

/// Every endpoint's snapshot as published: the stored bytes, read in place.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshots {
    bytes: Vec<u8>,
    count: usize,
}

impl Snapshots {
    /// The record of `endpoints` (any order; an endpoint listed twice is published once).
    pub fn encode(version: u64, published_ms: i64, endpoints: &[EndpointSnapshot]) -> Vec<u8> {
        let mut keyed: Vec<(u64, &EndpointSnapshot)> = endpoints
            .iter()
            .map(|e| (crate::endpoint::key(&e.address), e))
            .collect();
        keyed.sort_by_key(|(key, _)| *key);
        keyed.dedup_by_key(|(key, _)| *key);
        let names_at = HEADER_BYTES + keyed.len() * ENTRY_BYTES;
        let mut names = Vec::new();
        let mut out = Vec::with_capacity(names_at);
        let u32_of = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let u16_of = |n: usize| u16::try_from(n).unwrap_or(u16::MAX);
        out.extend_from_slice(&FORMAT.to_le_bytes());
        out.extend_from_slice(&u32_of(keyed.len()).to_le_bytes());
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&published_ms.to_le_bytes());
        for (key, e) in keyed {
            out.extend_from_slice(&key.to_le_bytes());
            out.extend_from_slice(&e.waiting.to_le_bytes());
            out.extend_from_slice(&e.running.to_le_bytes());
            out.extend_from_slice(&e.kv_usage.to_bits().to_le_bytes());
            out.extend_from_slice(&e.max_lora.to_le_bytes());
            out.extend_from_slice(&e.block_size.to_le_bytes());
            out.extend_from_slice(&e.num_blocks.to_le_bytes());
            out.extend_from_slice(&e.updated_ms.to_le_bytes());
            out.extend_from_slice(&e.gateway_in_flight.to_le_bytes());
            out.extend_from_slice(&u32_of(names_at + names.len()).to_le_bytes());
            let most = usize::from(u16::MAX);
            let (active, waiting) = (
                e.active_models.len().min(most),
                e.waiting_models.len().min(most),
            );
            out.extend_from_slice(&u16_of(active).to_le_bytes());
            out.extend_from_slice(&u16_of(waiting).to_le_bytes());
            out.extend_from_slice(&(if e.failing { FAILING } else { 0 }).to_le_bytes());
            out.extend_from_slice(&e.prior_weight.to_le_bytes());
            let listed = e.active_models.iter().take(active);
            for name in listed.chain(e.waiting_models.iter().take(waiting)) {
                let name = name.as_bytes().get(..most).unwrap_or(name.as_bytes());
                names.extend_from_slice(&u16_of(name.len()).to_le_bytes());
                names.extend_from_slice(name);
            }
        }
        out.extend_from_slice(&names);
        out
    }

    /// The record of `endpoints` as a reader sees it (tests, tools).
    pub fn of(endpoints: &[EndpointSnapshot]) -> Self {
        Self::decode(Self::encode(0, 0, endpoints)).unwrap_or_default()
    }

    /// Takes a stored record; `None` when the bytes are not a record of this layout.
    ///
    /// Layout, all little-endian: the format (u32, [`FORMAT`]), the number of entries
    /// (u32), the version (u64) and the publication time (i64, ms); then per endpoint,
    /// sorted by key, its key (u64), waiting and running requests (u64), KV usage (f64),
    /// `max_lora`, block size, number of blocks (u64; 0 unknown), the last successful
    /// scrape (i64, ms; 0 never), this gateway's in flight at that scrape (u64), where its
    /// LoRA names start (u32, from the record's start), how many are running and waiting
    /// (u16 each), flags (u16; bit 0: the last scrape failed) and the rendezvous prior's
    /// weight (u16, in 1/1024 of the full weight; 0: none published, read as full); then
    /// the names, each its length (u16) and UTF-8 bytes, running then waiting, in entry
    /// order.
    ///
    /// The weight took the upper half of what was a u32 of flags whose upper bits were
    /// always 0, so the layout's version and keys did not change: a record of an older
    /// build reads as full weights, and an older build reads a newer record's flags as
    /// before (it tests bit 0 only).
    pub fn decode(bytes: Vec<u8>) -> Option<Self> {
        let (format, rest) = bytes.split_first_chunk::<4>()?;
        let (count, _) = rest.split_first_chunk::<4>()?;
        if u32::from_le_bytes(*format) != FORMAT {
            return None;
        }
        let count = usize::try_from(u32::from_le_bytes(*count)).ok()?;
        let entries = count.checked_mul(ENTRY_BYTES)?.checked_add(HEADER_BYTES)?;
        (entries <= bytes.len()).then_some(Self { bytes, count })
    }

    /// How many endpoints it holds.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The `i`-th entry in key order.
    pub fn entry(&self, i: usize) -> Option<Entry<'_>> {
        if i >= self.count {
            return None;
        }
        let at = HEADER_BYTES + i * ENTRY_BYTES;
        let fixed = self.bytes.get(at..)?.first_chunk::<ENTRY_BYTES>()?;
        Some(Entry {
            fixed,
            record: &self.bytes,
        })
    }

    /// The entry of the endpoint with key `key`.
    pub fn get(&self, key: u64) -> Option<Entry<'_>> {
        self.find(key, usize::MAX).map(|(_, e)| e)
    }

    /// The entry of `key` and its position, looked for first at position `hint` (where it
    /// was in an earlier record: the same endpoints keep their positions), then by
    /// binary search.
    pub fn find(&self, key: u64, hint: usize) -> Option<(usize, Entry<'_>)> {
        if let Some(e) = self.entry(hint).filter(|e| e.key() == key) {
            return Some((hint, e));
        }
        let (mut lo, mut hi) = (0, self.count);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let e = self.entry(mid)?;
            match e.key().cmp(&key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some((mid, e)),
            }
        }
        None
    }

    /// Every entry, in key order.
    pub fn entries(&self) -> impl Iterator<Item = Entry<'_>> {
        (0..self.count).map_while(|i| self.entry(i))
    }
}

/// One endpoint's snapshot inside a record.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    fixed: &'a [u8; ENTRY_BYTES],
    record: &'a [u8],
}

impl<'a> Entry<'a> {
    fn u64_at(&self, at: usize) -> u64 {
        self.fixed
            .get(at..)
            .and_then(|b| b.first_chunk::<8>())
            .map_or(0, |b| u64::from_le_bytes(*b))
    }

    fn u32_at(&self, at: usize) -> u32 {
        self.fixed
            .get(at..)
            .and_then(|b| b.first_chunk::<4>())
            .map_or(0, |b| u32::from_le_bytes(*b))
    }

    fn u16_at(&self, at: usize) -> u16 {
        self.fixed
            .get(at..)
            .and_then(|b| b.first_chunk::<2>())
            .map_or(0, |b| u16::from_le_bytes(*b))
    }

    /// The endpoint's key.
    pub fn key(&self) -> u64 {
        self.u64_at(0)
    }

    /// Waiting requests.
    pub fn waiting(&self) -> u64 {
        self.u64_at(8)
    }

    /// Running requests.
    pub fn running(&self) -> u64 {
        self.u64_at(16)
    }

    /// KV usage 0..1.
    pub fn kv_usage(&self) -> f64 {
        f64::from_bits(self.u64_at(24))
    }

    /// Last successful scrape (ms; 0: never).
    pub fn updated_ms(&self) -> i64 {
        self.u64_at(56) as i64
    }

    /// Requests this gateway had in flight there when the last successful scrape was sent.
    pub fn gateway_in_flight(&self) -> u64 {
        self.u64_at(64)
    }

    /// The last scrape failed: the endpoint is not a candidate.
    pub fn failing(&self) -> bool {
        self.u16_at(80) & FAILING != 0
    }

    /// The rendezvous prior's weight, in 1/1024 of the full weight (0: none published).
    pub fn prior_weight(&self) -> u16 {
        self.u16_at(82)
    }

    /// Running LoRA adapters, then waiting ones (a name that is not UTF-8 reads as "").
    fn names(&self) -> (Names<'a>, Names<'a>) {
        let at = usize::try_from(self.u32_at(72)).unwrap_or(usize::MAX);
        let rest = self.record.get(at..).unwrap_or_default();
        let active = Names {
            rest,
            left: self.u16_at(76),
        };
        let waiting = Names {
            rest: active.clone().skipped(),
            left: self.u16_at(78),
        };
        (active, waiting)
    }

    /// The metrics the scheduler sees.
    pub fn metrics(&self) -> Metrics {
        let mut m = Metrics::default();
        self.write_metrics(&mut m);
        m
    }

    /// Sets `m` to [`Entry::metrics`] in place: the LoRA lists are rebuilt only when
    /// their names changed.
    pub fn write_metrics(&self, m: &mut Metrics) {
        let opt = |v: u64| (v > 0).then_some(v);
        let updated_ms = self.updated_ms();
        m.waiting = self.waiting();
        m.running = self.running();
        m.kv_usage = self.kv_usage();
        m.max_lora = opt(self.u64_at(32));
        m.block_size = opt(self.u64_at(40));
        m.num_blocks = opt(self.u64_at(48));
        m.updated_ms = (updated_ms != 0).then_some(updated_ms);
        m.gateway_in_flight = self.gateway_in_flight();
        m.prior_weight = self.prior_weight();
        let no_names = self.u32_at(76) == 0;
        if no_names && m.active_models.is_empty() && m.waiting_models.is_empty() {
            return;
        }
        let (active, waiting) = self.names();
        set_names(&mut m.active_models, active);
        set_names(&mut m.waiting_models, waiting);
    }
}

/// LoRA names in a record: `left` more, each a u16 length and its bytes.
#[derive(Debug, Clone)]
struct Names<'a> {
    rest: &'a [u8],
    left: u16,
}

impl<'a> Names<'a> {
    /// What follows these names in the record.
    fn skipped(mut self) -> &'a [u8] {
        while self.next().is_some() {}
        self.rest
    }
}

impl<'a> Iterator for Names<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        self.left = self.left.checked_sub(1)?;
        let (len, rest) = self.rest.split_first_chunk::<2>()?;
        let len = usize::from(u16::from_le_bytes(*len));
        let name = rest.get(..len)?;
        self.rest = rest.get(len..)?;
        Some(std::str::from_utf8(name).unwrap_or(""))
    }
}

fn set_names(to: &mut Vec<String>, names: Names<'_>) {
    if !names.clone().eq(to.iter().map(String::as_str)) {
        to.clear();
        to.extend(names.map(str::to_string));
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
pub fn pool_stats<'a>(
    endpoints: impl IntoIterator<Item = &'a EndpointSnapshot>,
    now_ms: i64,
) -> PoolStats {
    let fresh: Vec<&EndpointSnapshot> = endpoints
        .into_iter()
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
    use crate::endpoint::key;
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
    fn every_endpoint_reads_back_with_its_metrics() {
        let lora = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let full = Metrics {
            waiting: 1,
            running: 2,
            kv_usage: 0.5,
            active_models: lora(&["a", "bb"]),
            waiting_models: lora(&["ccc"]),
            max_lora: Some(4),
            block_size: Some(16),
            num_blocks: Some(1024),
            updated_ms: Some(7),
            gateway_in_flight: 2,
            prior_weight: 768,
        };
        let bare = Metrics {
            waiting: 9,
            updated_ms: Some(8),
            ..Metrics::default()
        };
        let eps: Vec<EndpointSnapshot> = (0..40)
            .map(|i| {
                let m = if i % 2 == 0 { &full } else { &bare };
                EndpointSnapshot {
                    failing: i % 5 == 0,
                    ..EndpointSnapshot::from_metrics(&format!("10.0.0.{i}:8000"), m)
                }
            })
            .collect();
        let bytes = Snapshots::encode(3, 99, &eps);
        let s = Snapshots::decode(bytes).unwrap();
        assert_eq!(s.len(), 40);
        for (i, e) in eps.iter().enumerate() {
            let found = s.get(key(&e.address)).unwrap();
            let m = if i % 2 == 0 { &full } else { &bare };
            assert_eq!(&found.metrics(), m, "endpoint {i}");
            assert_eq!(found.failing(), i % 5 == 0);
        }
        assert!(s.get(key("10.0.0.99:8000")).is_none());
        // A position from an older record is only a hint.
        let k = key(&eps[3].address);
        assert_eq!(s.find(k, 0).map(|(_, e)| e.key()), Some(k));
        let (at, _) = s.find(k, usize::MAX).unwrap();
        assert_eq!(s.find(k, at).map(|(i, _)| i), Some(at));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn lora_lists_are_rewritten_only_when_their_names_change() {
        let mut m = Metrics {
            active_models: vec!["a".into()],
            ..Metrics::default()
        };
        let kept = m.active_models.as_ptr();
        let snap = |active: &[&str]| {
            Snapshots::of(&[EndpointSnapshot {
                address: "x:1".into(),
                active_models: active.iter().map(|n| n.to_string()).collect(),
                ..EndpointSnapshot::default()
            }])
        };
        let same = snap(&["a"]);
        same.entry(0).unwrap().write_metrics(&mut m);
        assert_eq!(m.active_models, ["a"]);
        assert_eq!(
            m.active_models.as_ptr(),
            kept,
            "the same names: not rebuilt"
        );
        snap(&["a", "b"]).entry(0).unwrap().write_metrics(&mut m);
        assert_eq!(m.active_models, ["a", "b"]);
        snap(&[]).entry(0).unwrap().write_metrics(&mut m);
        assert!(m.active_models.is_empty());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn an_older_builds_record_reads_as_full_weight_and_its_flags_as_before() {
        let e = |failing, prior_weight| EndpointSnapshot {
            address: "10.0.0.1:8000".into(),
            failing,
            prior_weight,
            ..EndpointSnapshot::default()
        };
        // An older build wrote the flags as a u32: the weight's bytes were 0.
        let older = Snapshots::encode(1, 1, &[e(true, 0)]);
        let s = Snapshots::decode(older.clone()).unwrap();
        let entry = s.entry(0).unwrap();
        assert!(entry.failing());
        assert_eq!(entry.metrics().prior_weight, 0, "none published: full");
        // A newer record, read as an older build reads its flags (a u32, bit 0).
        let newer = Snapshots::encode(1, 1, &[e(true, 256)]);
        let flags = |b: &[u8]| {
            let at = HEADER_BYTES + ENTRY_BYTES - 4;
            u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
        };
        assert_eq!(flags(&newer) & 1, 1);
        assert_eq!(flags(&older), 1);
        let s = Snapshots::decode(newer).unwrap();
        assert_eq!(s.entry(0).unwrap().prior_weight(), 256);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_record_of_another_layout_or_truncated_is_refused() {
        let bytes = Snapshots::encode(1, 1, &[EndpointSnapshot::default()]);
        assert!(Snapshots::decode(bytes.clone()).is_some());
        assert!(Snapshots::decode(bytes[..bytes.len() - 1].to_vec()).is_none());
        let mut other = bytes;
        other[0] = 1;
        assert!(Snapshots::decode(other).is_none());
        assert!(Snapshots::decode(Vec::new()).is_none());
        assert_eq!(decode_version(&encode_version(42)), Some(42));
        assert_eq!(decode_version(&[1, 2]), None);
    }
}
