//! The predictor's inputs for one (request, endpoint) pair: the reference's features
//! (input tokens, the share not already cached, the endpoint's queue, batch and KV-cache
//! use as last scraped, the tokens this gateway has in flight there) and what the
//! gateway knows exactly at the moment of the pick, every worker's, tied to how a
//! continuous-batching engine schedules:
//!
//! * the **prefill queued ahead** — uncached input tokens of the requests it sent there
//!   that have not produced a response chunk yet, and how many they are: a new
//!   request's first token waits for that work (TTFT ≈ queued prefill / prefill rate +
//!   its own prefill + a step);
//! * the **decode batch** — requests sent there that stream and have not finished: each
//!   step decodes one token for every one of them, so the step (TPOT) grows with it,
//!   and more so with a fuller KV cache (the batch × KV term).
//!
//! Scaled so each is of order 1–100 (the RLS prior is the same for all).

use crate::endpoint::Candidate;

/// Number of features (the first is the constant 1).
pub const N: usize = 11;

/// Index of the uncached input tokens (thousands).
const UNCACHED: usize = 2;

/// The features of a request of `input_tokens` with prefix-match ratio `prefix` (0..1)
/// on `c`.
pub fn of(input_tokens: u64, prefix: f64, c: &Candidate) -> [f64; N] {
    let input = input_tokens as f64 / 1_000.0;
    let prefix = if prefix.is_finite() {
        prefix.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let kv = c.metrics.kv_usage.clamp(0.0, 1.0);
    let prefilling = c.prefilling.min(c.in_flight);
    let decoding = c.in_flight.saturating_sub(prefilling) as f64;
    [
        1.0,
        input,
        input * (1.0 - prefix),
        c.waiting_estimate() as f64,
        c.metrics.running as f64,
        kv * 10.0,
        c.prefill_tokens as f64 / 1_000.0,
        prefilling as f64,
        decoding,
        decoding * kv,
        c.in_flight_tokens as f64 / 1_000.0,
    ]
}

/// The uncached input tokens of a request with features `x` (what it adds to the
/// endpoint's prefill queue).
pub fn uncached_tokens(x: &[f64; N]) -> u64 {
    let v = x.get(UNCACHED).copied().unwrap_or(0.0) * 1_000.0;
    if v.is_finite() && v > 0.0 {
        v.round() as u64
    } else {
        0
    }
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
            prefilling: 3,
            prefill_tokens: 1_500,
            ..Candidate::new("a")
        };
        // 3 of the 9 in flight are in prefill (1,500 tokens queued), 6 decode.
        let x = of(2_000, 0.25, &c);
        assert_eq!(x, [1.0, 2.0, 1.5, 2.0, 7.0, 5.0, 1.5, 3.0, 6.0, 3.0, 3.0]);
        assert_eq!(uncached_tokens(&x), 1_500);
        // A bad prefix ratio reads as no match.
        assert_eq!(of(1_000, f64::NAN, &c)[2], 1.0);
    }
}
