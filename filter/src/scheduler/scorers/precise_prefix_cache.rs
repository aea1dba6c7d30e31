//! `precise-prefix-cache-scorer` (the reference's name): `matchedBlocks / totalBlocks` where,
//! for every server whose KV events reach the filter through `kv-relay`, the match is the
//! run of the prompt's leading blocks the server reports holding
//! ([`crate::prefix::precise`]); for a server the relay does not know or marks stale, the
//! approximate index's match (with the rendezvous prior) as `prefix-cache-scorer`.
//!
//! With this plugin configured, every reader of prefix matches (the affinity filter, the
//! P/D decider, the latency features) sees the precise match where it exists.

use crate::config::ConfigError;
use crate::prefix::precise::PreciseConfig;
use crate::scheduler::{Cycle, Scorer};
use serde_json::Value;

pub use crate::prefix::precise::TYPE;

/// The precise prefix-cache scorer.
#[derive(Debug, Default)]
pub struct PrecisePrefixCache;

impl Scorer for PrecisePrefixCache {
    fn score(&self, cx: &Cycle<'_>, endpoints: &[usize]) -> Vec<f64> {
        endpoints
            .iter()
            .map(|&i| cx.prefix_affinity(i).ratio())
            .collect()
    }
}

impl PrecisePrefixCache {
    /// Builds the scorer and its relay settings (errors name the field).
    pub fn from_parameters(v: &Value, path: &str) -> Result<(Self, PreciseConfig), ConfigError> {
        Ok((Self, PreciseConfig::from_parameters(v, path)?))
    }
}

#[cfg(test)]
mod tests {
    use crate::prefix::index::PrefixIndex;
    use crate::prefix::precise::keys;
    use crate::prefix::sim_tokens;
    use crate::scheduler::testing::*;
    use crate::scheduler::Request;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    /// A runtime whose one profile is this scorer (with `parameters`) and max-score-picker.
    fn runtime(parameters: serde_json::Value) -> crate::runtime::Runtime {
        crate::runtime::load(
            &json!({
                "plugins": [
                    {"type": "precise-prefix-cache-scorer", "parameters": parameters},
                    {"type": "max-score-picker"}
                ],
                "schedulingProfiles": [{"name": "default", "plugins": [
                    {"pluginRef": "precise-prefix-cache-scorer"}, {"pluginRef": "max-score-picker"}
                ]}]
            })
            .to_string(),
        )
        .unwrap()
    }

    /// Through the scheduler: the relay's report beats the approximate index, an evicted
    /// block stops the credit, a stale server falls back to the approximate index.
    #[wasm_bindgen_test(unsupported = test)]
    fn reported_blocks_decide_and_stale_servers_fall_back() {
        let rt = runtime(json!({"relayCluster": "kv-relay"}));
        let s = &rt.scheduler;
        let cfg = s.precise.clone().unwrap();
        let c = candidates(&[(0, 0, 0.0); 3]);
        let (a, b, cc) = (&c[0].address, &c[1].address, &c[2].address);
        let prompt = "abcd".repeat(64); // 64 tokens: 4 blocks of 16
        let k = keys("m", &sim_tokens::encode(&prompt, usize::MAX), 16, 256);
        let mut index = PrefixIndex::new();
        // The approximate index believes C holds everything (it routed there).
        let approx = crate::prefix::hash::hash_prompt("m", None, prompt.as_bytes(), 64, 256);
        index.insert(cc, &approx, 1000);
        let state = |stale_c: bool, a_keys: &[u64]| {
            json!({"epoch": 1, "version": 1, "full": true, "servers": [
                {"endpoint": a, "blockSize": 16, "stale": false, "add": a_keys},
                {"endpoint": b, "blockSize": 16, "stale": false, "add": [k[0]]},
                {"endpoint": cc, "blockSize": 16, "stale": stale_c, "add": []},
            ]})
            .to_string()
        };
        let request = Request {
            model: "m",
            prompt: &prompt,
            now_ms: 1_000,
            ..Request::default()
        };
        let pick = |index: &PrefixIndex| {
            let mut rng = crate::rng::Rng::new(1);
            let mut probe = crate::scheduler::Probe::new(None);
            let d = s
                .schedule(&request, &c, index, &mut rng, &mut probe)
                .unwrap();
            // A prompt a server reports holding part of is not cold: no rendezvous prior may
            // promote another server over the one that holds it.
            if d.prefix.iter().take(2).any(|m| m.matched > 0) {
                assert!(d.prior.is_empty(), "prior {:?}", d.prior);
            }
            (d.primary().unwrap(), d.prefix.clone())
        };
        index
            .precise
            .apply(state(false, &k).as_bytes(), 1_000, &cfg)
            .unwrap();
        let (chosen, m) = pick(&index);
        assert_eq!(chosen, 0, "A reports all four blocks");
        assert_eq!((m[0].matched, m[1].matched, m[2].matched), (4, 1, 0));
        // A reports an eviction of its first block: no credit left there.
        index
            .precise
            .apply(state(false, &k[1..]).as_bytes(), 1_000, &cfg)
            .unwrap();
        let (chosen, m) = pick(&index);
        assert_eq!(m[0].matched, 0);
        assert_eq!(chosen, 1, "B still holds the first block");
        // C's stream is stale: the approximate index answers for C.
        index
            .precise
            .apply(state(true, &k[1..]).as_bytes(), 1_000, &cfg)
            .unwrap();
        let (chosen, m) = pick(&index);
        assert_eq!(chosen, 2);
        assert!(m[2].matched > 0);
    }

    /// `tokenizer: relay`: text keys the relay reports decide; a chat the filter could not
    /// render as the servers do is matched by the approximate index instead.
    #[wasm_bindgen_test(unsupported = test)]
    fn text_keys_decide_and_unrendered_chats_fall_back() {
        let rt = runtime(json!({"tokenizer": "relay"}));
        let s = &rt.scheduler;
        let cfg = s.precise.clone().unwrap();
        let c = candidates(&[(0, 0, 0.0); 2]);
        let (a, b) = (&c[0].address, &c[1].address);
        let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(8);
        let k = crate::prefix::text_keys::keys("m", prompt.as_bytes(), 64, 256);
        let mut index = PrefixIndex::new();
        // The approximate index believes B holds it; the relay reports A.
        let approx = crate::prefix::hash::hash_prompt("m", None, prompt.as_bytes(), 64, 256);
        index.insert(b, &approx, 1000);
        let state = json!({"epoch": 1, "version": 1, "full": true,
        "text": {"blockBytes": 64, "completionPrefix": ""},
        "servers": [
            {"endpoint": a, "blockSize": 16, "stale": false, "add": k},
            {"endpoint": b, "blockSize": 16, "stale": false, "add": []},
        ]});
        index
            .precise
            .apply(state.to_string().as_bytes(), 1_000, &cfg)
            .unwrap();
        let pick = |unrendered_chat: bool| {
            let request = Request {
                model: "m",
                prompt: &prompt,
                now_ms: 1_000,
                unrendered_chat,
                ..Request::default()
            };
            let mut rng = crate::rng::Rng::new(1);
            let mut probe = crate::scheduler::Probe::new(None);
            let d = s
                .schedule(&request, &c, &index, &mut rng, &mut probe)
                .unwrap();
            d.primary().unwrap()
        };
        assert_eq!(pick(false), 0, "A reports the prompt's text blocks");
        assert_eq!(pick(true), 1, "not rendered: the approximate index answers");
    }
}
