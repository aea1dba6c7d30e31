//! `global-strict-fairness-policy`: one logical queue per band — the flow whose head is
//! best by the ordering policy is served. No tenant isolation.

use super::FlowHead;

/// Plugin type name.
pub const TYPE: &str = "global-strict-fairness-policy";

/// The flow with the smallest head key (the first such flow on ties).
pub fn pick(flows: &[FlowHead<'_>]) -> Option<usize> {
    (0..flows.len()).min_by_key(|&i| flows.get(i).map(|f| f.best))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow_control::ordering::OrderKey;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn the_oldest_head_wins_regardless_of_tenant() {
        let k = |p| OrderKey {
            primary: p,
            secondary: p,
        };
        let flows = [
            FlowHead {
                fairness_id: "a",
                best: k(5),
            },
            FlowHead {
                fairness_id: "b",
                best: k(2),
            },
            FlowHead {
                fairness_id: "c",
                best: k(9),
            },
        ];
        assert_eq!(pick(&flows), Some(1));
        assert_eq!(pick(&[]), None);
    }
}
