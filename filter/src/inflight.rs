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

use crate::config::PassiveHealth;
use crate::health::{self, EndpointHealth, Outcome};
use crate::shared_store::{update, SharedStore, StoreError};
use prost::Message;

/// The type name of the reference's in-flight load producer: accepted in
/// `EndpointPickerConfig`; this ledger is what it produces, always on.
pub const PRODUCER_TYPE: &str = "inflight-load-producer";

/// Shared-data key of the ledger (versioned: a new layout gets a new key).
pub const LEDGER_KEY: &str = "epp.v1.inflight";
/// A row not refreshed for this long belongs to a dead VM.
pub const WORKER_STALE_MS: i64 = 5_000;

/// The whole ledger, as stored.
#[derive(Clone, PartialEq, Message)]
pub struct Ledger {
    /// One row per worker VM with requests in flight.
    #[prost(message, repeated, tag = "1")]
    pub workers: Vec<WorkerRow>,
    /// Passive health: endpoints with recent failures or ejections (`crate::health`),
    /// written with the releases that report them, read by every pick.
    #[prost(message, repeated, tag = "2")]
    pub health: Vec<EndpointHealth>,
}

/// One VM's share of the in-flight requests.
#[derive(Clone, PartialEq, Message)]
pub struct WorkerRow {
    /// The VM's process-unique id.
    #[prost(uint64, tag = "1")]
    pub vm: u64,
    /// When the VM last wrote or refreshed the row (ms, host clock).
    #[prost(int64, tag = "2")]
    pub seen_ms: i64,
    /// In-flight count per endpoint address.
    #[prost(message, repeated, tag = "3")]
    pub counts: Vec<EndpointCount>,
}

/// In-flight requests of one VM on one endpoint.
#[derive(Clone, PartialEq, Message)]
pub struct EndpointCount {
    /// `ip:port`.
    #[prost(string, tag = "1")]
    pub endpoint: String,
    /// Requests in flight.
    #[prost(uint32, tag = "2")]
    pub in_flight: u32,
    /// Estimated tokens of those requests (token-load scorer, affinity TTFT gate).
    #[prost(uint64, tag = "3")]
    pub tokens: u64,
    /// Of those, requests still in prefill: dispatched, no response chunk yet (kept
    /// only with a latency producer, which reports the first chunks).
    #[prost(uint32, tag = "4")]
    pub prefilling: u32,
    /// Uncached input tokens of the requests still in prefill: the prefill work queued
    /// at the engine ahead of a new request.
    #[prost(uint64, tag = "5")]
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

impl Ledger {
    /// Requests in flight on `endpoint`, over every live VM.
    pub fn in_flight(&self, endpoint: &str) -> u64 {
        self.workers
            .iter()
            .flat_map(|w| w.counts.iter())
            .filter(|c| c.endpoint == endpoint)
            .map(|c| u64::from(c.in_flight))
            .sum()
    }

    /// Requests and tokens in flight per endpoint, over every live VM.
    pub fn totals(&self) -> hashbrown::HashMap<&str, (u64, u64)> {
        self.loads()
            .into_iter()
            .map(|(k, l)| (k, (l.requests, l.tokens)))
            .collect()
    }

    /// Everything in flight per endpoint, over every live VM.
    pub fn loads(&self) -> hashbrown::HashMap<&str, Load> {
        let mut out: hashbrown::HashMap<&str, Load> = hashbrown::HashMap::new();
        for c in self.workers.iter().flat_map(|w| w.counts.iter()) {
            let e = out.entry(c.endpoint.as_str()).or_default();
            e.requests += u64::from(c.in_flight);
            e.tokens += c.tokens;
            e.prefilling += u64::from(c.prefilling.min(c.in_flight));
            e.prefill_tokens += c.prefill_tokens;
        }
        out
    }

    /// Adds `delta` requests of `tokens` uncached input tokens to `vm`'s prefill count
    /// on `endpoint` (never below zero, never above its in-flight count). Nothing when
    /// the VM has nothing in flight there (the request was already released).
    pub fn add_prefill(&mut self, vm: u64, endpoint: &str, delta: i64, tokens: i64) {
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

    /// Adds `delta` to `vm`'s count on `endpoint` (never below zero) and refreshes the row.
    pub fn add(&mut self, vm: u64, endpoint: &str, delta: i64, now_ms: i64) {
        self.add_with_tokens(vm, endpoint, delta, 0, now_ms);
    }

    /// Like [`Ledger::add`], also adding `tokens` (may be negative) to the token count.
    pub fn add_with_tokens(
        &mut self,
        vm: u64,
        endpoint: &str,
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
                    endpoint: endpoint.to_string(),
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

/// What a pick counts in flight: the endpoint, the request's estimated tokens and,
/// when its first response chunk will be reported ([`first_chunk`]), its uncached input
/// tokens (counted as prefill queued there until then).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    /// `ip:port`.
    pub endpoint: String,
    /// Estimated tokens.
    pub tokens: u64,
    /// Uncached input tokens, counted as in prefill.
    pub prefill: Option<u64>,
}

impl Counted {
    /// A request of `tokens` on `endpoint`, not tracked through prefill.
    pub fn new(endpoint: String, tokens: u64) -> Self {
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
    update(store, LEDGER_KEY, |ledger: &mut Ledger| {
        ledger.drop_stale(now_ms);
        let (pick, result) = choose(ledger);
        if let Some(c) = pick {
            let tokens = i64::try_from(c.tokens).unwrap_or(i64::MAX);
            ledger.add_with_tokens(vm, &c.endpoint, 1, tokens, now_ms);
            if let Some(p) = c.prefill {
                ledger.add_prefill(vm, &c.endpoint, 1, i64::try_from(p).unwrap_or(i64::MAX));
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
    update(store, LEDGER_KEY, |ledger: &mut Ledger| {
        ledger.add_prefill(vm, endpoint, -1, -tokens);
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
    update(store, LEDGER_KEY, |ledger: &mut Ledger| {
        ledger.add_with_tokens(vm, endpoint, -1, -tokens, now_ms);
        ledger.drop_stale(now_ms);
        outcome
            .and_then(|(o, policy)| health::record(&mut ledger.health, endpoint, o, now_ms, policy))
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
    update(store, LEDGER_KEY, |ledger: &mut Ledger| {
        ledger.add_with_tokens(vm, from, -1, -tokens, now_ms);
        ledger.add_with_tokens(vm, to, 1, tokens, now_ms);
        health.and_then(|policy| {
            health::record(&mut ledger.health, from, Outcome::Failure, now_ms, policy)
        })
    })
}

/// Marks `vm` as alive (call it from the VM's tick), so its row is not taken for a dead
/// VM's, and drops the rows of dead VMs so their counts stop skewing picks.
pub fn heartbeat(store: &impl SharedStore, vm: u64, now_ms: i64) -> Result<(), StoreError> {
    let Some(ledger) = crate::shared_store::read::<Ledger>(store, LEDGER_KEY)? else {
        return Ok(());
    };
    let mine = ledger.workers.iter().any(|w| w.vm == vm);
    let dead = ledger
        .workers
        .iter()
        .any(|w| now_ms.saturating_sub(w.seen_ms) >= WORKER_STALE_MS);
    if !mine && !dead {
        return Ok(());
    }
    update(store, LEDGER_KEY, |ledger: &mut Ledger| {
        if let Some(row) = ledger.workers.iter_mut().find(|w| w.vm == vm) {
            row.seen_ms = now_ms;
        }
        ledger.drop_stale(now_ms);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared_store::{read, MemoryStore};
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
            (pick.clone().map(|p| Counted::new(p, 0)), pick)
        })
    }

    const EPS: [&str; 3] = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"];

    fn ledger(s: &MemoryStore) -> Ledger {
        read(s, LEDGER_KEY).unwrap().unwrap_or_default()
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
                let t = l.totals().get(EPS[0]).copied().unwrap_or_default();
                (Some(Counted::new(EPS[0].to_string(), 100)), t)
            })
            .unwrap();
            assert_eq!(got, if vm == 1 { (0, 0) } else { (1, 100) });
        }
        assert_eq!(ledger(&s).totals()[EPS[0]], (2, 200));
        release(&s, 1, EPS[0], 100, 1, None).unwrap();
        assert_eq!(ledger(&s).totals()[EPS[0]], (1, 100));
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
                (Some(Counted::new(EPS[0].to_string(), 10)), ())
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
            (Some(Counted::new(EPS[0].to_string(), 10)), ())
        })
        .unwrap();
        assert_eq!(moved(&s, 1, (EPS[0], EPS[2]), 10, 0, None).unwrap(), None);
        assert_eq!(ledger(&s).totals()[EPS[2]], (1, 10));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn prefill_queued_and_decoding_requests_are_told_apart_across_workers() {
        let s = MemoryStore::default();
        let take = |vm: u64, prefill: u64| {
            acquire_with(&s, vm, 0, |_| {
                let c = Counted {
                    prefill: Some(prefill),
                    ..Counted::new(EPS[0].to_string(), prefill + 50)
                };
                (Some(c), ())
            })
            .unwrap()
        };
        take(1, 300);
        take(2, 500);
        let load = |s: &MemoryStore| ledger(s).loads().get(EPS[0]).copied().unwrap_or_default();
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
}
