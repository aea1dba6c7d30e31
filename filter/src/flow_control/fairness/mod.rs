//! Tier 2: which flow (tenant) of a priority band gets the next dispatch.

pub mod global_strict;
pub mod program_aware;
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
    /// `program-aware-fairness`: least attained service first.
    ProgramAware(program_aware::Las),
}

impl FairnessPolicy {
    /// Every policy type name, for error messages.
    pub const TYPES: [&'static str; 3] =
        [global_strict::TYPE, round_robin::TYPE, program_aware::TYPE];

    /// The policy of a plugin type name.
    pub fn from_type(type_name: &str) -> Option<Self> {
        match type_name {
            global_strict::TYPE => Some(Self::GlobalStrict),
            round_robin::TYPE => Some(Self::RoundRobin),
            program_aware::TYPE => Some(Self::ProgramAware(program_aware::Las::default())),
            _ => None,
        }
    }

    /// Index into `flows` of the flow to serve; `last` is the band's round-robin cursor;
    /// `service[i]` is flow `i`'s attained service (read by `program-aware-fairness`
    /// only; empty: none recorded).
    pub fn pick(
        &self,
        flows: &[FlowHead<'_>],
        last: Option<&str>,
        service: &[f64],
    ) -> Option<usize> {
        match self {
            Self::GlobalStrict => global_strict::pick(flows),
            Self::RoundRobin => round_robin::pick(flows, last),
            Self::ProgramAware(las) => las.pick(flows, service),
        }
    }
}

/// What every fairness policy must do, checked for each one: a policy added to
/// [`FairnessPolicy::TYPES`] is held to the same contract.
#[cfg(test)]
mod conformance {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn policies() -> Vec<FairnessPolicy> {
        FairnessPolicy::TYPES
            .iter()
            .map(|t| FairnessPolicy::from_type(t).unwrap())
            .collect()
    }

    fn head(id: &str, primary: u64) -> FlowHead<'_> {
        FlowHead {
            fairness_id: id,
            best: OrderKey {
                primary,
                secondary: primary,
            },
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn no_flow_means_no_pick_and_one_flow_is_always_picked() {
        for p in policies() {
            assert_eq!(p.pick(&[], None, &[]), None, "{p:?}");
            assert_eq!(p.pick(&[head("a", 5)], None, &[]), Some(0), "{p:?}");
            assert_eq!(p.pick(&[head("a", 5)], Some("a"), &[]), Some(0), "{p:?}");
            assert_eq!(p.pick(&[head("a", 5)], Some("z"), &[]), Some(0), "{p:?}");
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_pick_is_always_one_of_the_flows_offered() {
        let flows = [head("a", 9), head("b", 3), head("c", 7)];
        for p in policies() {
            for last in [None, Some("a"), Some("b"), Some("c"), Some("zz")] {
                let i = p.pick(&flows, last, &[]).expect("a flow is picked");
                assert!(i < flows.len(), "{p:?} picked {i}");
            }
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn no_flow_is_starved_when_each_pick_is_served() {
        // Serve the picked flow's head and put it back behind: every flow is served
        // within a bounded number of rounds (for strict ordering, by its key turn).
        for p in policies() {
            let mut keys = [9_u64, 3, 7];
            let ids = ["a", "b", "c"];
            let mut served = [0_u32; 3];
            let mut last: Option<&str> = None;
            for round in 0..30 {
                let flows: Vec<FlowHead<'_>> =
                    ids.iter().zip(keys).map(|(id, k)| head(id, k)).collect();
                let i = p.pick(&flows, last, &[]).unwrap();
                served[i] += 1;
                last = Some(ids[i]);
                keys[i] = 100 + round;
            }
            assert!(served.iter().all(|&n| n > 0), "{p:?} served {served:?}");
        }
    }
}
