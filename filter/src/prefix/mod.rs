//! The approximate prefix-cache index, learned from our own routing decisions.
//!
//! * [`hash`] — chained, model-seeded xxhash64 block hashes of a prompt.
//! * [`index`] — this VM's index: per-endpoint LRU of block hashes, and hash → holders
//!   ([`holders`]: a block's endpoints, inline up to three).
//! * [`shared`] — how every worker's index learns every pick: a ring log in shared data.
//! * [`rendezvous`] — the prior for prompts this gateway has not seen (replicas agree).
//! * [`feedback`] — the servers' `cached_tokens` against the index's prediction: detected
//!   evictions and each endpoint's learned capacity ([`evict`]: the index's side).
//! * [`precise`] — the blocks each server actually holds, from its KV events through
//!   `kv-relay` (`precise-prefix-cache-scorer`); [`speculative`] — what this gateway just
//!   routed, credited until the relay reports it; [`sim_tokens`] — vllm-sim's tokenizer;
//!   [`text_keys`] — a real model's keys without a tokenizer (the relay tokenizes).

pub mod burst;
pub mod evict;
pub mod feedback;
pub mod hash;
pub mod holders;
pub mod index;
pub mod precise;
pub mod rendezvous;
pub mod shared;
pub mod sim_tokens;
pub mod speculative;
pub mod text_keys;
pub mod token_producer;

use crate::config::validate::err;
use crate::config::{ConfigError, Params};
use serde_json::Value;

/// The producer's type name in `EndpointPickerConfig`.
pub const PRODUCER_TYPE: &str = "approx-prefix-cache-producer";
/// The prefix parameters, on the producer and (v1.4) on `prefix-cache-scorer`.
pub const PARAMETERS: &[&str] = &[
    "autoTune",
    "blockSizeTokens",
    "blockSize",
    "maxPrefixBlocksToMatch",
    "maxPrefixTokensToMatch",
    "lruCapacityPerServer",
    "rendezvousPrior",
    "rendezvousPriorBlocks",
    "rendezvousPriorChoices",
    "rendezvousPriorLoadWeights",
    "cachedTokensFeedback",
];

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
    /// Leading blocks that key the rendezvous prior ([`rendezvous`]); 0 = no prior
    /// (`rendezvousPrior: false`).
    pub rendezvous_blocks: u64,
    /// Owners the prior promotes, the load scorers choosing among them
    /// (`rendezvousPriorChoices`, 1..=[`rendezvous::MAX_CHOICES`]).
    pub rendezvous_choices: u64,
    /// Weigh each candidate's rendezvous score by the load weight the scraper published
    /// (`rendezvousPriorLoadWeights`, on by default; [`rendezvous::weighted_owners`]).
    pub rendezvous_load_weights: bool,
    /// Correct the index from the `cached_tokens` servers report (`cachedTokensFeedback`,
    /// on by default): detected evictions, and each endpoint's capacity learned below the
    /// configured one. Off, the reports are still compared and counted (the metrics).
    pub feedback: bool,
}

/// Default `rendezvousPriorChoices`.
pub const DEFAULT_RENDEZVOUS_CHOICES: u64 = 1;

/// Default `rendezvousPriorBlocks`: 8 blocks (128 tokens at 16 per block).
pub const DEFAULT_RENDEZVOUS_BLOCKS: u64 = 8;

/// Characters per token, as the reference's estimate.
pub const CHARS_PER_TOKEN: u64 = 4;

impl Default for PrefixConfig {
    fn default() -> Self {
        Self {
            auto_tune: true,
            block_size_tokens: 16,
            max_prefix_blocks: 256,
            lru_capacity_per_server: 31_250,
            rendezvous_blocks: DEFAULT_RENDEZVOUS_BLOCKS,
            rendezvous_choices: DEFAULT_RENDEZVOUS_CHOICES,
            rendezvous_load_weights: true,
            feedback: true,
        }
    }
}

impl PrefixConfig {
    /// Reads the prefix parameters ([`PARAMETERS`]); `blockSize` (characters) is refused
    /// with a pointer to `blockSizeTokens`; `maxPrefixTokensToMatch`, when set, overrides
    /// `maxPrefixBlocksToMatch`.
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let params = Params::new(Some(v), path, PARAMETERS)?;
        let d = PrefixConfig::default();
        let auto_tune = params.bool("autoTune", d.auto_tune)?;
        let block_size_tokens = match (params.get("blockSizeTokens"), params.get("blockSize")) {
            (None, Some(_)) => {
                return Err(err(
                    &params.path("blockSize"),
                    "is deprecated (characters); set blockSizeTokens instead",
                ))
            }
            (Some(_), _) => params.positive("blockSizeTokens", 16)?.unsigned_abs(),
            (None, None) => d.block_size_tokens,
        };
        let mut max_blocks = params
            .positive("maxPrefixBlocksToMatch", 256)?
            .unsigned_abs();
        let max_tokens = params.i64("maxPrefixTokensToMatch", 0)?;
        if max_tokens < 0 {
            return Err(err(
                &params.path("maxPrefixTokensToMatch"),
                "must not be negative",
            ));
        }
        if max_tokens > 0 {
            max_blocks = (max_tokens.unsigned_abs() / block_size_tokens).max(1);
        }
        let lru = params
            .positive("lruCapacityPerServer", 31_250)?
            .unsigned_abs();
        let prior = params.bool("rendezvousPrior", true)?;
        let prior_blocks = params
            .positive("rendezvousPriorBlocks", DEFAULT_RENDEZVOUS_BLOCKS as i64)?
            .unsigned_abs();
        let choices = params
            .positive("rendezvousPriorChoices", DEFAULT_RENDEZVOUS_CHOICES as i64)?
            .unsigned_abs();
        if choices > rendezvous::MAX_CHOICES as u64 {
            return Err(err(
                &params.path("rendezvousPriorChoices"),
                format!("must be at most {}, got {choices}", rendezvous::MAX_CHOICES),
            ));
        }
        let load_weights = params.bool("rendezvousPriorLoadWeights", d.rendezvous_load_weights)?;
        let feedback = params.bool("cachedTokensFeedback", d.feedback)?;
        Ok(PrefixConfig {
            auto_tune,
            block_size_tokens,
            max_prefix_blocks: max_blocks,
            lru_capacity_per_server: lru,
            rendezvous_blocks: if prior { prior_blocks } else { 0 },
            rendezvous_choices: choices,
            rendezvous_load_weights: load_weights,
            feedback,
        })
    }
}
