//! Choosing an endpoint: the fewest requests in flight, ties broken by a seed.

/// Index of the candidate with the lowest load; among equals, the one the seed selects,
/// so that idle endpoints share the first requests instead of the first one taking all.
/// `None` when there are no candidates.
pub fn least_loaded<T>(candidates: &[T], load: impl Fn(&T) -> u64, seed: u64) -> Option<usize> {
    let min = candidates.iter().map(&load).min()?;
    let tied: Vec<usize> = (0..candidates.len())
        .filter(|&i| candidates.get(i).map(&load) == Some(min))
        .collect();
    let n = u64::try_from(tied.len()).ok()?;
    let k = usize::try_from(seed % n).ok()?;
    tied.get(k).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn picks_the_least_loaded() {
        let loads = [3u64, 1, 2];
        for seed in 0..5 {
            assert_eq!(least_loaded(&loads, |l| *l, seed), Some(1));
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn ties_are_spread_by_the_seed() {
        let loads = [0u64, 5, 0, 0];
        let picks: Vec<_> = (0..3)
            .map(|s| least_loaded(&loads, |l| *l, s).unwrap())
            .collect();
        assert_eq!(picks, vec![0, 2, 3]);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn no_candidates_no_pick() {
        let loads: [u64; 0] = [];
        assert_eq!(least_loaded(&loads, |l| *l, 7), None);
    }
}
