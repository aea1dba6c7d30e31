//! `burst-prefix-cache-producer` (llm-d-router): co-locates a burst of requests that share
//! a prompt (an RL rollout group's samples) so the prefix is prefilled once.
//!
//! The reference holds requests for a window (`windowDurationMs`), groups identical
//! prompts and places each group on one replica, because its approximate index learns a
//! pick only after it. Here the approximate index learns every pick when it is made, in
//! every worker (the shared prefix log), so the second sample of a group already finds
//! the first's blocks on its replica and the prefix scorer sends it there: the whole group
//! lands on one replica (the reference's `maxPerReplica: -1`), with no window to wait.
//! So this producer is the approximate one (`approx-prefix-cache-producer`), with its
//! parameters, plus the reference's burst parameters, each accepted only where it
//! describes what happens here:
//!
//! * `windowDurationMs` (1..10000) — checked; no window: every request is placed on arrival.
//! * `maxPerReplica` — `-1` (the default): a group is not split. A bound (`k > 0`) is
//!   refused: splitting a group across replicas is not built.
//! * `minColocateBlocks` — any value: the index matches shared leading blocks whatever
//!   their count, so requests sharing a prefix are co-located as with any positive value.
//! * `balanceBy` — `requests` (the default); `tokens` is refused (not built).
//! * `maxBatchSize` — checked; no batch is held.
//! * `blockSizeTokens` (default 64 here, as the reference's producer), `maxPrefixTokensToMatch`
//!   — the index's, as `approx-prefix-cache-producer`.

use super::{PrefixConfig, PARAMETERS};
use crate::config::validate::err;
use crate::config::{ConfigError, Params};
use serde_json::{Map, Value};

/// The type name.
pub const TYPE: &str = "burst-prefix-cache-producer";

const BURST: &[&str] = &[
    "windowDurationMs",
    "maxPerReplica",
    "minColocateBlocks",
    "balanceBy",
    "maxBatchSize",
];

/// Default `blockSizeTokens` of the burst producer in the reference.
pub const DEFAULT_BLOCK_SIZE_TOKENS: u64 = 64;

/// Checks the parameters and returns the index's.
pub fn from_parameters(v: &Value, path: &str) -> Result<PrefixConfig, ConfigError> {
    let known: Vec<&str> = PARAMETERS.iter().chain(BURST).copied().collect();
    let p = Params::new(Some(v), path, &known)?;
    let window = p.i64("windowDurationMs", 100)?;
    if !(1..=10_000).contains(&window) {
        return Err(err(
            &p.path("windowDurationMs"),
            "must be between 1 and 10000",
        ));
    }
    let k = p.i64("maxPerReplica", -1)?;
    if k != -1 {
        return Err(err(
            &p.path("maxPerReplica"),
            "only -1 (a group is not split) is supported: the index sends a group's samples where the first went",
        ));
    }
    if p.i64("minColocateBlocks", 0)? < 0 {
        return Err(err(&p.path("minColocateBlocks"), "must not be negative"));
    }
    let balance = p.string("balanceBy", "requests")?;
    if balance != "requests" {
        return Err(err(
            &p.path("balanceBy"),
            format!("\"{balance}\" is not supported: only \"requests\""),
        ));
    }
    p.i64("maxBatchSize", 1000)?;
    // The index's parameters, with the burst producer's default block size.
    let mut index: Map<String, Value> = v
        .as_object()
        .map(|o| {
            o.iter()
                .filter(|(k, _)| PARAMETERS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    index
        .entry("blockSizeTokens")
        .or_insert(Value::from(DEFAULT_BLOCK_SIZE_TOKENS));
    PrefixConfig::from_parameters(&Value::Object(index), path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn the_reference_example_loads_and_unbuilt_settings_are_refused() {
        let c = from_parameters(
            &json!({"windowDurationMs": 100, "maxPerReplica": -1, "minColocateBlocks": 0}),
            "p",
        )
        .unwrap();
        assert_eq!(c.block_size_tokens, DEFAULT_BLOCK_SIZE_TOKENS);
        let e = |v| from_parameters(&v, "p").unwrap_err().path;
        assert_eq!(e(json!({"maxPerReplica": 4})), "p.maxPerReplica");
        assert_eq!(e(json!({"balanceBy": "tokens"})), "p.balanceBy");
        assert_eq!(e(json!({"windowDurationMs": 0})), "p.windowDurationMs");
        assert_eq!(e(json!({"nope": 1})), "p.nope");
    }
}
