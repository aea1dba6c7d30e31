//! Passive health: outlier detection in the picker (`pool.passiveHealth`,
//! `crate::config::health`). Envoy's outlier detection does not act on an
//! `ORIGINAL_DST` pick, and a server that fails fast looks idle to the load scorers, so
//! it would attract more traffic, not less.
//!
//! Each finished request reports its outcome with its in-flight release (the same
//! ledger CAS, `crate::inflight::release`: no extra shared-data write per request): a
//! 5xx (the server's, or Envoy's own 503 for a refused or reset connection and 504 for a
//! timeout) is a failure, anything else a success. `consecutiveFailures` failures in a
//! row eject the endpoint for `base × 2^(n-1)` (at most `max`), n counting its recent
//! ejections: n falls by one per `base` of time since its last ejection ended, as
//! Envoy's ejection multiplier does. The records live in the ledger (`Ledger::health`),
//! so every worker sees an ejection at its next pick, which already reads the ledger.
//!
//! Picks leave ejected endpoints out of the candidates ([`partition`]) — unless every
//! candidate is ejected: then all are kept (Envoy's panic mode, at 0 % healthy instead
//! of its 50 % threshold), so a pool whose servers all fail still answers with their
//! errors rather than the gateway's 503.

use crate::config::PassiveHealth;
use crate::endpoint::{key, Candidate};

/// One endpoint's recent failures and ejections (kept only while they matter).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointHealth {
    /// The endpoint's key (`crate::endpoint::key`).
    pub endpoint: u64,
    /// Failures in a row since the last success or ejection.
    pub consecutive_failures: u32,
    /// Ejected until this time (ms, host clock); 0 when never ejected.
    pub ejected_until_ms: i64,
    /// Recent ejections (the backoff's exponent), as of the last ejection.
    pub ejections: u32,
    /// The last failure (ms), to forget a few old failures of an endpoint that left.
    pub last_failure_ms: i64,
}

/// How a request ended, for passive health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered below 500.
    Success,
    /// Answered 5xx (the server, or Envoy for a connect failure, reset or timeout).
    Failure,
}

impl Outcome {
    /// The outcome of a response status; `None` (no response: the client went away
    /// first) says nothing about the endpoint.
    pub fn of_status(status: Option<u16>) -> Option<Outcome> {
        status.map(|s| {
            if s >= 500 {
                Outcome::Failure
            } else {
                Outcome::Success
            }
        })
    }
}

/// Whether `endpoint` is ejected at `now_ms`.
pub fn is_ejected(list: &[EndpointHealth], endpoint: &str, now_ms: i64) -> bool {
    let endpoint = key(endpoint);
    list.iter()
        .any(|h| h.endpoint == endpoint && now_ms < h.ejected_until_ms)
}

/// Records one outcome on the endpoint of key `endpoint` (`crate::endpoint::key`);
/// returns the ejection's length (ms) when this failure ejects it.
pub fn record(
    list: &mut Vec<EndpointHealth>,
    endpoint: u64,
    outcome: Outcome,
    now_ms: i64,
    policy: &PassiveHealth,
) -> Option<u64> {
    let base = i64::try_from(policy.base_ejection_ms)
        .unwrap_or(i64::MAX)
        .max(1);
    let ejected = match outcome {
        Outcome::Success => {
            if let Some(h) = list.iter_mut().find(|h| h.endpoint == endpoint) {
                h.consecutive_failures = 0;
            }
            None
        }
        Outcome::Failure if policy.enabled() => {
            let pos = match list.iter().position(|h| h.endpoint == endpoint) {
                Some(p) => p,
                None => {
                    list.push(EndpointHealth {
                        endpoint,
                        ..EndpointHealth::default()
                    });
                    list.len() - 1
                }
            };
            list.get_mut(pos)
                .and_then(|h| fail(h, now_ms, base, policy))
        }
        Outcome::Failure => None,
    };
    prune(list, now_ms, base, policy);
    ejected
}

fn fail(h: &mut EndpointHealth, now_ms: i64, base: i64, policy: &PassiveHealth) -> Option<u64> {
    if now_ms < h.ejected_until_ms {
        // Requests sent before the ejection finishing now: already counted.
        return None;
    }
    h.last_failure_ms = now_ms;
    h.consecutive_failures = h.consecutive_failures.saturating_add(1);
    if h.consecutive_failures < policy.consecutive_failures {
        return None;
    }
    let healthy = now_ms.saturating_sub(h.ejected_until_ms).max(0);
    let forgotten = u32::try_from(healthy / base).unwrap_or(u32::MAX);
    h.ejections = h.ejections.saturating_sub(forgotten).saturating_add(1);
    let doublings = h.ejections.saturating_sub(1).min(30);
    let ms = policy
        .base_ejection_ms
        .saturating_mul(1u64 << doublings)
        .min(policy.max_ejection_ms);
    h.ejected_until_ms = now_ms.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX));
    h.consecutive_failures = 0;
    Some(ms)
}

/// Drops the records that no longer matter: not ejected, backoff fully decayed, no
/// recent failure.
fn prune(list: &mut Vec<EndpointHealth>, now_ms: i64, base: i64, policy: &PassiveHealth) {
    let keep_failures = i64::try_from(policy.max_ejection_ms).unwrap_or(i64::MAX);
    list.retain(|h| {
        let ejected = now_ms < h.ejected_until_ms;
        let decaying = h.ejections > 0
            && now_ms.saturating_sub(h.ejected_until_ms)
                < base.saturating_mul(i64::from(h.ejections));
        let failing =
            h.consecutive_failures > 0 && now_ms.saturating_sub(h.last_failure_ms) < keep_failures;
        ejected || decaying || failing
    });
}

/// Moves the ejected candidates to the end (the others keep their order) and returns
/// how many are not ejected — or all of them when every one is (panic mode).
pub fn partition(candidates: &mut [Candidate], list: &[EndpointHealth], now_ms: i64) -> usize {
    // One pass over the list, one lookup per candidate: a pool of hundreds of endpoints
    // with many ejected must not cost candidates × ejections.
    let ejected = Ejected::new(list, now_ms);
    if ejected.is_empty() {
        return candidates.len();
    }
    let is_out: Vec<bool> = candidates
        .iter()
        .map(|c| ejected.contains(c.key()))
        .collect();
    let live = is_out.iter().filter(|e| !**e).count();
    if live == 0 || live == candidates.len() {
        return candidates.len();
    }
    // Already in place (the list is kept between picks): nothing moves.
    if is_out.is_sorted() {
        return live;
    }
    // Stable: each group keeps its order (what a stable sort by `is_out` gives), with each
    // live candidate moved once and each ejected one twice.
    let mut ejected_ones = Vec::with_capacity(candidates.len() - live);
    let mut write = 0;
    for (read, &out) in is_out.iter().enumerate() {
        if out {
            if let Some(c) = candidates.get_mut(read) {
                ejected_ones.push(std::mem::take(c));
            }
        } else {
            // Between `write` and `read` are only the places emptied above.
            candidates.swap(write, read);
            write += 1;
        }
    }
    for (place, c) in candidates.iter_mut().skip(live).zip(ejected_ones) {
        *place = c;
    }
    live
}

/// The keys of the endpoints ejected at one moment, for a pick's lookup per candidate: an
/// open-addressing set (linear probing, at most half full). Endpoint keys are uniform
/// 64-bit hashes, so each is its own hash; 0 marks an empty slot (the key 0 itself is a
/// flag of its own).
struct Ejected {
    slots: Vec<u64>,
    zero: bool,
}

impl Ejected {
    /// The endpoints of `list` ejected at `now_ms`.
    fn new(list: &[EndpointHealth], now_ms: i64) -> Self {
        let ejected = || list.iter().filter(|h| now_ms < h.ejected_until_ms);
        let size = match ejected().count() {
            0 => 0,
            n => n.saturating_mul(2).next_power_of_two(),
        };
        let mut set = Self {
            slots: vec![0; size],
            zero: false,
        };
        for h in ejected() {
            if h.endpoint == 0 {
                set.zero = true;
            } else if let Some(s) = set.slot(h.endpoint).and_then(|i| set.slots.get_mut(i)) {
                *s = h.endpoint;
            }
        }
        set
    }

    fn is_empty(&self) -> bool {
        self.slots.is_empty() && !self.zero
    }

    /// The slot holding `key` (not 0) or the empty one where it goes; `None` without
    /// slots. Terminates: at least half the slots are empty.
    fn slot(&self, key: u64) -> Option<usize> {
        let mask = self.slots.len().checked_sub(1)?;
        let mut i = (key as usize) & mask;
        loop {
            match *self.slots.get(i)? {
                k if k != key && k != 0 => i = (i + 1) & mask,
                _ => return Some(i),
            }
        }
    }

    fn contains(&self, key: u64) -> bool {
        if key == 0 {
            return self.zero;
        }
        self.slot(key)
            .and_then(|i| self.slots.get(i))
            .is_some_and(|&k| k == key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    const EP: &str = "10.0.0.1:8000";

    fn policy() -> PassiveHealth {
        PassiveHealth {
            consecutive_failures: 3,
            base_ejection_ms: 1_000,
            max_ejection_ms: 5_000,
        }
    }

    fn fail_n(list: &mut Vec<EndpointHealth>, n: u32, now: i64) -> Option<u64> {
        let mut out = None;
        for _ in 0..n {
            out = out.or(record(list, key(EP), Outcome::Failure, now, &policy()));
        }
        out
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn failures_in_a_row_eject_and_a_success_resets_the_count() {
        let mut l = Vec::new();
        assert_eq!(fail_n(&mut l, 2, 0), None);
        record(&mut l, key(EP), Outcome::Success, 1, &policy());
        assert_eq!(fail_n(&mut l, 2, 2), None, "the success broke the run");
        assert!(!is_ejected(&l, EP, 2));
        assert_eq!(fail_n(&mut l, 1, 3), Some(1_000));
        assert!(is_ejected(&l, EP, 3));
        assert!(is_ejected(&l, EP, 1_002));
        assert!(!is_ejected(&l, EP, 1_003));
        // Late failures of requests sent before the ejection do not extend it.
        assert_eq!(fail_n(&mut l, 5, 500), None);
        assert!(!is_ejected(&l, EP, 1_003));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_backoff_doubles_up_to_the_max_and_decays_while_healthy() {
        let mut l = Vec::new();
        let mut now = 0;
        let mut lengths = Vec::new();
        for _ in 0..5 {
            let ms = fail_n(&mut l, 3, now).unwrap();
            lengths.push(ms);
            now += i64::try_from(ms).unwrap(); // fails again as soon as it is back
        }
        assert_eq!(lengths, [1_000, 2_000, 4_000, 5_000, 5_000]);
        // Healthy for 3 × base after the last ejection: three ejections forgotten.
        now += 3_000;
        assert_eq!(fail_n(&mut l, 3, now), Some(4_000));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn records_are_forgotten_once_they_no_longer_matter() {
        let mut l = Vec::new();
        fail_n(&mut l, 3, 0);
        assert_eq!(l.len(), 1);
        // Ejected until 1 000, decayed 1 000 later.
        record(
            &mut l,
            key("10.0.0.2:8000"),
            Outcome::Success,
            1_999,
            &policy(),
        );
        assert_eq!(l.len(), 1);
        record(
            &mut l,
            key("10.0.0.2:8000"),
            Outcome::Success,
            2_000,
            &policy(),
        );
        assert!(l.is_empty());
        // A stray failure is forgotten after maxEjectionTime.
        fail_n(&mut l, 1, 10_000);
        record(
            &mut l,
            key("10.0.0.2:8000"),
            Outcome::Success,
            15_000,
            &policy(),
        );
        assert!(l.is_empty());
        // Off: nothing is recorded.
        let off = PassiveHealth {
            consecutive_failures: 0,
            ..policy()
        };
        for _ in 0..10 {
            record(&mut l, key(EP), Outcome::Failure, 0, &off);
        }
        assert!(l.is_empty());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn picks_skip_ejected_endpoints_unless_all_are() {
        let mut cands: Vec<Candidate> = (1..=3)
            .map(|i| Candidate::new(&format!("10.0.0.{i}:8000")))
            .collect();
        let mut l = Vec::new();
        assert_eq!(partition(&mut cands, &l, 0), 3);
        fail_n(&mut l, 3, 0); // 10.0.0.1 ejected
        assert_eq!(partition(&mut cands, &l, 10), 2);
        let order: Vec<&str> = cands.iter().map(|c| c.address.as_str()).collect();
        assert_eq!(order, ["10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.1:8000"]);
        for ep in ["10.0.0.2:8000", "10.0.0.3:8000"] {
            for _ in 0..3 {
                record(&mut l, key(ep), Outcome::Failure, 20, &policy());
            }
        }
        assert_eq!(partition(&mut cands, &l, 30), 3, "all ejected: panic mode");
        assert_eq!(partition(&mut cands, &l, 5_000), 3, "all back");
        assert_eq!(Outcome::of_status(Some(503)), Some(Outcome::Failure));
        assert_eq!(Outcome::of_status(Some(429)), Some(Outcome::Success));
        assert_eq!(Outcome::of_status(None), None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_ejected_move_to_the_end_and_both_groups_keep_their_order() {
        let address = |i: usize| format!("10.0.{}.{}:8000", i / 256, i % 256);
        let mut cands: Vec<Candidate> = (0..40).map(|i| Candidate::new(&address(i))).collect();
        // Every third endpoint ejected until 1 000 ms.
        let list: Vec<EndpointHealth> = (0..40)
            .step_by(3)
            .map(|i| EndpointHealth {
                endpoint: key(&address(i)),
                ejected_until_ms: 1_000,
                ..EndpointHealth::default()
            })
            .collect();
        let (live, out): (Vec<usize>, Vec<usize>) = (0..40).partition(|i| i % 3 != 0);
        let expected: Vec<String> = live.iter().chain(&out).map(|&i| address(i)).collect();
        assert_eq!(partition(&mut cands, &list, 10), live.len());
        let order: Vec<String> = cands.iter().map(|c| c.address.clone()).collect();
        assert_eq!(order, expected);
        // The next pick finds them in place.
        assert_eq!(partition(&mut cands, &list, 20), live.len());
        let again: Vec<String> = cands.iter().map(|c| c.address.clone()).collect();
        assert_eq!(again, expected);
        // Over: every one is live again, in the order the list now has.
        assert_eq!(partition(&mut cands, &list, 1_000), 40);
    }
}
