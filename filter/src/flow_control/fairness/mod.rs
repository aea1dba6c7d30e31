//! Tier 2: which flow (tenant) of a priority band gets the next dispatch.

pub mod global_strict;
pub mod round_robin;

use super::ordering::OrderKey;

/// A non-empty flow of a band, as the fairness policies see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowHead<'a> {
    /// The flow's fairness id.
    pub fairness_id: &'a str,
    /// The key of the flow's best queued request (by the band's ordering policy).
    pub best: OrderKey,
}

/// The fairness policies of the reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FairnessPolicy {
    /// `global-strict-fairness-policy`: the best request of the band, whatever its flow.
    GlobalStrict,
    /// `round-robin-fairness-policy`: flows take turns, in fairness-id order.
    RoundRobin,
}

impl FairnessPolicy {
    /// Every policy type name, for error messages.
    pub const TYPES: [&'static str; 2] = [global_strict::TYPE, round_robin::TYPE];

    /// The policy of a plugin type name.
    pub fn from_type(type_name: &str) -> Option<Self> {
        match type_name {
            global_strict::TYPE => Some(Self::GlobalStrict),
            round_robin::TYPE => Some(Self::RoundRobin),
            _ => None,
        }
    }

    /// Index into `flows` of the flow to serve; `last` is the band's round-robin cursor.
    pub fn pick(&self, flows: &[FlowHead<'_>], last: Option<&str>) -> Option<usize> {
        match self {
            Self::GlobalStrict => global_strict::pick(flows),
            Self::RoundRobin => round_robin::pick(flows, last),
        }
    }
}
