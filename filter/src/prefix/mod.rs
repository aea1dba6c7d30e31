//! The approximate prefix-cache index, learned from our own routing decisions.
//!
//! * [`hash`] — chained, model-seeded xxhash64 block hashes of a prompt.
//! * [`index`] — this VM's index: per-endpoint LRU of block hashes, and hash → holders.
//! * [`shared`] — how every worker's index learns every pick: a ring log in shared data.

pub mod hash;
pub mod index;
pub mod shared;

/// The prefix parameters (`approx-prefix-cache-producer`, or on `prefix-cache-scorer` as in
/// v1.4 and earlier).
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixConfig {
    /// Block size and LRU capacity from the engine's `cache_config_info` when known.
    pub auto_tune: bool,
    /// Tokens per block (4 characters per token).
    pub block_size_tokens: u64,
    /// Most blocks hashed per request.
    pub max_prefix_blocks: u64,
    /// LRU entries per endpoint when the engine's block count is unknown.
    pub lru_capacity_per_server: u64,
}

/// Characters per token, as the reference's estimate.
pub const CHARS_PER_TOKEN: u64 = 4;

impl Default for PrefixConfig {
    fn default() -> Self {
        Self {
            auto_tune: true,
            block_size_tokens: 16,
            max_prefix_blocks: 256,
            lru_capacity_per_server: 31_250,
        }
    }
}
