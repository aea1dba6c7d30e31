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
    let ejected: hashbrown::HashSet<u64> = list
        .iter()
        .filter(|h| now_ms < h.ejected_until_ms)
        .map(|h| h.endpoint)
        .collect();
    if ejected.is_empty() {
        return candidates.len();
    }
    let live = candidates
        .iter()
        .filter(|c| !ejected.contains(&c.key()))
        .count();
    if live == 0 || live == candidates.len() {
        return candidates.len();
    }
    // Stable: each group keeps its order.
    candidates.sort_by_key(|c| ejected.contains(&c.key()));
    live
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
}
