//! A small seeded PRNG (SplitMix64) for tie-breaking, exploration and weighted picks.
//! The core has no entropy source of its own: the proxy seeds it per request, tests
//! seed it with constants, so every decision is reproducible.

/// SplitMix64: fast, 64-bit state, good enough statistical quality for load balancing.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (`0` when `n == 0`).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        let n64 = n as u64;
        usize::try_from(self.next_u64() % n64).unwrap_or(0)
    }

    /// A random (version 4) UUID in its canonical text form, as `x-request-id` carries.
    pub fn uuid_v4(&mut self) -> String {
        let hi = (self.next_u64() & !0xF000) | 0x4000; // version 4
        let lo = (self.next_u64() & !(0b11 << 62)) | (0b10 << 62); // RFC 4122 variant
        format!(
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            hi >> 32,
            (hi >> 16) & 0xFFFF,
            hi & 0xFFFF,
            lo >> 48,
            lo & 0xFFFF_FFFF_FFFF
        )
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }

    /// A partial Fisher-Yates shuffle: the first `n` items become a uniformly random
    /// ordered sample of all of them (what a whole shuffle puts first), in `n` draws at
    /// most (none for a position with one choice left).
    pub fn shuffle_front<T>(&mut self, items: &mut [T], n: usize) {
        let len = items.len();
        for i in 0..n.min(len.saturating_sub(1)) {
            let j = i + self.below(len - i);
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn same_seed_same_sequence_and_uniform_enough() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        assert_eq!(a.next_u64(), b.next_u64());
        let mut counts = [0u32; 4];
        for _ in 0..40_000 {
            counts[a.below(4)] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
        let f = a.next_f64();
        assert!((0.0..1.0).contains(&f));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_partial_shuffle_puts_every_ordered_sample_first_equally_often() {
        let mut rng = Rng::new(11);
        // The ordered pairs of 4 items: 12, each about 1/12 of 12,000 draws.
        let mut counts = std::collections::BTreeMap::new();
        for _ in 0..12_000 {
            let mut items = [0, 1, 2, 3];
            rng.shuffle_front(&mut items, 2);
            *counts.entry((items[0], items[1])).or_insert(0u32) += 1;
            let mut sorted = items;
            sorted.sort_unstable();
            assert_eq!(sorted, [0, 1, 2, 3], "a permutation");
        }
        assert_eq!(counts.len(), 12, "{counts:?}");
        assert!(
            counts.values().all(|c| (850..1150).contains(c)),
            "{counts:?}"
        );
        // Nothing to draw for one item, or for none asked.
        let mut one = [7];
        let before = rng.clone().next_u64();
        rng.shuffle_front(&mut one, 1);
        rng.shuffle_front(&mut [1, 2, 3], 0);
        assert_eq!(rng.next_u64(), before, "no draw consumed");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn request_ids_are_version_4_uuids() {
        let mut r = Rng::new(1);
        let a = r.uuid_v4();
        let b = r.uuid_v4();
        assert_ne!(a, b);
        for id in [a, b] {
            let parts: Vec<&str> = id.split('-').collect();
            let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
            assert_eq!(lens, [8, 4, 4, 4, 12], "{id}");
            assert!(id.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
            assert!(parts[2].starts_with('4'), "version: {id}");
            assert!("89ab".contains(&parts[3][..1]), "variant: {id}");
        }
    }
}
