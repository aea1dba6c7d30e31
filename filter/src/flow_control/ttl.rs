//! Queue-wait budgets: `defaultRequestTTL` while the pool has endpoints, and
//! `noEndpointRequestTTL` while it has none (the llm-d router's two regimes: a saturated
//! pool should shed early, an empty one is a scale-from-zero waiting room).
//!
//! The budget in force is re-evaluated while requests wait, and each change of regime
//! starts a fresh budget (a request queued against an empty pool is not shed the instant
//! an endpoint appears). The total wait stays bounded by the longer budget. A budget of 0
//! disables eviction in its regime.
//!
//! Every request's budget starts at `max(its enqueue time, the regime's start)`, so the
//! requests that have run out are always those enqueued at or before one cutoff: the
//! parked requests, ordered by enqueue time, are expired from the front ([`cutoff`]).

/// Which regime the pool is in, and since when (as one VM observes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Regime {
    /// The pool has no endpoint to dispatch to.
    pub empty: bool,
    /// When this regime began (ms; 0 for the state first observed).
    pub since_ms: u64,
    /// Whether the pool was observed at all.
    pub known: bool,
}

impl Regime {
    /// Records the pool's state at `now_ms`; a change starts a new regime. The first
    /// observation is not a change: that state is taken to have always held.
    pub fn observe(&mut self, empty: bool, now_ms: u64) {
        if !self.known || empty != self.empty {
            *self = Regime {
                empty,
                since_ms: if self.known { now_ms } else { 0 },
                known: true,
            };
        }
    }
}

/// The two budgets (ms; 0 = no eviction in that regime).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    /// `defaultRequestTTL`.
    pub with_endpoints_ms: u64,
    /// `noEndpointRequestTTL` (follows `defaultRequestTTL` unless set).
    pub without_endpoints_ms: u64,
}

impl Budgets {
    /// The budget of `regime`.
    pub fn of(&self, regime: Regime) -> u64 {
        if regime.empty {
            self.without_endpoints_ms
        } else {
            self.with_endpoints_ms
        }
    }
}

/// Requests enqueued at or before the returned time (ms) have waited out their budget at
/// `now_ms`; `None` when none has.
pub fn cutoff(budgets: Budgets, regime: Regime, now_ms: u64) -> Option<u64> {
    let ttl = budgets.of(regime);
    // In this regime: enqueued after it began, `now − enqueued ≥ ttl`; enqueued before,
    // `now − since ≥ ttl`, which then also holds for everything enqueued by `now − ttl`.
    let in_regime =
        (ttl > 0 && now_ms >= regime.since_ms.saturating_add(ttl)).then(|| now_ms - ttl);
    // Overall: never longer than the longer budget, whatever the regime changes.
    let longest = budgets.with_endpoints_ms.max(budgets.without_endpoints_ms);
    let overall = (budgets.with_endpoints_ms > 0 && budgets.without_endpoints_ms > 0)
        .then(|| now_ms.checked_sub(longest))
        .flatten();
    in_regime.max(overall)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    const B: Budgets = Budgets {
        with_endpoints_ms: 1_000,
        without_endpoints_ms: 10_000,
    };

    #[wasm_bindgen_test(unsupported = test)]
    fn each_regime_has_its_budget() {
        let mut up = Regime::default();
        up.observe(false, 500);
        assert_eq!(up.since_ms, 0, "the first state seen has always held");
        assert_eq!(cutoff(B, up, 999), None);
        assert_eq!(cutoff(B, up, 5_000), Some(4_000));
        let empty = Regime {
            empty: true,
            since_ms: 0,
            known: true,
        };
        assert_eq!(cutoff(B, empty, 5_000), None, "a cold start is waited for");
        assert_eq!(cutoff(B, empty, 12_000), Some(2_000));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_regime_change_starts_a_fresh_budget_within_the_longest() {
        // Queued at 0 against an empty pool; an endpoint appears at 9 s.
        let mut r = Regime {
            empty: true,
            since_ms: 0,
            known: true,
        };
        r.observe(false, 9_000);
        assert_eq!(r.since_ms, 9_000);
        // Not shed at once: 1 s from the change.
        assert_eq!(cutoff(B, r, 9_500), None);
        assert_eq!(cutoff(B, r, 10_000), Some(9_000));
        // Observing the same state again does not restart it.
        r.observe(false, 9_900);
        assert_eq!(r.since_ms, 9_000);
        // The pool empties at 5 s for a request queued at 4.5 s with endpoints: its
        // budget restarts at 5 s, but it never waits longer than 10 s overall.
        let r = Regime {
            empty: true,
            since_ms: 5_000,
            known: true,
        };
        assert_eq!(cutoff(B, r, 14_000), Some(4_000));
        assert_eq!(cutoff(B, r, 14_600), Some(4_600));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_zero_budget_disables_eviction_in_its_regime() {
        let b = Budgets {
            with_endpoints_ms: 1_000,
            without_endpoints_ms: 0,
        };
        let empty = Regime {
            empty: true,
            since_ms: 0,
            known: true,
        };
        assert_eq!(cutoff(b, empty, 1_000_000), None);
        assert_eq!(cutoff(b, Regime::default(), 2_000), Some(1_000));
    }
}
