//! `round-robin-fairness-policy`: flows take turns. Flows are ordered by fairness id;
//! the next turn goes to the first non-empty flow after the one served last (wrapping),
//! or to the first flow when the last one is gone. One turn = one dispatch.

use super::FlowHead;

/// Plugin type name.
pub const TYPE: &str = "round-robin-fairness-policy";

/// The flow after `last` in fairness-id order. `flows` holds only non-empty flows.
pub fn pick(flows: &[FlowHead<'_>], last: Option<&str>) -> Option<usize> {
    let mut order: Vec<usize> = (0..flows.len()).collect();
    order.sort_by_key(|&i| flows.get(i).map(|f| f.fairness_id));
    let id = |i: usize| flows.get(i).map(|f| f.fairness_id).unwrap_or("");
    let next = last.and_then(|last| order.iter().copied().find(|&i| id(i) > last));
    next.or_else(|| order.first().copied())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow_control::ordering::OrderKey;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn heads<'a>(ids: &[&'a str]) -> Vec<FlowHead<'a>> {
        ids.iter()
            .map(|id| FlowHead {
                fairness_id: id,
                best: OrderKey::default(),
            })
            .collect()
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn flows_take_turns_in_id_order_and_wrap() {
        let flows = heads(&["c", "a", "b"]);
        let mut last: Option<&str> = None;
        let mut served = Vec::new();
        for _ in 0..5 {
            let i = pick(&flows, last).unwrap();
            last = Some(flows[i].fairness_id);
            served.push(flows[i].fairness_id);
        }
        assert_eq!(served, ["a", "b", "c", "a", "b"]);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_flow_that_emptied_is_skipped() {
        // "b" was served last and has nothing queued any more: "c" is next.
        let flows = heads(&["a", "c"]);
        assert_eq!(flows[pick(&flows, Some("b")).unwrap()].fairness_id, "c");
        assert_eq!(pick(&[], Some("b")), None);
    }
}
