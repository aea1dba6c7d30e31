//! How a request leaves flow control, what the client gets, and the metric label.

use super::state::Limit;
use super::ttl::Budgets;
use crate::errors::ApiError;

/// Final outcome of a request in flow control (the reference's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Released to the scheduler.
    Dispatched,
    /// Refused at once: a capacity limit (429).
    RejectedCapacity(Limit),
    /// Refused for another reason (500).
    RejectedOther,
    /// Its queue TTL passed (503).
    EvictedTtl,
    /// The client went away while it waited.
    EvictedContextCancelled,
    /// It waited out `noEndpointRequestTTL` while the pool had no endpoint (503).
    EvictedNoEndpoints,
    /// The gateway shut down while it waited (500).
    EvictedOther,
}

impl Outcome {
    /// The `outcome` metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Dispatched => "Dispatched",
            Self::RejectedCapacity(_) => "RejectedCapacity",
            Self::RejectedOther => "RejectedOther",
            Self::EvictedTtl => "EvictedTTL",
            Self::EvictedContextCancelled => "EvictedContextCancelled",
            Self::EvictedNoEndpoints => "EvictedNoEndpoints",
            Self::EvictedOther => "EvictedOther",
        }
    }

    /// The reply a client gets, if any (a dispatched request gets none; a cancelled
    /// one has nobody left to answer, but gets 503 if the stream is still there).
    pub fn error(&self, budgets: Budgets) -> Option<ApiError> {
        let ttl_ms = budgets.with_endpoints_ms;
        match self {
            Self::Dispatched => None,
            Self::RejectedCapacity(limit) => Some(ApiError {
                dropped: Some(DROPPED_SATURATED),
                status: 429,
                kind: "rate_limit_error",
                message: format!("flow control queue is full: {}", limit_text(*limit)),
                param: None,
            }),
            Self::EvictedTtl => Some(
                ApiError::unavailable(format!(
                    "request timed out in queue: waited longer than the queue TTL of {ttl_ms} ms \
                     (flowControl.defaultRequestTTL) for the pool to have room"
                ))
                .dropped("rejected-ttl-expired"),
            ),
            Self::EvictedNoEndpoints => Some(
                ApiError::unavailable(format!(
                    "no model server endpoint became available within the queue TTL of {} ms \
                     (flowControl.noEndpointRequestTTL)",
                    budgets.without_endpoints_ms
                ))
                .dropped("rejected-no-endpoints"),
            ),
            Self::EvictedContextCancelled => Some(
                ApiError::unavailable("client disconnected: request removed from the queue")
                    .dropped("rejected-context-cancelled"),
            ),
            Self::RejectedOther => Some(ApiError::internal("internal flow control error")),
            Self::EvictedOther => Some(
                ApiError::internal(
                    "internal flow control error: the gateway is shutting down; the request was not sent",
                )
                .dropped("rejected-shutting-down"),
            ),
        }
    }
}

/// `x-llm-d-request-dropped-reason` of a request refused because the pool or the queue
/// is full.
pub const DROPPED_SATURATED: &str = "rejected-saturated";

fn limit_text(limit: Limit) -> &'static str {
    match limit {
        Limit::GlobalRequests => "the global request limit (flowControl.maxRequests) is reached",
        Limit::GlobalBytes => "the global byte limit (flowControl.maxBytes) is reached",
        Limit::BandRequests => {
            "this priority band's request limit (priorityBands[].maxRequests) is reached"
        }
        Limit::BandBytes => "this priority band's byte limit (priorityBands[].maxBytes) is reached",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn b(ms: u64) -> Budgets {
        Budgets {
            with_endpoints_ms: ms,
            without_endpoints_ms: 2 * ms,
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn statuses_as_the_reference() {
        let status = |o: Outcome| o.error(b(1000)).map(|e| e.status);
        assert_eq!(status(Outcome::Dispatched), None);
        assert_eq!(
            status(Outcome::RejectedCapacity(Limit::BandBytes)),
            Some(429)
        );
        assert_eq!(status(Outcome::EvictedTtl), Some(503));
        assert_eq!(status(Outcome::EvictedNoEndpoints), Some(503));
        assert_eq!(status(Outcome::EvictedContextCancelled), Some(503));
        assert_eq!(status(Outcome::EvictedOther), Some(500));
        assert_eq!(status(Outcome::RejectedOther), Some(500));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_rejection_says_which_limit() {
        let e = Outcome::RejectedCapacity(Limit::GlobalRequests)
            .error(b(0))
            .unwrap();
        assert!(e.message.contains("flowControl.maxRequests"));
        let e = Outcome::EvictedTtl.error(b(1500)).unwrap();
        assert!(e.message.contains("1500 ms"));
        assert_eq!(Outcome::EvictedTtl.label(), "EvictedTTL");
        let e = Outcome::EvictedNoEndpoints.error(b(1500)).unwrap();
        assert!(e.message.contains("3000 ms") && e.message.contains("noEndpointRequestTTL"));
        assert_eq!(e.dropped, Some("rejected-no-endpoints"));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn drops_say_why_in_the_routers_words_and_when_to_retry() {
        let of = |o: Outcome| {
            let e = o.error(b(1000)).unwrap();
            (e.dropped, e.retry_after_s())
        };
        assert_eq!(
            of(Outcome::RejectedCapacity(Limit::GlobalRequests)),
            (Some("rejected-saturated"), Some(1))
        );
        assert_eq!(
            of(Outcome::EvictedTtl),
            (Some("rejected-ttl-expired"), Some(1))
        );
        assert_eq!(
            of(Outcome::EvictedContextCancelled),
            (Some("rejected-context-cancelled"), Some(1))
        );
        // A 500 is not worth retrying on a timer.
        assert_eq!(
            of(Outcome::EvictedOther),
            (Some("rejected-shutting-down"), None)
        );
        assert_eq!(of(Outcome::RejectedOther), (None, None));
    }
}
