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
