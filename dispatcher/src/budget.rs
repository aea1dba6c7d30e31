//! The dispatch budget's arithmetic (seed 001), free of I/O so it can be checked against
//! the seed's worked example.
//!
//! * `D = 1 − S`: the budget is the complement of the pool's saturation `S`.
//! * `B`: a baseline kept free for interactive traffic; nothing is dispatched while `D ≤ B`.
//! * Requests: `N = ready × max_concurrency × (D − B)`, rounded **down**, but **at least 1**
//!   while `D > B`, so a budget just above the baseline does not stall dispatch.
//! * Bytes: `ready × max_bytes × (D − B)`, and the queue is cut at a request boundary:
//!   requests are taken in order while their sizes fit, and the first that does not fit
//!   stops the dispatch (the seed's 600 KiB + 100 KiB against 614.4 KiB: only the first).

/// `D − B` when `D = 1 − S` exceeds the baseline, else 0 (also for a saturation above 1
/// or a value that is not a number: fail closed).
pub fn headroom(saturation: f64, baseline: f64) -> f64 {
    let d = 1.0 - saturation;
    if d.is_finite() && d > baseline {
        d - baseline
    } else {
        0.0
    }
}

/// Requests that may enter: `ready × max_concurrency × (D − B)`, floored, at least 1 while
/// `D > B` and some endpoint is ready.
pub fn requests(ready: u64, max_concurrency: u64, saturation: f64, baseline: f64) -> u64 {
    let h = headroom(saturation, baseline);
    if h <= 0.0 || ready == 0 || max_concurrency == 0 {
        return 0;
    }
    let n = (ready as f64 * max_concurrency as f64 * h).floor() as u64;
    n.max(1)
}

/// Requests over the budget while `D < B`: `ceil(ready × max_concurrency × (B − D))`
/// (the seed's `N` when negative, rounded away from zero); 0 while `D ≥ B`. A dispatcher
/// with this many batch requests too many in flight lets them finish without replacing them.
pub fn excess(ready: u64, max_concurrency: u64, saturation: f64, baseline: f64) -> u64 {
    let over = saturation + baseline - 1.0;
    if !over.is_finite() {
        return u64::MAX;
    }
    if over <= 0.0 {
        return 0;
    }
    // A hair under, so 5.000000001 (float error of an exact 5) is 5.
    (ready as f64 * max_concurrency as f64 * over - 1e-9).ceil() as u64
}

/// Bytes that may enter: `ready × max_bytes × (D − B)`, floored.
pub fn bytes(ready: u64, max_bytes: u64, saturation: f64, baseline: f64) -> u64 {
    let h = headroom(saturation, baseline);
    (ready as f64 * max_bytes as f64 * h).floor() as u64
}

/// How many of `sizes` (in queue order) fit in `budget` bytes, cut at a request boundary:
/// the first request that does not fit stops the count.
pub fn fit_prefix(sizes: &[u64], budget: u64) -> usize {
    let mut used = 0u64;
    for (i, s) in sizes.iter().enumerate() {
        used = used.saturating_add(*s);
        if used > budget {
            return i;
        }
    }
    sizes.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seeds_worked_example_gives_30_requests() {
        // 5 ready endpoints, max_concurrency 10, S = 0.3, B = 0.1: D = 0.7, N = 5·10·0.6.
        assert_eq!(requests(5, 10, 0.3, 0.1), 30);
    }

    #[test]
    fn nothing_is_dispatched_at_or_below_the_baseline() {
        assert_eq!(requests(5, 10, 0.9, 0.1), 0); // D = B
        assert_eq!(requests(5, 10, 0.95, 0.1), 0);
        assert_eq!(requests(5, 10, 1.4, 0.1), 0); // saturation above 1
        assert_eq!(requests(5, 10, f64::NAN, 0.1), 0);
    }

    #[test]
    fn just_above_the_baseline_still_lets_one_request_in() {
        // N = 5·10·0.001 = 0.05: floor would stop dispatch; the rounding rule keeps one.
        assert_eq!(requests(5, 10, 0.899, 0.1), 1);
    }

    #[test]
    fn over_the_baseline_the_excess_is_counted() {
        // S = 1.0, B = 0.1: N = 50 × (0 − 0.1) = −5.
        assert_eq!(excess(5, 10, 1.0, 0.1), 5);
        assert_eq!(excess(5, 10, 0.95, 0.1), 3); // −2.5, away from zero
        assert_eq!(excess(5, 10, 0.9, 0.1), 0); // D = B
        assert_eq!(excess(5, 10, 0.3, 0.1), 0);
        assert_eq!(excess(5, 10, f64::NAN, 0.1), u64::MAX);
    }

    #[test]
    fn no_ready_endpoint_means_no_dispatch() {
        assert_eq!(requests(0, 10, 0.0, 0.1), 0);
    }

    #[test]
    fn bytes_are_cut_at_a_request_boundary() {
        // The seed: 1024 KiB of capacity at D − B = 0.6 is 614.4 KiB; 600 KiB then 100 KiB
        // queued: only the first goes.
        let budget = bytes(1, 1024 * 1024, 0.3, 0.1);
        assert_eq!(budget, 629_145); // floor(1048576 · 0.6)
        assert_eq!(fit_prefix(&[600 * 1024, 100 * 1024], budget), 1);
        assert_eq!(fit_prefix(&[600 * 1024, 10 * 1024], budget), 2);
        assert_eq!(fit_prefix(&[700 * 1024], budget), 0);
    }
}
