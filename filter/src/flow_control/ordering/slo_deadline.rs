//! `slo-deadline-ordering-policy`: earliest `received + x-slo-ttft-ms` first; requests
//! without a usable SLO header go behind every request that has one; ties by arrival.

use super::{OrderInputs, OrderKey, FAR_FUTURE};

/// Plugin type name.
pub const TYPE: &str = "slo-deadline-ordering-policy";

/// (SLO deadline, arrival).
pub fn key(r: &OrderInputs) -> OrderKey {
    let deadline = r
        .slo_ttft_ms
        .map_or(FAR_FUTURE, |slo| r.received_ms.saturating_add(slo));
    OrderKey {
        primary: deadline,
        secondary: r.received_ms,
    }
}

/// Reads the header value as the reference does: an integer ≥ 0, else none.
pub fn parse_header(value: Option<&str>) -> Option<u64> {
    value
        .and_then(|v| v.trim().parse::<i64>().ok())
        .and_then(|v| u64::try_from(v).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn req(received_ms: u64, slo: Option<u64>) -> OrderInputs {
        OrderInputs {
            enqueue_ms: received_ms,
            received_ms,
            ttl_ms: 0,
            slo_ttft_ms: slo,
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn tighter_slo_goes_first_and_no_slo_goes_last() {
        let relaxed = key(&req(0, Some(1000)));
        let urgent = key(&req(500, Some(100)));
        let none = key(&req(0, None));
        assert!(urgent < relaxed);
        assert!(relaxed < none);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn header_values() {
        assert_eq!(parse_header(Some("250")), Some(250));
        assert_eq!(parse_header(Some("-5")), None);
        assert_eq!(parse_header(Some("2.5")), None);
        assert_eq!(parse_header(Some("")), None);
        assert_eq!(parse_header(None), None);
    }
}
