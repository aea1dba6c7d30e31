//! Requests in flight per endpoint, counted across every Envoy worker.
//!
//! One shared-data record (key [`LEDGER_KEY`]) holds a row per worker VM with that
//! VM's requests and estimated tokens in flight per endpoint. A pick
//! ([`acquire_with`], used by `crate::routing`) reads the record, sums the live rows into
//! the candidates, lets the scheduler choose and adds the request to its own row, all in
//! one CAS write, so two workers picking at the same instant cannot both see the same free
//! endpoint. A release subtracts from the row of the VM that acquired (streams never
//! move between workers). This count covers every request routed upstream; flow control
//! keeps its own count of the requests it dispatched (`crate::flow_control::state`).
//!
//! A VM that crashes (`FAIL_RELOAD`) leaves its row behind; rows not refreshed for
//! [`WORKER_STALE_MS`] are dropped, so a dead VM's counts do not stick forever. Live
//! VMs refresh their row from their tick ([`heartbeat`]); rows with nothing in flight
//! are removed, which keeps the record small.
//!
//! The record is read and written twice per request, so its layout is fixed and flat
//! ([`Ledger::decode`]): endpoints are named by a 64-bit hash of their address
//! ([`endpoint_key`], kept with each candidate), every count is a little-endian integer
//! at a fixed place, and nothing is allocated per endpoint; so are the passive-health
//! records, after the rows.

use crate::config::PassiveHealth;
pub use crate::endpoint::key as endpoint_key;
use crate::health::{self, EndpointHealth, Outcome};
use crate::shared_store::{update_record, SharedStore, StoreError};

/// The type name of the reference's in-flight load producer: accepted in
/// `EndpointPickerConfig`; this ledger is what it produces, always on.
pub const PRODUCER_TYPE: &str = "inflight-load-producer";

/// Shared-data key of the ledger (versioned: a new layout gets a new key).
pub const LEDGER_KEY: &str = "epp.v2.inflight";
/// A row not refreshed for this long belongs to a dead VM.
pub const WORKER_STALE_MS: i64 = 5_000;

/// The first 4 bytes of an encoded ledger: its layout's version.
const FORMAT: u32 = 2;
/// Bytes of one row's header: VM id, last seen, number of counts.
const ROW_BYTES: usize = 8 + 8 + 4;
/// Bytes of one endpoint's counts: key, requests, prefilling, tokens, prefill tokens.
const COUNT_BYTES: usize = 8 + 4 + 4 + 8 + 8;
/// Bytes of one passive-health record: key, failures in a row, ejections, ejected until,
/// last failure.
const HEALTH_BYTES: usize = 8 + 4 + 4 + 8 + 8;

/// The whole ledger, as stored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ledger {
    /// One row per worker VM with requests in flight.
    pub workers: Vec<WorkerRow>,
    /// Passive health: endpoints with recent failures or ejections (`crate::health`),
    /// written with the releases that report them, read by every pick.
    pub health: Vec<EndpointHealth>,
}

/// One VM's share of the in-flight requests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerRow {
    /// The VM's process-unique id.
    pub vm: u64,
    /// When the VM last wrote or refreshed the row (ms, host clock).
    pub seen_ms: i64,
    /// In-flight count per endpoint.
    pub counts: Vec<EndpointCount>,
}

/// In-flight requests of one VM on one endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EndpointCount {
    /// The endpoint's [`endpoint_key`].
    pub endpoint: u64,
    /// Requests in flight.
    pub in_flight: u32,
    /// Estimated tokens of those requests (token-load scorer, affinity TTFT gate).
    pub tokens: u64,
    /// Of those, requests still in prefill: dispatched, no response chunk yet (kept
    /// only with a latency producer, which reports the first chunks).
    pub prefilling: u32,
    /// Uncached input tokens of the requests still in prefill: the prefill work queued
    /// at the engine ahead of a new request.
    pub prefill_tokens: u64,
}

/// What this gateway has in flight on one endpoint, over every live VM.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    /// Requests in flight.
    pub requests: u64,
    /// Their estimated tokens.
    pub tokens: u64,
    /// Requests still in prefill (no response chunk yet).
    pub prefilling: u64,
    /// Their uncached input tokens.
    pub prefill_tokens: u64,
}

/// What is in flight per endpoint key over every live VM ([`Ledger::loads`]): a small
/// open-addressing table (linear probing, at most half full). Endpoint keys are uniform
/// 64-bit hashes, so each is its own hash: a pick's lookup per candidate is a masked
/// index and a compare or two.
#[derive(Debug, Clone, Default)]
pub struct Loads {
    slots: Vec<Option<(u64, Load)>>,
}

impl Loads {
    /// An empty table with room for `n` endpoints.
    fn with_room_for(n: usize) -> Self {
        let size = n.saturating_mul(2).max(1).next_power_of_two();
        Self {
            slots: vec![None; size],
        }
    }

    /// The slot holding `key`, or the empty one where it goes (`None` for a table
    /// without slots). Terminates: at least half the slots are empty.
    fn slot(&self, key: u64) -> Option<usize> {
        let mask = self.slots.len().checked_sub(1)?;
        let mut i = usize::try_from(key & mask as u64).unwrap_or(0);
        loop {
            match self.slots.get(i)? {
                Some((k, _)) if *k != key => i = (i + 1) & mask,
                _ => return Some(i),
            }
        }
    }

    /// `key`'s load, added as zero when absent.
    fn entry(&mut self, key: u64) -> Option<&mut Load> {
        let i = self.slot(key)?;
        let (_, load) = self.slots.get_mut(i)?.get_or_insert((key, Load::default()));
        Some(load)
    }

    /// What is in flight on the endpoint with key `key`, if anything.
    pub fn get(&self, key: u64) -> Option<&Load> {
        let i = self.slot(key)?;
        self.slots.get(i)?.as_ref().map(|(_, load)| load)
    }

    /// Every endpoint with something in flight, and its load.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Load)> {
        self.slots.iter().flatten().map(|(key, load)| (*key, load))
    }

    /// The load of every endpoint with something in flight.
    pub fn values(&self) -> impl Iterator<Item = &Load> {
        self.iter().map(|(_, load)| load)
    }
}

/// Reads little-endian integers off the front of a byte slice.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
    fn i64(&mut self) -> Option<i64> {
        self.take().map(i64::from_le_bytes)
    }
}

impl Ledger {
    /// Decodes a stored ledger; empty bytes are the empty ledger (the record as created at
    /// configure time). `None` when the bytes are not a ledger of this layout.
    ///
    /// Layout, all little-endian: the format (u32, [`FORMAT`]) and the number of rows
    /// (u32); per row the VM (u64), its last write (i64, ms) and its number of counts
    /// (u32), then per count the endpoint key (u64), requests (u32), prefilling (u32),
    /// tokens (u64) and prefill tokens (u64); then the number of passive-health records
    /// (u32) and per record the endpoint key (u64), failures in a row (u32), ejections
    /// (u32), ejected until (i64, ms) and the last failure (i64, ms); nothing after.
    pub fn decode(bytes: &[u8]) -> Option<Ledger> {
        if bytes.is_empty() {
            return Some(Ledger::default());
        }
        let mut r = Reader(bytes);
        if r.u32()? != FORMAT {
            return None;
        }
        let rows = usize::try_from(r.u32()?).ok()?;
        // Every row takes at least its header: a corrupt count cannot reserve much.
        // One spare place per list: a pick may add its row or its endpoint.
        let mut workers = Vec::with_capacity(rows.min(r.0.len() / ROW_BYTES) + 1);
        for _ in 0..rows {
            let vm = r.u64()?;
            let seen_ms = r.i64()?;
            let n = usize::try_from(r.u32()?).ok()?;
            let mut counts = Vec::with_capacity(n.min(r.0.len() / COUNT_BYTES) + 1);
            for _ in 0..n {
                counts.push(EndpointCount {
                    endpoint: r.u64()?,
                    in_flight: r.u32()?,
                    prefilling: r.u32()?,
                    tokens: r.u64()?,
                    prefill_tokens: r.u64()?,
                });
            }
            workers.push(WorkerRow {
                vm,
                seen_ms,
                counts,
            });
        }
        let n = usize::try_from(r.u32()?).ok()?;
        let mut health = Vec::with_capacity(n.min(r.0.len() / HEALTH_BYTES) + 1);
        for _ in 0..n {
            health.push(EndpointHealth {
                endpoint: r.u64()?,
                consecutive_failures: r.u32()?,
                ejections: r.u32()?,
                ejected_until_ms: r.i64()?,
                last_failure_ms: r.i64()?,
            });
        }
        if !r.0.is_empty() {
            return None;
        }
        Some(Ledger { workers, health })
    }

    /// The stored form ([`Ledger::decode`] reads it back).
    pub fn encode(&self) -> Vec<u8> {
        let counts: usize = self.workers.iter().map(|w| w.counts.len()).sum();
        let mut out = Vec::with_capacity(
            12 + self.workers.len() * ROW_BYTES
                + counts * COUNT_BYTES
                + self.health.len() * HEALTH_BYTES,
        );
        let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes();
        out.extend_from_slice(&FORMAT.to_le_bytes());
        out.extend_from_slice(&len(self.workers.len()));
        for w in &self.workers {
            out.extend_from_slice(&w.vm.to_le_bytes());
            out.extend_from_slice(&w.seen_ms.to_le_bytes());
            out.extend_from_slice(&len(w.counts.len()));
            for c in &w.counts {
                out.extend_from_slice(&c.endpoint.to_le_bytes());
                out.extend_from_slice(&c.in_flight.to_le_bytes());
                out.extend_from_slice(&c.prefilling.to_le_bytes());
                out.extend_from_slice(&c.tokens.to_le_bytes());
                out.extend_from_slice(&c.prefill_tokens.to_le_bytes());
            }
        }
        out.extend_from_slice(&len(self.health.len()));
        for h in &self.health {
            out.extend_from_slice(&h.endpoint.to_le_bytes());
            out.extend_from_slice(&h.consecutive_failures.to_le_bytes());
            out.extend_from_slice(&h.ejections.to_le_bytes());
            out.extend_from_slice(&h.ejected_until_ms.to_le_bytes());
            out.extend_from_slice(&h.last_failure_ms.to_le_bytes());
        }
        out
    }

    /// Requests in flight on `endpoint` (its address), over every live VM.
    pub fn in_flight(&self, endpoint: &str) -> u64 {
        self.load(endpoint).requests
    }

    /// Everything in flight on `endpoint` (its address), over every live VM.
    pub fn load(&self, endpoint: &str) -> Load {
        self.loads()
            .get(endpoint_key(endpoint))
            .copied()
            .unwrap_or_default()
    }

    /// Everything in flight per endpoint key, over every live VM.
    pub fn loads(&self) -> Loads {
        let counts = self.workers.iter().map(|w| w.counts.len()).sum();
        let mut out = Loads::with_room_for(counts);
        for c in self.workers.iter().flat_map(|w| w.counts.iter()) {
            if let Some(e) = out.entry(c.endpoint) {
                e.requests += u64::from(c.in_flight);
                e.tokens += c.tokens;
                e.prefilling += u64::from(c.prefilling.min(c.in_flight));
                e.prefill_tokens += c.prefill_tokens;
            }
        }
        out
    }

    /// Requests and tokens in flight over every endpoint and live VM.
    pub fn total(&self) -> (u64, u64) {
        self.workers
            .iter()
            .flat_map(|w| w.counts.iter())
            .fold((0, 0), |(r, t), c| {
                (r + u64::from(c.in_flight), t + c.tokens)
            })
    }

    /// Adds `delta` requests of `tokens` uncached input tokens to `vm`'s prefill count
    /// on `endpoint` (its key; never below zero, never above its in-flight count). Nothing
    /// when the VM has nothing in flight there (the request was already released).
    pub fn add_prefill(&mut self, vm: u64, endpoint: u64, delta: i64, tokens: i64) {
        let Some(c) = self
            .workers
            .iter_mut()
            .filter(|w| w.vm == vm)
            .flat_map(|w| w.counts.iter_mut())
            .find(|c| c.endpoint == endpoint)
        else {
            return;
        };
        let n = i64::from(c.prefilling).saturating_add(delta).max(0);
        c.prefilling = u32::try_from(n).unwrap_or(u32::MAX).min(c.in_flight);
        let t = i64::try_from(c.prefill_tokens)
            .unwrap_or(i64::MAX)
            .saturating_add(tokens)
            .max(0);
        c.prefill_tokens = if c.prefilling == 0 {
            0
        } else {
            u64::try_from(t).unwrap_or(0)
        };
    }

    /// Drops the rows of VMs not seen for [`WORKER_STALE_MS`].
    pub fn drop_stale(&mut self, now_ms: i64) {
        self.workers
            .retain(|w| now_ms.saturating_sub(w.seen_ms) < WORKER_STALE_MS);
    }

    /// Adds `delta` to `vm`'s count on `endpoint` (its key; never below zero) and
    /// refreshes the row.
    pub fn add(&mut self, vm: u64, endpoint: u64, delta: i64, now_ms: i64) {
        self.add_with_tokens(vm, endpoint, delta, 0, now_ms);
    }

    /// Like [`Ledger::add`], also adding `tokens` (may be negative) to the token count.
    pub fn add_with_tokens(
        &mut self,
        vm: u64,
        endpoint: u64,
        delta: i64,
        tokens: i64,
        now_ms: i64,
    ) {
        let pos = match self.workers.iter().position(|w| w.vm == vm) {
            Some(p) => p,
            None => {
                self.workers.push(WorkerRow {
                    vm,
                    seen_ms: now_ms,
                    counts: Vec::new(),
                });
                self.workers.len() - 1
            }
        };
        let Some(row) = self.workers.get_mut(pos) else {
            return;
        };
        row.seen_ms = now_ms;
        let idx = match row.counts.iter().position(|c| c.endpoint == endpoint) {
            Some(i) => i,
            None => {
                row.counts.push(EndpointCount {
                    endpoint,
                    ..EndpointCount::default()
                });
                row.counts.len() - 1
            }
        };
        if let Some(c) = row.counts.get_mut(idx) {
            let next = i64::from(c.in_flight).saturating_add(delta).max(0);
            c.in_flight = u32::try_from(next).unwrap_or(u32::MAX);
            let t = i64::try_from(c.tokens)
                .unwrap_or(i64::MAX)
                .saturating_add(tokens)
                .max(0);
            c.tokens = u64::try_from(t).unwrap_or(0);
            // A release may leave `prefilling` above `in_flight` until the request's
            // prefill is reported over (`first_chunk`); readers take the minimum.
            if c.in_flight == 0 {
                c.tokens = 0;
            }
            if c.prefilling == 0 {
                c.prefill_tokens = 0;
            }
        }
        row.counts.retain(|c| c.in_flight > 0);
        self.workers.retain(|w| !w.counts.is_empty());
    }
}

/// Reads the ledger; the empty ledger when it was never written.
pub fn read(store: &impl SharedStore) -> Result<Ledger, StoreError> {
    match store.get(LEDGER_KEY)? {
        Some(v) => Ledger::decode(&v.bytes).ok_or(StoreError::Corrupt),
        None => Ok(Ledger::default()),
    }
}

/// One CAS on the ledger ([`update_record`] with its layout).
fn update<R>(
    store: &impl SharedStore,
    change: impl FnMut(&mut Ledger) -> R,
) -> Result<R, StoreError> {
    update_record(store, LEDGER_KEY, Ledger::decode, Ledger::encode, change)
}

/// What a pick counts in flight: the endpoint, the request's estimated tokens and,
/// when its first response chunk will be reported ([`first_chunk`]), its uncached input
/// tokens (counted as prefill queued there until then).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    /// The endpoint's [`endpoint_key`].
    pub endpoint: u64,
    /// Estimated tokens.
    pub tokens: u64,
    /// Uncached input tokens, counted as in prefill.
    pub prefill: Option<u64>,
}

impl Counted {
    /// A request of `tokens` on the endpoint of key `endpoint`, not tracked through
    /// prefill.
    pub fn new(endpoint: u64, tokens: u64) -> Self {
        Self {
            endpoint,
            tokens,
            prefill: None,
        }
    }
}

/// Runs `choose` on the current ledger (stale rows dropped) and counts the request it
/// returns for `vm`, atomically: if another worker wrote the ledger meanwhile, `choose`
/// runs again on the new state. Returns what `choose` returned.
pub fn acquire_with<R>(
    store: &impl SharedStore,
    vm: u64,
    now_ms: i64,
    mut choose: impl FnMut(&Ledger) -> (Option<Counted>, R),
) -> Result<R, StoreError> {
    update(store, |ledger| {
        ledger.drop_stale(now_ms);
        let (pick, result) = choose(ledger);
        if let Some(c) = pick {
            let tokens = i64::try_from(c.tokens).unwrap_or(i64::MAX);
            ledger.add_with_tokens(vm, c.endpoint, 1, tokens, now_ms);
            if let Some(p) = c.prefill {
                ledger.add_prefill(vm, c.endpoint, 1, i64::try_from(p).unwrap_or(i64::MAX));
            }
        }
        result
    })
}

/// The request of `vm` on `endpoint` with `prefill` uncached input tokens left prefill
/// (its first response chunk came, or it ended without one): one CAS.
pub fn first_chunk(
    store: &impl SharedStore,
    vm: u64,
    endpoint: &str,
    prefill: u64,
) -> Result<(), StoreError> {
    let tokens = i64::try_from(prefill).unwrap_or(i64::MAX);
    let key = endpoint_key(endpoint);
    update(store, |ledger| {
        ledger.add_prefill(vm, key, -1, -tokens);
    })
}

/// Counts one request of `tokens` on `endpoint` as finished for `vm`, and records its
/// outcome for passive health in the same write (`outcome`: `None` when not watched or
/// unknown). Returns the ejection's length (ms) when this outcome ejected the endpoint.
pub fn release(
    store: &impl SharedStore,
    vm: u64,
    endpoint: &str,
    tokens: u64,
    now_ms: i64,
    outcome: Option<(Outcome, &PassiveHealth)>,
) -> Result<Option<u64>, StoreError> {
    let tokens = i64::try_from(tokens).unwrap_or(i64::MAX);
    let key = endpoint_key(endpoint);
    update(store, |ledger| {
        ledger.add_with_tokens(vm, key, -1, -tokens, now_ms);
        ledger.drop_stale(now_ms);
        outcome.and_then(|(o, policy)| health::record(&mut ledger.health, key, o, now_ms, policy))
    })
}

/// Moves a request that Envoy retried on another endpoint (a fallback of
/// `x-gateway-destination-endpoint`) from `from` to `to`: it no longer loads `from`, which
/// failed it before any response (refused or reset: a failure for passive health when
/// `health` watches), and loads `to` until it finishes. Returns the ejection of `from` it
/// caused, if any.
pub fn moved(
    store: &impl SharedStore,
    vm: u64,
    (from, to): (&str, &str),
    tokens: u64,
    now_ms: i64,
    health: Option<&PassiveHealth>,
) -> Result<Option<u64>, StoreError> {
    let tokens = i64::try_from(tokens).unwrap_or(i64::MAX);
    let (from_key, to_key) = (endpoint_key(from), endpoint_key(to));
    update(store, |ledger| {
        ledger.add_with_tokens(vm, from_key, -1, -tokens, now_ms);
        ledger.add_with_tokens(vm, to_key, 1, tokens, now_ms);
        health.and_then(|policy| {
            health::record(
                &mut ledger.health,
                from_key,
                Outcome::Failure,
                now_ms,
                policy,
            )
        })
    })
}

/// Marks `vm` as alive (call it from the VM's tick), so its row is not taken for a dead
/// VM's, and drops the rows of dead VMs so their counts stop skewing picks.
pub fn heartbeat(store: &impl SharedStore, vm: u64, now_ms: i64) -> Result<(), StoreError> {
    let ledger = read(store)?;
    let mine = ledger.workers.iter().any(|w| w.vm == vm);
    let dead = ledger
        .workers
        .iter()
        .any(|w| now_ms.saturating_sub(w.seen_ms) >= WORKER_STALE_MS);
    if !mine && !dead {
        return Ok(());
    }
    update(store, |ledger| {
        if let Some(row) = ledger.workers.iter_mut().find(|w| w.vm == vm) {
            row.seen_ms = now_ms;
        }
        ledger.drop_stale(now_ms);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared_store::MemoryStore;
    use wasm_bindgen_test::wasm_bindgen_test;

    /// The least-loaded endpoint (ties by seed), counted in one CAS: what a picking
    /// worker does through [`acquire_with`].
    fn acquire(
        s: &MemoryStore,
        vm: u64,
        candidates: &[&str],
        now_ms: i64,
        seed: u64,
    ) -> Result<Option<String>, StoreError> {
        acquire_with(s, vm, now_ms, |ledger| {
            let min = candidates.iter().map(|e| ledger.in_flight(e)).min();
            let tied: Vec<&&str> = candidates
                .iter()
                .filter(|e| Some(ledger.in_flight(e)) == min)
                .collect();
            let pick =
                (!tied.is_empty()).then(|| tied[(seed % tied.len() as u64) as usize].to_string());
            (
                pick.as_deref().map(|p| Counted::new(endpoint_key(p), 0)),
                pick,
            )
        })
    }

    fn totals(l: &Ledger, endpoint: &str) -> (u64, u64) {
        let l = l.load(endpoint);
        (l.requests, l.tokens)
    }

    const EPS: [&str; 3] = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"];

    fn ledger(s: &MemoryStore) -> Ledger {
        read(s).unwrap()
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn picks_spread_over_idle_endpoints_whichever_worker_picks() {
        let s = MemoryStore::default();
        // Two workers (VM 1 and 2) alternate, always with the same tie-break seed.
        let picks: Vec<String> = (0..6)
            .map(|i| acquire(&s, 1 + i % 2, &EPS, 0, 0).unwrap().unwrap())
            .collect();
        for ep in EPS {
            assert_eq!(picks.iter().filter(|p| *p == ep).count(), 2, "{picks:?}");
            assert_eq!(ledger(&s).in_flight(ep), 2);
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_release_on_one_worker_makes_room_for_a_pick_on_another() {
        let s = MemoryStore::default();
        for _ in 0..3 {
            acquire(&s, 1, &EPS, 0, 0).unwrap();
        }
        release(&s, 1, EPS[1], 0, 5, None).unwrap();
        assert_eq!(acquire(&s, 2, &EPS, 6, 0).unwrap().as_deref(), Some(EPS[1]));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn counts_return_to_zero_and_the_record_stays_small() {
        let s = MemoryStore::default();
        let mut held = Vec::new();
        for i in 0..30 {
            held.push((i % 3, acquire(&s, i % 3, &EPS, 0, i).unwrap().unwrap()));
        }
        for (vm, ep) in held {
            release(&s, vm, &ep, 0, 1, None).unwrap();
        }
        assert!(ledger(&s).workers.is_empty());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_dead_vms_counts_expire_but_a_live_idle_vms_do_not() {
        let s = MemoryStore::default();
        acquire(&s, 1, &EPS[..1], 0, 0).unwrap(); // VM 1 will die holding EPS[0]
        acquire(&s, 2, &EPS[1..2], 0, 0).unwrap(); // VM 2 stays alive holding EPS[1]
        heartbeat(&s, 2, WORKER_STALE_MS - 1).unwrap();
        let later = WORKER_STALE_MS + 1;
        heartbeat(&s, 2, later).unwrap();
        let l = ledger(&s);
        assert_eq!(
            l.in_flight(EPS[0]),
            0,
            "dead VM's request no longer counted"
        );
        assert_eq!(l.in_flight(EPS[1]), 1, "live VM's request still counted");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn any_vms_heartbeat_drops_a_dead_vms_row() {
        let s = MemoryStore::default();
        acquire(&s, 1, &EPS[..1], 0, 0).unwrap(); // VM 1 dies holding EPS[0]
        heartbeat(&s, 3, WORKER_STALE_MS).unwrap(); // VM 3 holds nothing
        assert!(ledger(&s).workers.is_empty());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn no_candidates_means_no_pick_and_no_count() {
        let s = MemoryStore::default();
        assert_eq!(acquire(&s, 1, &[], 0, 0).unwrap(), None);
        assert!(ledger(&s).workers.is_empty());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn tokens_are_counted_with_requests_and_released_with_them() {
        let s = MemoryStore::default();
        for vm in [1, 2] {
            let got = acquire_with(&s, vm, 0, |l| {
                let l = l.load(EPS[0]);
                let t = (l.requests, l.tokens);
                (Some(Counted::new(endpoint_key(EPS[0]), 100)), t)
            })
            .unwrap();
            assert_eq!(got, if vm == 1 { (0, 0) } else { (1, 100) });
        }
        assert_eq!(totals(&ledger(&s), EPS[0]), (2, 200));
        release(&s, 1, EPS[0], 100, 1, None).unwrap();
        assert_eq!(totals(&ledger(&s), EPS[0]), (1, 100));
        release(&s, 2, EPS[0], 100, 1, None).unwrap();
        assert!(ledger(&s).workers.is_empty());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_release_never_goes_below_zero() {
        let s = MemoryStore::default();
        release(&s, 1, EPS[0], 0, 0, None).unwrap();
        acquire(&s, 2, &EPS[..1], 0, 0).unwrap();
        assert_eq!(ledger(&s).in_flight(EPS[0]), 1);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_request_retried_elsewhere_loads_the_fallback_and_counts_against_the_pick() {
        let s = MemoryStore::default();
        let policy = PassiveHealth::default();
        let mut ejected = None;
        for i in 0..policy.consecutive_failures {
            let got = acquire_with(&s, 1, i64::from(i), |_| {
                (Some(Counted::new(endpoint_key(EPS[0]), 10)), ())
            });
            assert!(got.is_ok());
            // Envoy could not connect to the pick and retried on the next endpoint.
            ejected = moved(&s, 1, (EPS[0], EPS[1]), 10, i64::from(i), Some(&policy)).unwrap();
            let l = ledger(&s);
            assert_eq!(l.in_flight(EPS[0]), 0);
            assert_eq!(l.in_flight(EPS[1]), u64::from(i) + 1);
        }
        // As many refusals as a run of 5xx answers eject the pick.
        assert!(ejected.is_some());
        assert!(health::is_ejected(&ledger(&s).health, EPS[0], 10));
        assert!(!health::is_ejected(&ledger(&s).health, EPS[1], 10));
        // Without passive health the load still moves, and nothing is ejected.
        let s = MemoryStore::default();
        acquire_with(&s, 1, 0, |_| {
            (Some(Counted::new(endpoint_key(EPS[0]), 10)), ())
        })
        .unwrap();
        assert_eq!(moved(&s, 1, (EPS[0], EPS[2]), 10, 0, None).unwrap(), None);
        assert_eq!(totals(&ledger(&s), EPS[2]), (1, 10));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn prefill_queued_and_decoding_requests_are_told_apart_across_workers() {
        let s = MemoryStore::default();
        let take = |vm: u64, prefill: u64| {
            acquire_with(&s, vm, 0, |_| {
                let c = Counted {
                    prefill: Some(prefill),
                    ..Counted::new(endpoint_key(EPS[0]), prefill + 50)
                };
                (Some(c), ())
            })
            .unwrap()
        };
        take(1, 300);
        take(2, 500);
        let load = |s: &MemoryStore| ledger(s).load(EPS[0]);
        assert_eq!(
            load(&s),
            Load {
                requests: 2,
                tokens: 900,
                prefilling: 2,
                prefill_tokens: 800
            }
        );
        // VM 2's request streams its first chunk: it decodes now.
        first_chunk(&s, 2, EPS[0], 500).unwrap();
        let l = load(&s);
        assert_eq!((l.requests, l.prefilling, l.prefill_tokens), (2, 1, 300));
        // VM 1's request fails before any chunk: released, and its prefill with it.
        release(&s, 1, EPS[0], 350, 1, None).unwrap();
        first_chunk(&s, 1, EPS[0], 300).unwrap();
        let l = load(&s);
        assert_eq!((l.requests, l.prefilling, l.prefill_tokens), (1, 0, 0));
        // A late or repeated report never goes below zero nor above what is in flight.
        first_chunk(&s, 2, EPS[0], 500).unwrap();
        assert_eq!(load(&s).prefilling, 0);
        release(&s, 2, EPS[0], 550, 2, None).unwrap();
        assert!(ledger(&s).workers.is_empty());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_stored_ledger_reads_back_as_written_and_garbage_is_refused() {
        let mut l = Ledger::default();
        l.add_with_tokens(7, endpoint_key(EPS[0]), 2, 300, 40);
        l.add_with_tokens(9, endpoint_key(EPS[1]), 1, 50, 41);
        l.add_prefill(9, endpoint_key(EPS[1]), 1, 20);
        let policy = PassiveHealth::default();
        health::record(
            &mut l.health,
            endpoint_key(EPS[2]),
            Outcome::Failure,
            42,
            &policy,
        );
        let bytes = l.encode();
        assert_eq!(Ledger::decode(&bytes), Some(l.clone()));
        assert_eq!(Ledger::decode(&[]), Some(Ledger::default()));
        // Truncated anywhere, or of another layout: not misread.
        for cut in 1..bytes.len() - 1 {
            assert_ne!(
                Ledger::decode(&bytes[..cut]),
                Some(l.clone()),
                "cut at {cut}"
            );
        }
        assert_eq!(Ledger::decode(&[1, 0, 0, 0, 0, 0, 0, 0]), None);
        // A corrupt record is started afresh by the next write, not failed on forever.
        let s = MemoryStore::default();
        s.set(LEDGER_KEY, &bytes[..bytes.len() / 2], 0).unwrap();
        assert_eq!(read(&s), Err(StoreError::Corrupt));
        acquire(&s, 1, &EPS[..1], 0, 0).unwrap();
        assert_eq!(ledger(&s).in_flight(EPS[0]), 1);
        assert_eq!(ledger(&s).in_flight(EPS[1]), 0);
    }
}
