//! `edf-ordering-policy`: earliest deadline first, the deadline being enqueue time + TTL.
//! Without a TTL every deadline is far in the future and the order is arrival order,
//! as in the reference (where the TTL is always the global default).

use super::{OrderInputs, OrderKey, FAR_FUTURE};

/// Plugin type name.
pub const TYPE: &str = "edf-ordering-policy";

/// (deadline, arrival).
pub fn key(r: &OrderInputs) -> OrderKey {
    let deadline = if r.ttl_ms > 0 {
        r.enqueue_ms.saturating_add(r.ttl_ms)
    } else {
        FAR_FUTURE
    };
    OrderKey {
        primary: deadline,
        secondary: r.enqueue_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn at(enqueue_ms: u64, ttl_ms: u64) -> OrderInputs {
        OrderInputs {
            enqueue_ms,
            received_ms: enqueue_ms,
            ttl_ms,
            slo_ttft_ms: None,
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_earlier_deadline_wins_even_if_it_arrived_later() {
        assert!(key(&at(100, 50)) < key(&at(0, 1000)));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn without_ttl_it_is_arrival_order() {
        assert!(key(&at(1, 0)) < key(&at(2, 0)));
        assert_eq!(key(&at(1, 0)).primary, FAR_FUTURE);
    }
}
