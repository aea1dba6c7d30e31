//! Usage-limit policies: the saturation at which a band stops dispatching.
//!
//! * `static-usage-limit-policy` (`threshold`, default 1.0): one ceiling for every band.
//! * `soft-reflective-ceiling-policy` (llm-d-router #1956, no parameters): band of rank
//!   `i` (0 = highest priority) among `N` active bands has ceiling
//!   `1 − i × saturation / (N − 1)`; below it the band is open. At saturation ≥ 1 every
//!   band is closed; between its ceiling and 1 a band is open one time slot in
//!   `round(saturation / (1 − saturation))`, so its dispatch rate falls continuously as
//!   saturation rises. The reference alternates per dispatch call with a policy-wide
//!   counter; here dispatch cycles run on any worker's events, so the alternation is over
//!   time slots of [`SLOT_MS`] (every worker agrees on the slot from the clock, with no
//!   shared counter). All gated bands open and close together, as in the reference, so a
//!   closed band never lets a lower one pass (head-of-line order holds).

/// Type of the soft policy.
pub const SOFT_REFLECTIVE_CEILING_POLICY: &str = "soft-reflective-ceiling-policy";
/// Length of one alternation slot of the soft policy.
pub const SLOT_MS: u64 = 20;

/// The configured usage-limit policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UsageLimit {
    /// One ceiling for every band.
    Static(f64),
    /// The graduated, priority-aware ceiling.
    SoftReflective,
}

impl Default for UsageLimit {
    fn default() -> Self {
        Self::Static(1.0)
    }
}

impl UsageLimit {
    /// Whether the band of `rank` among `bands` active bands may dispatch at `saturation`
    /// at time `now_ms`.
    pub fn open(&self, rank: usize, bands: usize, saturation: f64, now_ms: u64) -> bool {
        match *self {
            Self::Static(ceiling) => saturation < ceiling,
            Self::SoftReflective => {
                if saturation >= 1.0 {
                    return false;
                }
                let ceiling = if bands <= 1 {
                    1.0
                } else {
                    1.0 - rank as f64 * saturation / (bands - 1) as f64
                };
                if saturation < ceiling {
                    return true;
                }
                let period = (saturation / (1.0 - saturation)).round().max(1.0) as u64;
                (now_ms / SLOT_MS).is_multiple_of(period)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn the_soft_ceiling_gates_lower_bands_first() {
        let soft = UsageLimit::SoftReflective;
        // Three bands at saturation 0.5: ceilings 1.0, 0.75, 0.5.
        assert!(soft.open(0, 3, 0.5, 20));
        assert!(soft.open(1, 3, 0.5, 20));
        // At 0.7 (ceilings 1.0, 0.65, 0.3) both lower bands are past theirs: open one
        // slot in round(0.7/0.3) = 2, together.
        assert!(soft.open(0, 3, 0.7, 20));
        for rank in [1, 2] {
            let open: Vec<bool> = (0..4)
                .map(|s| soft.open(rank, 3, 0.7, s * SLOT_MS))
                .collect();
            assert_eq!(open, vec![true, false, true, false]);
        }
        // At 0.9 a gated band opens one slot in 9.
        let slots = (0..90)
            .filter(|s| soft.open(2, 3, 0.9, s * SLOT_MS))
            .count();
        assert_eq!(slots, 10);
        // Full saturation closes every band; one band is the static gate at 1.0.
        assert!(!soft.open(0, 3, 1.0, 0));
        assert!(soft.open(0, 1, 0.99, 20));
        assert!(UsageLimit::Static(0.8).open(5, 9, 0.79, 0));
        assert!(!UsageLimit::Static(0.8).open(0, 1, 0.8, 0));
    }
}
