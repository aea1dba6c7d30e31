//! The predictor's inputs for one (request, endpoint) pair, the reference's features:
//! input tokens, the share not already cached (prefix match), the endpoint's queue,
//! batch and KV-cache use as last scraped, and what this gateway has in flight there
//! (requests and estimated tokens, every worker's, at the moment of the pick).
//! Scaled so each is of order 1–100 (the RLS prior is the same for all).

use crate::endpoint::Candidate;

/// Number of features (the first is the constant 1).
pub const N: usize = 8;

/// The features of a request of `input_tokens` with prefix-match ratio `prefix` (0..1)
/// on `c`.
pub fn of(input_tokens: u64, prefix: f64, c: &Candidate) -> [f64; N] {
    let input = input_tokens as f64 / 1_000.0;
    let prefix = if prefix.is_finite() {
        prefix.clamp(0.0, 1.0)
    } else {
        0.0
    };
    [
        1.0,
        input,
        input * (1.0 - prefix),
        c.waiting_estimate() as f64,
        c.metrics.running as f64,
        c.metrics.kv_usage.clamp(0.0, 1.0) * 10.0,
        c.in_flight as f64,
        c.in_flight_tokens as f64 / 1_000.0,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::Metrics;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn reads_the_request_and_the_endpoints_load() {
        let c = Candidate {
            metrics: Metrics {
                waiting: 2,
                running: 7,
                kv_usage: 0.5,
                ..Metrics::default()
            },
            in_flight: 9,
            in_flight_tokens: 3_000,
            ..Candidate::new("a")
        };
        assert_eq!(
            of(2_000, 0.25, &c),
            [1.0, 2.0, 1.5, 2.0, 7.0, 5.0, 9.0, 3.0]
        );
        // A bad prefix ratio reads as no match.
        assert_eq!(of(1_000, f64::NAN, &c)[2], 1.0);
    }
}
