//! `prefix-cache-scorer` (also registered as `prefix-scorer`, the seed's name, as the
//! reference accepts it): `matchedBlocks / totalBlocks` from the approximate prefix index
//! with the rendezvous prior (0 when the request has no blocks). The index and its parameters are in `crate::prefix`.

use super::weigh;
use crate::config::ConfigError;
use crate::prefix::PrefixConfig;
use crate::scheduler::{Cycle, Scorer};
use serde_json::Value;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "prefix-cache-scorer";
/// The seed's name for the same plugin.
pub const ALIAS: &str = "prefix-scorer";
/// The parameter naming the prefix producer a scorer reads (llm-d-router).
pub const PRODUCER_NAME: &str = "prefixMatchInfoProducerName";

/// The prefix-cache scorer.
#[derive(Debug, Default)]
pub struct PrefixCache;

impl Scorer for PrefixCache {
    fn score(&self, cx: &Cycle<'_>, endpoints: &[usize]) -> Vec<f64> {
        Self::scores(cx, endpoints).collect()
    }

    fn add_weighted(&self, cx: &Cycle<'_>, endpoints: &[usize], weight: f64, totals: &mut [f64]) {
        weigh(totals, weight, Self::scores(cx, endpoints));
    }
}

impl PrefixCache {
    /// The score of each entry of `endpoints`, in order.
    fn scores<'a>(cx: &'a Cycle<'_>, endpoints: &'a [usize]) -> impl Iterator<Item = f64> + 'a {
        endpoints.iter().map(|&i| cx.prefix_affinity(i).ratio())
    }

    /// Builds the scorer. v1.5+ ignores its parameters; v1.4 configurations put the prefix
    /// index's parameters here, so they are accepted and checked, and returned (the
    /// index uses them when no `approx-prefix-cache-producer` is declared).
    ///
    /// `prefixMatchInfoProducerName` (llm-d-router) names the producer whose matches it
    /// reads; the runtime checks that it names a declared prefix producer. Every producer
    /// here feeds the one view of matches (the servers' reports where `kv-relay` has them,
    /// the approximate index elsewhere), so the name selects nothing more.
    pub fn from_parameters(v: &Value, path: &str) -> Result<(Self, PrefixConfig), ConfigError> {
        let mut index = v.clone();
        if let Some(o) = index.as_object_mut() {
            if let Some(name) = o.remove(PRODUCER_NAME) {
                if !name.is_string() {
                    return Err(crate::config::validate::err(
                        &format!("{path}.{PRODUCER_NAME}"),
                        "must be a plugin name",
                    ));
                }
            }
        }
        Ok((Self, PrefixConfig::from_parameters(&index, path)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prefix::index::PrefixMatch;
    use crate::scheduler::testing::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn matched_over_total_blocks() {
        let c = candidates(&[(0, 0, 0.0); 3]);
        let m = |matched, total| PrefixMatch {
            matched,
            total,
            block_size_tokens: 16,
        };
        let p = [m(3, 4), m(0, 4), m(0, 0)];
        let s = with_cycle(&c, &p, |cx| PrefixCache.score(cx, &all(&c)));
        assert_eq!(s, vec![0.75, 0.0, 0.0]);
    }
}
