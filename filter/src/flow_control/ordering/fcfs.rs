//! `fcfs-ordering-policy`: first come, first served, by the time a request entered flow control.

use super::{OrderInputs, OrderKey};

/// Plugin type name.
pub const TYPE: &str = "fcfs-ordering-policy";

/// Arrival time, twice.
pub fn key(r: &OrderInputs) -> OrderKey {
    OrderKey {
        primary: r.enqueue_ms,
        secondary: r.enqueue_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn earlier_arrival_goes_first_whatever_its_slo() {
        let early = OrderInputs {
            enqueue_ms: 10,
            received_ms: 10,
            ttl_ms: 0,
            slo_ttft_ms: Some(10_000),
        };
        let late = OrderInputs {
            enqueue_ms: 11,
            received_ms: 11,
            ttl_ms: 0,
            slo_ttft_ms: Some(1),
        };
        assert!(key(&early) < key(&late));
    }
}
