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

/// Reads the header value: milliseconds ≥ 0, whole (the Inference Extension's form) or
/// fractional (the llm-d router's, rounded up to the next millisecond); anything else is
/// no SLO.
pub fn parse_header(value: Option<&str>) -> Option<u64> {
    let ms = value?.trim().parse::<f64>().ok()?;
    (ms.is_finite() && ms >= 0.0).then(|| ms.ceil().min(u64::MAX as f64) as u64)
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
        assert_eq!(parse_header(Some("2.5")), Some(3));
        assert_eq!(parse_header(Some("NaN")), None);
        assert_eq!(parse_header(Some("inf")), None);
        assert_eq!(parse_header(Some("soon")), None);
        assert_eq!(parse_header(Some("")), None);
        assert_eq!(parse_header(None), None);
    }
}
