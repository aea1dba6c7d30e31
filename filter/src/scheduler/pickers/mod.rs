//! Pickers: choose `maxNumOfEndpoints` (default 1; ≤ 0 means 1) endpoints from the
//! scored candidates. More than one gives the fallback list of
//! `x-gateway-destination-endpoint`.
//!
//! * [`max_score`] — `max-score-picker`: top N by score descending (ties broken
//!   uniformly at random, drawing only among the tied entries that reach the top N).
//! * [`random`] — `random-picker`: shuffle, top N.
//! * [`weighted_random`] — `weighted-random-picker`: A-Res sampling, `key = U^(1/score)`.

pub mod max_score;
pub mod random;
pub mod weighted_random;

/// `maxNumOfEndpoints` as configured (≤ 0 falls back to 1).
pub fn max_endpoints(configured: i64) -> usize {
    usize::try_from(configured)
        .ok()
        .filter(|n| *n > 0)
        .unwrap_or(1)
}
