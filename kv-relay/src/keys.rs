//! The relay's own block keys, computed from token ids so that they do not depend on
//! vLLM's configurable block hash (`--prefix-caching-hash-algo`, `PYTHONHASHSEED`).
//!
//! For a prefix of `model` cut in blocks of `block_size` token ids:
//! `root = xxh64(model, 0)`, `key_i = xxh64(LE_u32(token) for each token of block i ‖
//! LE_u64(key_{i-1}), 0)` with `key_{-1} = root`. `model` is the block's LoRA adapter
//! when the event names one, else the server's served model name. The filter
//! computes the same keys for an incoming prompt (`filter/src/prefix/precise.rs`);
//! both crates test the same vector ([`tests::known_vector`]).

use xxhash_rust::xxh64::xxh64;

/// The chain's root for `model`.
pub fn root(model: &str) -> u64 {
    xxh64(model.as_bytes(), 0)
}

/// The key of one block given its parent's key.
pub fn block_key(parent: u64, tokens: &[u32]) -> u64 {
    let mut buf = Vec::with_capacity(tokens.len() * 4 + 8);
    for t in tokens {
        buf.extend_from_slice(&t.to_le_bytes());
    }
    buf.extend_from_slice(&parent.to_le_bytes());
    xxh64(&buf, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same vector is asserted in the filter (`prefix::precise`).
    #[test]
    fn known_vector() {
        let r = root("m");
        let k0 = block_key(r, &[1, 2]);
        let k1 = block_key(k0, &[3, 4]);
        // Pinned: a change here must be made in the filter too, or keys stop matching.
        assert_eq!(
            (r, k0, k1),
            (
                0xba2e_5670_83a2_b2e8,
                0x9f0d_d706_89ab_42c5,
                0xbbe7_97d4_0b78_4970
            )
        );
    }
}
