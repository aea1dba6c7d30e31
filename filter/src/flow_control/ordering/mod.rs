//! Tier 3: which request of a flow goes first. Each policy turns a request's times
//! into an [`OrderKey`]; the smallest key is served first.

pub mod edf;
pub mod fcfs;
pub mod slo_deadline;

/// What the ordering policies look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderInputs {
    /// When the request entered flow control (ms).
    pub enqueue_ms: u64,
    /// When its headers arrived (ms).
    pub received_ms: u64,
    /// Its queue TTL (ms); 0 = none.
    pub ttl_ms: u64,
    /// `x-slo-ttft-ms`, when present, parsable and non-negative.
    pub slo_ttft_ms: Option<u64>,
}

/// Sort key of a queued request: `primary`, then `secondary`; smaller goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct OrderKey {
    /// The policy's main criterion (arrival or deadline).
    pub primary: u64,
    /// The tie-breaker (arrival).
    pub secondary: u64,
}

/// A deadline that never comes: requests without one sort behind all that have one.
pub const FAR_FUTURE: u64 = u64::MAX;

/// The ordering policies of the reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderingPolicy {
    /// `fcfs-ordering-policy`: arrival order.
    Fcfs,
    /// `edf-ordering-policy`: earliest TTL deadline first.
    Edf,
    /// `slo-deadline-ordering-policy`: earliest `received + x-slo-ttft-ms` first.
    SloDeadline,
}

impl OrderingPolicy {
    /// Every policy type name, for error messages.
    pub const TYPES: [&'static str; 3] = [fcfs::TYPE, edf::TYPE, slo_deadline::TYPE];

    /// The policy of a plugin type name.
    pub fn from_type(type_name: &str) -> Option<Self> {
        match type_name {
            fcfs::TYPE => Some(Self::Fcfs),
            edf::TYPE => Some(Self::Edf),
            slo_deadline::TYPE => Some(Self::SloDeadline),
            _ => None,
        }
    }

    /// The request's sort key under this policy.
    pub fn key(&self, r: &OrderInputs) -> OrderKey {
        match self {
            Self::Fcfs => fcfs::key(r),
            Self::Edf => edf::key(r),
            Self::SloDeadline => slo_deadline::key(r),
        }
    }
}

/// What every ordering policy must do, checked for each one: a policy added to
/// [`OrderingPolicy::TYPES`] is held to the same contract.
#[cfg(test)]
mod conformance {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn policies() -> Vec<OrderingPolicy> {
        OrderingPolicy::TYPES
            .iter()
            .map(|t| OrderingPolicy::from_type(t).unwrap())
            .collect()
    }

    fn at(ms: u64) -> OrderInputs {
        OrderInputs {
            enqueue_ms: ms,
            received_ms: ms,
            ttl_ms: 0,
            slo_ttft_ms: None,
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn every_type_name_resolves_to_its_own_policy() {
        let all = policies();
        for (i, a) in all.iter().enumerate() {
            assert!(all.iter().skip(i + 1).all(|b| a != b), "{a:?} twice");
        }
        assert_eq!(OrderingPolicy::from_type("no-such-policy"), None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn with_nothing_but_arrival_to_go_on_every_policy_is_first_come_first_served() {
        for p in policies() {
            assert!(p.key(&at(10)) < p.key(&at(11)), "{p:?}");
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_later_arrival_never_overtakes_an_equal_request() {
        // Same TTL and SLO: whatever the policy's criterion, arrival breaks the tie.
        for p in policies() {
            for (ttl_ms, slo) in [(0, None), (1_000, None), (0, Some(200)), (500, Some(200))] {
                let a = OrderInputs {
                    ttl_ms,
                    slo_ttft_ms: slo,
                    ..at(100)
                };
                let b = OrderInputs {
                    ttl_ms,
                    slo_ttft_ms: slo,
                    ..at(101)
                };
                assert!(p.key(&a) < p.key(&b), "{p:?} ttl {ttl_ms} slo {slo:?}");
            }
        }
    }
}
