//! Prompt block hashes, as the reference's `hashPrompt`: the prompt is cut in blocks of
//! `blockSizeTokens × 4` characters (bytes), at most `maxBlocks` of them; a prompt shorter
//! than one block has no hashes. The chain starts from `xxh64(model ‖ cache_salt)` and
//! each block (the final partial one too) is `h_i = xxh64(block_i ‖ LE_u64(h_{i-1}))`, so a
//! hash names the whole prefix up to its block, scoped to the model.

use xxhash_rust::xxh64::xxh64;

/// The chained block hashes of `prompt` for `model`.
pub fn hash_prompt(
    model: &str,
    cache_salt: Option<&str>,
    prompt: &[u8],
    block_chars: usize,
    max_blocks: usize,
) -> Vec<u64> {
    if block_chars == 0 || prompt.len() < block_chars || max_blocks == 0 {
        return Vec::new();
    }
    let mut seed_input = Vec::with_capacity(model.len() + cache_salt.map_or(0, str::len));
    seed_input.extend_from_slice(model.as_bytes());
    if let Some(salt) = cache_salt {
        seed_input.extend_from_slice(salt.as_bytes());
    }
    let mut prev = xxh64(&seed_input, 0);
    let limit = prompt.len().min(block_chars.saturating_mul(max_blocks));
    let prompt = prompt.get(..limit).unwrap_or(prompt);
    let mut out = Vec::with_capacity(limit.div_ceil(block_chars));
    // One-shot hashing of `block ‖ LE(prev)` in a reused buffer (cheaper than streaming).
    let mut buf: Vec<u8> = Vec::with_capacity(block_chars + 8);
    for block in prompt.chunks(block_chars) {
        buf.clear();
        buf.extend_from_slice(block);
        buf.extend_from_slice(&prev.to_le_bytes());
        prev = xxh64(&buf, 0);
        out.push(prev);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn blocks_chain_from_a_model_seed() {
        let prompt = "a".repeat(64 * 2 + 10);
        let h = hash_prompt("m", None, prompt.as_bytes(), 64, 256);
        assert_eq!(h.len(), 3, "two full blocks and the final partial one");
        let seed = xxh64(b"m", 0);
        let mut first = Vec::from(&prompt.as_bytes()[..64]);
        first.extend_from_slice(&seed.to_le_bytes());
        assert_eq!(h[0], xxh64(&first, 0));
        let mut second = Vec::from(&prompt.as_bytes()[64..128]);
        second.extend_from_slice(&h[0].to_le_bytes());
        assert_eq!(h[1], xxh64(&second, 0));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn shared_prefixes_share_hashes_and_models_do_not() {
        let a = format!("{}{}", "x".repeat(128), "tail one");
        let b = format!("{}{}", "x".repeat(128), "another tail");
        let ha = hash_prompt("m", None, a.as_bytes(), 64, 256);
        let hb = hash_prompt("m", None, b.as_bytes(), 64, 256);
        assert_eq!(ha[..2], hb[..2]);
        assert_ne!(ha[2], hb[2]);
        let other = hash_prompt("other-model", None, a.as_bytes(), 64, 256);
        assert_ne!(ha[0], other[0]);
        let salted = hash_prompt("m", Some("tenant-1"), a.as_bytes(), 64, 256);
        assert_ne!(ha[0], salted[0]);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn short_prompts_have_no_hashes_and_long_ones_are_truncated() {
        assert!(hash_prompt("m", None, b"short", 64, 256).is_empty());
        let long = "y".repeat(64 * 10);
        assert_eq!(hash_prompt("m", None, long.as_bytes(), 64, 4).len(), 4);
    }
}
