//! Admission with the `flowControl` gate off (the reference's legacy admission): nothing
//! is queued in the gateway; a sheddable request (negative priority) is refused with 429
//! while the pool is saturated, everything else goes straight to scheduling.

use crate::errors::ApiError;
use crate::flow_control::outcome::DROPPED_SATURATED;

/// The decision for a request of `priority`; `saturation` is read only for sheddable
/// requests (it costs a shared-data read).
pub fn admit(priority: i32, saturation: impl FnOnce() -> f64) -> Result<(), ApiError> {
    if priority < 0 && saturation() >= 1.0 {
        return Err(ApiError {
            status: 429,
            kind: "rate_limit_error",
            message: "system saturated, sheddable request dropped".into(),
            param: None,
            dropped: Some(DROPPED_SATURATED),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn only_sheddable_requests_are_refused_and_only_while_saturated() {
        assert_eq!(admit(-1, || 1.0).map_err(|e| e.status), Err(429));
        let e = admit(-1, || 1.0).unwrap_err();
        assert_eq!(e.dropped, Some("rejected-saturated"));
        assert_eq!(e.retry_after_s(), Some(1));
        assert_eq!(admit(-1, || 2.5).map_err(|e| e.status), Err(429));
        assert!(admit(-1, || 0.99).is_ok());
        assert!(admit(0, || 5.0).is_ok());
        assert!(admit(10, || 5.0).is_ok());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn saturation_is_not_read_for_requests_that_cannot_be_shed() {
        assert!(admit(0, || unreachable!("read for a non-sheddable request")).is_ok());
    }
}
