//! Precise prefix-cache state: which blocks each model server actually holds, as
//! reported by its KV-cache events through `kv-relay`, and the match of a prompt against
//! it (`precise-prefix-cache-scorer`).
//!
//! * Keys: the relay re-keys every block vLLM reports from its token ids:
//!   `root = xxh64(model)`, `key_i = xxh64(LE_u32 tokens of block i ‖ LE_u64(key_{i-1}))`
//!   per `blockSize` tokens. [`keys`] computes the same for a prompt's token ids
//!   ([`super::sim_tokens`] for vllm-sim), so vLLM's block-hash algorithm never matters.
//!   With `tokenizer: relay` (a real model: the relay holds its tokenizer and chat
//!   template) the keys are text keys instead ([`super::text_keys`]): no tokenizer here.
//! * State: per endpoint address, the keys held, the block size, and whether the relay
//!   marks the stream stale. Updated from the relay's `GET /v1/kv/state` answers (a
//!   snapshot, or the changes since the version this VM holds); bounded per server and
//!   in servers.
//! * Fallback: an endpoint the relay does not know, or marks stale, or a relay not heard
//!   for `staleAfterMs`, has no precise match: the approximate index answers for it.

use crate::config::quantity::parse_duration_ms;
use crate::config::validate::{as_str, err};
use crate::config::{ConfigError, Params};
use hashbrown::{HashMap, HashSet};
use serde_json::Value;
use xxhash_rust::xxh64::xxh64;

use super::index::PrefixMatch;
use super::speculative::Speculative;

/// The plugin's type name.
pub const TYPE: &str = "precise-prefix-cache-scorer";
/// llm-d-router's split pipeline: the producer of the precise matches (read by
/// `prefix-cache-scorer` with `prefixMatchInfoProducerName`), same parameters.
pub const PRODUCER_TYPE: &str = "precise-prefix-cache-producer";

/// Its parameters.
pub const PARAMETERS: &[&str] = &[
    "relayCluster",
    "relayAuthority",
    "relayPath",
    "pollIntervalMs",
    "timeoutMs",
    "staleAfterMs",
    "maxBlocksPerServer",
    "maxServers",
    "maxPrefixBlocksToMatch",
    "tokenizer",
    "speculativeIndexing",
    "speculativeTTL",
    // llm-d-router's parameters: accepted and checked; each takes effect in kv-relay or
    // is replaced by what the relay learns ([`check_reference_parameters`]).
    "kvEventsConfig",
    "indexerConfig",
    "tokenProcessorConfig",
];

/// Default `relayCluster`.
pub const DEFAULT_RELAY_CLUSTER: &str = "kv-relay";

/// The tokenizers the filter can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokenizer {
    /// vllm-sim's 4-character pieces and chat template ([`super::sim_tokens`]).
    VllmSim,
    /// The relay tokenizes: text keys and the template shape it publishes
    /// ([`super::text_keys`]).
    Relay,
}

/// `precise-prefix-cache-scorer`'s parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct PreciseConfig {
    /// The Envoy cluster of the relay.
    pub relay_cluster: String,
    /// `:authority` of the calls (default: the cluster name).
    pub relay_authority: String,
    /// Path of the state resource.
    pub relay_path: String,
    /// How often each VM asks for changes.
    pub poll_interval_ms: u64,
    /// Callout timeout.
    pub timeout_ms: u64,
    /// A relay not heard for this long makes every server fall back.
    pub stale_after_ms: u64,
    /// Keys kept per server (more are ignored, counted in the log).
    pub max_blocks_per_server: usize,
    /// Servers kept.
    pub max_servers: usize,
    /// Blocks of a prompt matched at most.
    pub max_prefix_blocks: usize,
    pub tokenizer: Tokenizer,
    /// How long a pick credits the chosen server with the prompt's blocks the relay does not
    /// report yet (`speculativeIndexing`, `speculativeTTL`; [`super::speculative`]); 0: off.
    pub speculative_ttl_ms: u64,
}

/// Default `speculativeTTL`.
pub const DEFAULT_SPECULATIVE_TTL_MS: u64 = 2_000;

/// Checks llm-d-router's nested parameters (names and types; an unknown one is refused).
/// None changes what the filter does, because each belongs to another place here:
///
/// * `kvEventsConfig.zmqEndpoint`, `topicFilter` → kv-relay's `--server
///   events=…,topic=…` (the relay subscribes to each server's publisher);
///   `concurrency`, `discoverPods`, `podDiscoveryConfig` → the relay runs one task per
///   `--server` it is given; `engineType` → only `vllm` (the relay reads vLLM's events).
/// * `indexerConfig.kvBlockIndexConfig` → the index lives in kv-relay (`--max-blocks-per-
///   server`; its counters on the relay's `/metrics`): `enableMetrics`,
///   `metricsLoggingInterval` and the backend configs are accepted without effect here.
/// * `tokenProcessorConfig.blockSize` / `blockSizeTokens` → each server's events carry
///   its own block size, which the relay keys by; `hashSeed` → the relay re-keys blocks
///   from their token ids, so vLLM's hash seed never matters.
pub fn check_reference_parameters(p: &Params<'_>) -> Result<(), ConfigError> {
    if let Some(v) = p.get("kvEventsConfig") {
        let path = p.path("kvEventsConfig");
        let k = Params::new(
            Some(v),
            &path,
            &[
                "zmqEndpoint",
                "topicFilter",
                "concurrency",
                "discoverPods",
                "podDiscoveryConfig",
                "engineType",
            ],
        )?;
        k.string("zmqEndpoint", "")?;
        k.string("topicFilter", "")?;
        k.i64("concurrency", 1)?;
        k.bool("discoverPods", false)?;
        if let Some(d) = k.get("podDiscoveryConfig") {
            let dp = Params::new(
                Some(d),
                &k.path("podDiscoveryConfig"),
                &["socketPort", "podLabelSelector", "podNamespace"],
            )?;
            let port = dp.i64("socketPort", 5557)?;
            if !(1..=65_535).contains(&port) {
                return Err(err(&dp.path("socketPort"), "must be a port (1-65535)"));
            }
        }
        let engine = k.string("engineType", "vllm")?;
        if engine != "vllm" {
            return Err(err(
                &k.path("engineType"),
                format!("\"{engine}\" is not supported: kv-relay reads vLLM's KV events"),
            ));
        }
    }
    if let Some(v) = p.get("indexerConfig") {
        let path = p.path("indexerConfig");
        let i = Params::new(Some(v), &path, &["kvBlockIndexConfig"])?;
        if let Some(b) = i.get("kvBlockIndexConfig") {
            let bp = Params::new(
                Some(b),
                &i.path("kvBlockIndexConfig"),
                &[
                    "enableMetrics",
                    "metricsLoggingInterval",
                    "inMemoryConfig",
                    "costAwareMemoryConfig",
                    "redisConfig",
                ],
            )?;
            bp.bool("enableMetrics", false)?;
            bp.i64("metricsLoggingInterval", 0)?;
            for name in ["inMemoryConfig", "costAwareMemoryConfig", "redisConfig"] {
                if let Some(c) = bp.get(name) {
                    crate::config::validate::as_object(c, &bp.path(name))?;
                }
            }
        }
    }
    if let Some(v) = p.get("tokenProcessorConfig") {
        let path = p.path("tokenProcessorConfig");
        let t = Params::new(
            Some(v),
            &path,
            &["blockSize", "blockSizeTokens", "hashSeed"],
        )?;
        t.positive("blockSize", 16)?;
        t.positive("blockSizeTokens", 16)?;
        if t.get("hashSeed")
            .is_some_and(|h| !(h.is_string() || h.is_u64()))
        {
            return Err(err(
                &t.path("hashSeed"),
                "must be a string or a non-negative integer",
            ));
        }
    }
    Ok(())
}

impl PreciseConfig {
    /// Reads the parameters; errors name the field.
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(Some(v), path, PARAMETERS)?;
        check_reference_parameters(&p)?;
        let relay_cluster = p.string("relayCluster", DEFAULT_RELAY_CLUSTER)?;
        if relay_cluster.is_empty() {
            return Err(err(
                &p.path("relayCluster"),
                "must name the Envoy cluster of kv-relay, which follows the servers' KV events",
            ));
        }
        let tokenizer = match p.string("tokenizer", "vllm-sim")?.as_str() {
            "vllm-sim" => Tokenizer::VllmSim,
            "relay" => Tokenizer::Relay,
            other => {
                return Err(err(
                    &p.path("tokenizer"),
                    format!("\"{other}\" is not available: \"vllm-sim\" (the simulator's tokenizer, in the filter) or \"relay\" (a real model: kv-relay --tokenizer MODEL_DIR tokenizes)"),
                ))
            }
        };
        let speculative_ttl_ms = if p.bool("speculativeIndexing", true)? {
            match p.get("speculativeTTL") {
                None => DEFAULT_SPECULATIVE_TTL_MS,
                Some(v) => {
                    let path = p.path("speculativeTTL");
                    let text = as_str(v, &path)?;
                    match parse_duration_ms(text).map_err(|e| err(&path, e))? {
                        0 => return Err(err(
                            &path,
                            "must be positive (speculativeIndexing: false turns speculation off)",
                        )),
                        ms => ms,
                    }
                }
            }
        } else {
            0
        };
        let count = |name: &str, default: i64| -> Result<u64, ConfigError> {
            Ok(p.positive(name, default)?.unsigned_abs())
        };
        Ok(PreciseConfig {
            relay_authority: p.string("relayAuthority", &relay_cluster)?,
            relay_cluster,
            relay_path: p.string("relayPath", "/v1/kv/state")?,
            poll_interval_ms: count("pollIntervalMs", 200)?,
            timeout_ms: count("timeoutMs", 1_000)?,
            stale_after_ms: count("staleAfterMs", 5_000)?,
            max_blocks_per_server: usize::try_from(count("maxBlocksPerServer", 1_000_000)?)
                .unwrap_or(usize::MAX),
            max_servers: usize::try_from(count("maxServers", 1_024)?).unwrap_or(usize::MAX),
            max_prefix_blocks: usize::try_from(count("maxPrefixBlocksToMatch", 256)?)
                .unwrap_or(usize::MAX),
            tokenizer,
            speculative_ttl_ms,
        })
    }

    /// The prompt text as the servers tokenize it, when it differs from the request's
    /// `prompt`: a chat conversation (`messages`) rendered by the servers' chat template,
    /// or a completion prompt with what tokenization adds before it. [`Unrendered`]: a
    /// chat the filter cannot render (precise matching falls back for it).
    pub fn server_text<'a>(
        &self,
        state: &PreciseState,
        messages: Option<impl Iterator<Item = (&'a str, &'a str)>>,
        prompt: &str,
    ) -> Result<Option<String>, Unrendered> {
        match (self.tokenizer, messages) {
            (Tokenizer::VllmSim, Some(m)) => Ok(Some(super::sim_tokens::chat_template(m))),
            (Tokenizer::VllmSim, None) => Ok(None),
            (Tokenizer::Relay, Some(m)) => {
                let shape = state.text.as_ref().and_then(|t| t.chat.as_ref());
                shape.and_then(|c| c.render(m)).map(Some).ok_or(Unrendered)
            }
            (Tokenizer::Relay, None) => Ok(state
                .text
                .as_ref()
                .filter(|t| !t.completion_prefix.is_empty())
                .map(|t| format!("{}{prompt}", t.completion_prefix))),
        }
    }

    /// When a speculative entry recorded at `now_ms` ends.
    pub fn speculation_end(&self, now_ms: i64) -> i64 {
        now_ms.saturating_add(i64::try_from(self.speculative_ttl_ms).unwrap_or(i64::MAX))
    }

    /// Token ids of a prompt as the servers tokenize it (the prompt already rendered by
    /// the servers' chat template for chat requests); none with `tokenizer: relay`
    /// (text keys, no token ids).
    pub fn tokens(&self, prompt: &str, max: usize) -> Vec<u32> {
        match self.tokenizer {
            Tokenizer::VllmSim => super::sim_tokens::encode(prompt, max),
            Tokenizer::Relay => Vec::new(),
        }
    }
}

/// A chat conversation the servers' template shape (from the relay) does not cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unrendered;

/// The chain root of `model`.
pub fn root(model: &str) -> u64 {
    xxh64(model.as_bytes(), 0)
}

/// The block keys of `tokens` (full blocks of `block_size`, at most `max_blocks`).
pub fn keys(model: &str, tokens: &[u32], block_size: usize, max_blocks: usize) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut prev = root(model);
    let mut buf = Vec::with_capacity(block_size * 4 + 8);
    tokens
        .chunks_exact(block_size)
        .take(max_blocks)
        .map(|block| {
            buf.clear();
            for t in block {
                buf.extend_from_slice(&t.to_le_bytes());
            }
            buf.extend_from_slice(&prev.to_le_bytes());
            prev = xxh64(&buf, 0);
            prev
        })
        .collect()
}

/// One server as the relay reports it.
#[derive(Debug, Default, Clone)]
pub struct ServerBlocks {
    pub block_size: u32,
    pub stale: bool,
    pub keys: HashSet<u64>,
}

/// This VM's copy of the relay's state.
#[derive(Debug, Default)]
pub struct PreciseState {
    epoch: u64,
    version: u64,
    servers: HashMap<String, ServerBlocks>,
    /// When the relay last answered (ms; 0: never).
    pub heard_ms: i64,
    /// Keys not kept because a server was over `maxBlocksPerServer`, or servers over
    /// `maxServers`.
    pub overflow: u64,
    /// Blocks this gateway routed to a server that the relay does not report yet.
    pub speculative: Speculative,
    /// How to compute text keys (`tokenizer: relay`), from the relay's last answer.
    pub text: Option<super::text_keys::TextSpec>,
}

/// A prompt's block keys for each block size of the servers it was matched against
/// (servers of one pool normally share one).
pub type PromptKeys = Vec<(u32, Vec<u64>)>;

impl PreciseState {
    /// The query asking for the changes since what this VM holds (empty: a snapshot).
    pub fn query(&self) -> String {
        if self.heard_ms == 0 {
            String::new()
        } else {
            format!("?epoch={}&since={}", self.epoch, self.version)
        }
    }

    /// Applies one answer of the relay at `now_ms`. A malformed answer changes nothing.
    pub fn apply(&mut self, body: &[u8], now_ms: i64, cfg: &PreciseConfig) -> Result<(), String> {
        let v: Value = serde_json::from_slice(body).map_err(|e| format!("relay answer: {e}"))?;
        let num = |k: &str| {
            v.get(k)
                .and_then(Value::as_u64)
                .ok_or(format!("relay answer: no {k}"))
        };
        let (epoch, version) = (num("epoch")?, num("version")?);
        let full = v.get("full").and_then(Value::as_bool).unwrap_or(true);
        let servers = v
            .get("servers")
            .and_then(Value::as_array)
            .ok_or("relay answer: no servers")?;
        if full {
            self.servers.clear();
            self.text = v
                .get("text")
                .and_then(super::text_keys::TextSpec::from_json);
        } else if epoch != self.epoch {
            return Err("relay answer: deltas of another relay run".into());
        }
        self.speculative.expire(now_ms);
        for s in servers {
            let Some(endpoint) = s.get("endpoint").and_then(Value::as_str) else {
                continue;
            };
            if !self.servers.contains_key(endpoint) && self.servers.len() >= cfg.max_servers {
                self.overflow += 1;
                continue;
            }
            let entry = self.servers.entry_ref(endpoint).or_default();
            entry.block_size = s
                .get("blockSize")
                .and_then(Value::as_u64)
                .and_then(|b| u32::try_from(b).ok())
                .unwrap_or(0);
            entry.stale = s.get("stale").and_then(Value::as_bool).unwrap_or(true);
            if s.get("clear").and_then(Value::as_bool).unwrap_or(false) {
                entry.keys.clear();
                // A snapshot clears every server; a change that clears one is a restart.
                if !full {
                    self.speculative.forget_server(endpoint);
                }
            }
            let ints = |k: &str| {
                s.get(k)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_u64)
            };
            // A block the relay mentions is no longer speculative: stored, it is confirmed;
            // removed, the server evicted it.
            for k in ints("remove") {
                entry.keys.remove(&k);
                self.speculative.forget(endpoint, k);
            }
            for k in ints("add") {
                self.speculative.forget(endpoint, k);
                if entry.keys.len() >= cfg.max_blocks_per_server {
                    self.overflow += 1;
                    continue;
                }
                entry.keys.insert(k);
            }
        }
        self.epoch = epoch;
        self.version = version;
        self.heard_ms = now_ms;
        Ok(())
    }

    /// The server at `address`, when its state can be trusted at `now_ms`.
    fn fresh(&self, address: &str, now_ms: i64, cfg: &PreciseConfig) -> Option<&ServerBlocks> {
        let relay_live = self.heard_ms > 0
            && now_ms.saturating_sub(self.heard_ms)
                <= i64::try_from(cfg.stale_after_ms).unwrap_or(i64::MAX);
        let s = self.servers.get(address)?;
        // Token keys need the server's block size (known from its first stored block);
        // text keys do not: a live server that stored nothing holds nothing.
        let keyable = s.block_size > 0 || cfg.tokenizer == Tokenizer::Relay;
        (relay_live && !s.stale && keyable).then_some(s)
    }

    /// Per candidate address: the prompt's leading blocks the server holds (reported, or
    /// speculatively credited), or `None` when its state is unknown or stale (the
    /// approximate index answers instead); and the prompt's keys (for [`Self::speculate`]).
    pub fn matches<'a>(
        &self,
        cfg: &PreciseConfig,
        model: &str,
        prompt: &str,
        candidates: impl Iterator<Item = &'a str>,
        now_ms: i64,
    ) -> (Vec<Option<PrefixMatch>>, PromptKeys) {
        let candidates: Vec<&str> = candidates.collect();
        let servers: Vec<Option<&ServerBlocks>> = candidates
            .iter()
            .map(|a| self.fresh(a, now_ms, cfg))
            .collect();
        let Some(largest) = servers.iter().flatten().map(|s| s.block_size).max() else {
            return (vec![None; candidates.len()], Vec::new());
        };
        // Servers of one pool normally share a block size.
        let mut sizes: Vec<u32> = servers.iter().flatten().map(|s| s.block_size).collect();
        sizes.sort_unstable();
        sizes.dedup();
        // The prompt's keys per block size; with text keys (`tokenizer: relay`) the same keys
        // under every size (a text block is the relay's, whatever the server's), and the
        // tokens a text block stands for.
        let (by_size, text_block_tokens): (PromptKeys, Option<u32>) =
            if cfg.tokenizer == Tokenizer::Relay {
                let Some(text) = &self.text else {
                    return (vec![None; candidates.len()], Vec::new());
                };
                let keys = super::text_keys::keys(
                    model,
                    prompt.as_bytes(),
                    text.block_bytes,
                    cfg.max_prefix_blocks,
                );
                let tokens_per_block = u32::try_from(text.block_bytes / 4)
                    .unwrap_or(u32::MAX)
                    .max(1);
                let by_size = sizes.into_iter().map(|b| (b, keys.clone())).collect();
                (by_size, Some(tokens_per_block))
            } else {
                let max_tokens = cfg
                    .max_prefix_blocks
                    .saturating_mul(usize::try_from(largest).unwrap_or(usize::MAX));
                let tokens = cfg.tokens(prompt, max_tokens);
                let by_size = sizes
                    .into_iter()
                    .map(|b| (b, keys(model, &tokens, b as usize, cfg.max_prefix_blocks)))
                    .collect();
                (by_size, None)
            };
        let matches = servers
            .iter()
            .zip(&candidates)
            .map(|(s, address)| {
                let s = (*s)?;
                let (_, keys) = by_size.iter().find(|(b, _)| *b == s.block_size)?;
                let matched = keys
                    .iter()
                    .take_while(|k| {
                        s.keys.contains(*k) || self.speculative.holds(address, **k, now_ms)
                    })
                    .count();
                Some(PrefixMatch {
                    matched: u32::try_from(matched).unwrap_or(u32::MAX),
                    total: u32::try_from(keys.len()).unwrap_or(u32::MAX),
                    block_size_tokens: text_block_tokens.unwrap_or(s.block_size),
                })
            })
            .collect();
        (matches, by_size)
    }

    /// A request with `keys` ([`Self::matches`]) was routed to `address` at `now_ms`:
    /// credits the server with the blocks the relay does not report there, until
    /// `speculativeTTL` has passed, and returns them (for the other workers, through the
    /// prefix log). Nothing when speculation is off or the relay does not know the server.
    pub fn speculate(
        &mut self,
        cfg: &PreciseConfig,
        address: &str,
        keys: &PromptKeys,
        now_ms: i64,
    ) -> Vec<u64> {
        if cfg.speculative_ttl_ms == 0 {
            return Vec::new();
        }
        let Some(server) = self.servers.get(address) else {
            return Vec::new();
        };
        let Some((_, keys)) = keys.iter().find(|(b, _)| *b == server.block_size) else {
            return Vec::new();
        };
        let pending: Vec<u64> = keys
            .iter()
            .copied()
            .filter(|k| !server.keys.contains(k))
            .collect();
        self.speculative
            .add(address, &pending, cfg.speculation_end(now_ms));
        pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn cfg() -> PreciseConfig {
        PreciseConfig::from_parameters(&Value::Null, "p").unwrap()
    }

    /// The same vector as kv-relay's `keys::tests::known_vector`: both sides must agree.
    #[wasm_bindgen_test(unsupported = test)]
    fn keys_match_the_relay() {
        let k = keys("m", &[1, 2, 3, 4, 5], 2, 256);
        assert_eq!(root("m"), 0xba2e_5670_83a2_b2e8);
        assert_eq!(k, vec![0x9f0d_d706_89ab_42c5, 0xbbe7_97d4_0b78_4970]);
        assert_eq!(keys("m", &[1, 2, 3, 4], 2, 1).len(), 1);
        assert!(keys("m", &[1, 2, 3], 0, 9).is_empty());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn config_errors_name_the_field() {
        let e = |v: Value| {
            PreciseConfig::from_parameters(&v, "plugins[0].parameters")
                .unwrap_err()
                .to_string()
        };
        assert!(e(json!({"relayCluster": ""})).contains("plugins[0].parameters.relayCluster"));
        assert!(e(json!({"relayCluster": "r", "tokenizer": "hf"})).contains("tokenizer"));
        assert!(e(json!({"tokenizer": "hf"})).contains("kv-relay --tokenizer"));
        // llm-d-router's nested parameters load; a wrong one names its field.
        let reference = json!({
            "tokenProcessorConfig": {"blockSize": 16, "hashSeed": "42"},
            "kvEventsConfig": {"zmqEndpoint": "tcp://0.0.0.0:5557", "topicFilter": "kv@",
                "concurrency": 32, "discoverPods": true, "podDiscoveryConfig": {"socketPort": 5557}},
            "indexerConfig": {"kvBlockIndexConfig": {"enableMetrics": true,
                "metricsLoggingInterval": 60_000_000_000_i64}}
        });
        assert!(PreciseConfig::from_parameters(&reference, "p").is_ok());
        assert!(e(json!({"kvEventsConfig": {"engineType": "sglang"}}))
            .contains("plugins[0].parameters.kvEventsConfig.engineType"));
        assert!(e(json!({"kvEventsConfig": {"zmqEndpoints": "x"}}))
            .contains("plugins[0].parameters.kvEventsConfig.zmqEndpoints"));
        assert!(e(json!({"tokenProcessorConfig": {"blockSize": 0}}))
            .contains("tokenProcessorConfig.blockSize"));
        assert!(e(json!({"relayCluster": "r", "pollIntervalMs": 0})).contains("pollIntervalMs"));
        assert!(e(json!({"speculativeTTL": "2 seconds"})).contains("speculativeTTL"));
        assert!(e(json!({"speculativeTTL": "0"})).contains("speculativeIndexing: false"));
        let c = cfg();
        assert_eq!(c.relay_authority, "kv-relay");
        assert_eq!(c.poll_interval_ms, 200);
        assert_eq!(c.speculative_ttl_ms, DEFAULT_SPECULATIVE_TTL_MS);
        let with = |v: Value| PreciseConfig::from_parameters(&v, "p").unwrap();
        assert_eq!(
            with(json!({"speculativeTTL": "500ms"})).speculative_ttl_ms,
            500
        );
        assert_eq!(
            with(json!({"speculativeIndexing": false})).speculative_ttl_ms,
            0
        );
    }

    fn prompt_keys(prompt: &str, bs: usize) -> Vec<u64> {
        keys(
            "m",
            &super::super::sim_tokens::encode(prompt, usize::MAX),
            bs,
            256,
        )
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn snapshot_then_deltas_then_matching_with_fallback() {
        let c = cfg();
        let prompt = "abcd".repeat(40); // 40 tokens: 2 full blocks of 16
        let k = prompt_keys(&prompt, 16);
        assert_eq!(k.len(), 2);
        let mut s = PreciseState::default();
        assert_eq!(s.query(), "");
        let snap = json!({"epoch": 5, "version": 10, "full": true, "servers": [
            {"endpoint": "a:1", "blockSize": 16, "stale": false, "clear": true, "add": [k[0], k[1]], "remove": []},
            {"endpoint": "b:1", "blockSize": 16, "stale": false, "clear": true, "add": [k[0]], "remove": []},
            {"endpoint": "c:1", "blockSize": 16, "stale": true, "clear": true, "add": [k[0], k[1]], "remove": []},
        ]});
        s.apply(snap.to_string().as_bytes(), 1_000, &c).unwrap();
        assert_eq!(s.query(), "?epoch=5&since=10");
        let (m, _) = s.matches(
            &c,
            "m",
            &prompt,
            ["a:1", "b:1", "c:1", "d:1"].into_iter(),
            1_100,
        );
        assert_eq!(m[0].map(|m| (m.matched, m.total)), Some((2, 2)));
        assert_eq!(m[1].map(|m| m.matched), Some(1));
        assert_eq!(m[2], None, "stale: fall back");
        assert_eq!(m[3], None, "unknown: fall back");
        // A reported eviction stops the credit.
        let delta = json!({"epoch": 5, "version": 11, "full": false, "servers": [
            {"endpoint": "a:1", "blockSize": 16, "stale": false, "add": [], "remove": [k[0]]},
        ]});
        s.apply(delta.to_string().as_bytes(), 1_200, &c).unwrap();
        let (m, _) = s.matches(&c, "m", &prompt, ["a:1", "b:1"].into_iter(), 1_200);
        assert_eq!(
            m[0].map(|m| m.matched),
            Some(0),
            "the chain breaks at the first block"
        );
        assert_eq!(m[1].map(|m| m.matched), Some(1));
        // A relay silent for longer than staleAfterMs: everyone falls back.
        let (m, _) = s.matches(&c, "m", &prompt, ["b:1"].into_iter(), 1_200 + 5_001);
        assert_eq!(m, vec![None]);
        // Deltas of another relay run are refused; garbage changes nothing.
        let other = json!({"epoch": 6, "version": 1, "full": false, "servers": []});
        assert!(s.apply(other.to_string().as_bytes(), 1_300, &c).is_err());
        assert!(s.apply(b"not json", 1_300, &c).is_err());
        assert_eq!(s.query(), "?epoch=5&since=11");
    }

    /// `tokenizer: relay`: the relay's text keys, over the prompt as the servers see it
    /// (its completion prefix, or the chat rendered by the template shape it learnt).
    #[wasm_bindgen_test(unsupported = test)]
    fn relay_text_keys_for_completions_and_chats() {
        let c = PreciseConfig::from_parameters(&json!({"tokenizer": "relay"}), "p").unwrap();
        let mut s = PreciseState::default();
        let none: Option<std::iter::Empty<(&str, &str)>> = None;
        // No relay answer yet: a chat cannot be rendered, a completion is as sent.
        let chat = [("user", "hello")];
        assert_eq!(
            c.server_text(&s, Some(chat.into_iter()), ""),
            Err(Unrendered)
        );
        assert_eq!(c.server_text(&s, none.clone(), "x"), Ok(None));
        let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(4);
        let text = format!("<bos>{prompt}");
        let k = super::super::text_keys::keys("m", text.as_bytes(), 64, 256);
        assert_eq!(k.len(), 2);
        let snap = json!({"epoch": 1, "version": 1, "full": true,
        "text": {"blockBytes": 64, "completionPrefix": "<bos>",
                 "chat": {"head": "<bos>[u]", "seps": {}, "tails": {"user": "[a]"}, "trim": false}},
        "servers": [
            {"endpoint": "a:1", "blockSize": 16, "stale": false, "add": [k[0], k[1]]},
            {"endpoint": "b:1", "blockSize": 16, "stale": false, "add": [k[1]]},
        ]});
        s.apply(snap.to_string().as_bytes(), 1_000, &c).unwrap();
        let sent = c.server_text(&s, none, &prompt).unwrap().unwrap();
        assert_eq!(sent, text);
        let (m, _) = s.matches(&c, "m", &sent, ["a:1", "b:1"].into_iter(), 1_000);
        assert_eq!(m[0].map(|m| (m.matched, m.total)), Some((2, 2)));
        assert_eq!(m[1].map(|m| m.matched), Some(0), "a chain needs its head");
        assert_eq!(
            c.server_text(&s, Some(chat.into_iter()), "").unwrap(),
            Some("<bos>[u]hello[a]".to_string())
        );
        // A role pair the shape does not know: not rendered (the caller falls back).
        let unknown = [("user", "a"), ("assistant", "b"), ("user", "c")];
        assert_eq!(
            c.server_text(&s, Some(unknown.into_iter()), ""),
            Err(Unrendered)
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn bounded_in_blocks_and_servers() {
        let mut c = cfg();
        c.max_blocks_per_server = 2;
        c.max_servers = 1;
        let mut s = PreciseState::default();
        let snap = json!({"epoch": 1, "version": 1, "full": true, "servers": [
            {"endpoint": "a:1", "blockSize": 16, "stale": false, "add": [1, 2, 3]},
            {"endpoint": "b:1", "blockSize": 16, "stale": false, "add": [1]},
        ]});
        s.apply(snap.to_string().as_bytes(), 1, &c).unwrap();
        assert_eq!(s.overflow, 2);
        assert_eq!(s.servers.len(), 1);
    }
}
