//! The relay's own block keys, computed from token ids so that they do not depend on
//! vLLM's configurable block hash (`--prefix-caching-hash-algo`, `PYTHONHASHSEED`).
//!
//! For a prefix of `model` cut in blocks of `block_size` token ids:
//! `root = xxh64(model, 0)`, `key_i = xxh64(LE_u32(token) for each token of block i ‖
//! LE_u64(key_{i-1}), 0)` with `key_{-1} = root`. `model` is the block's LoRA adapter
//! when the event names one, else the server's served model name. The filter
//! computes the same keys for an incoming prompt (`filter/src/prefix/precise.rs`);
//! both crates test the same vector ([`tests::known_vector`]).
//!
//! **Text keys** (a real model's tokenizer loaded in the relay, [`crate::model`]): the
//! same chain over fixed-size blocks of the prompt's *bytes* — `key_j = xxh64(bytes
//! [jB, (j+1)B) ‖ LE_u64(key_{j-1}), 0)`, full blocks only — so that the filter computes
//! them from the rendered prompt text without a tokenizer. The relay turns each cached
//! token block back into its bytes and publishes the text blocks wholly inside the
//! cached token prefix ([`TextChain`]); pinned by [`tests::known_text_vector`].

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

/// Where a chain of text keys stands after some bytes: the last full block's key and
/// the bytes after it (fewer than a block).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TextChain {
    pub key: u64,
    pub carry: Box<[u8]>,
}

impl TextChain {
    /// The chain's start for `model`.
    pub fn start(model: &str) -> Self {
        TextChain {
            key: root(model),
            carry: Box::default(),
        }
    }

    /// The chain after `bytes` more, and the keys of the text blocks they complete.
    pub fn extend(&self, bytes: &[u8], block: usize) -> (TextChain, Vec<u64>) {
        let mut keys = Vec::new();
        let mut key = self.key;
        let mut buf = Vec::with_capacity(block + 8);
        buf.extend_from_slice(&self.carry);
        let mut rest = bytes;
        while !rest.is_empty() {
            let take = (block - buf.len()).min(rest.len());
            buf.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if buf.len() == block {
                buf.extend_from_slice(&key.to_le_bytes());
                key = xxh64(&buf, 0);
                keys.push(key);
                buf.clear();
            }
        }
        (
            TextChain {
                key,
                carry: buf.into_boxed_slice(),
            },
            keys,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same vector is asserted in the filter (`prefix::text_keys`).
    #[test]
    fn known_text_vector() {
        let start = TextChain::start("m");
        let (all, keys) = start.extend(b"abcdefghij", 4);
        // Pinned: a change here must be made in the filter too, or keys stop matching.
        assert_eq!(keys, vec![0xbc35_fa6a_95e9_6a05, 0x53f5_ee97_c675_1efd]);
        assert_eq!(&*all.carry, b"ij");
        // Bytes arriving in pieces (token blocks) give the same keys.
        let (mid, k1) = start.extend(b"abc", 4);
        let (end, k2) = mid.extend(b"defghij", 4);
        assert!(k1.is_empty());
        assert_eq!(k2, keys);
        assert_eq!(end, all);
    }

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
