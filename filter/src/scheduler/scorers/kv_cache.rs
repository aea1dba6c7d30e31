//! `kv-cache-utilization-scorer`: `1 − KVCacheUsagePercent` (usage is a 0..1 fraction).

use super::weigh;
use crate::config::{ConfigError, Params};
use crate::scheduler::{Cycle, Scorer};
use serde_json::Value;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "kv-cache-utilization-scorer";

/// The KV-cache utilization scorer.
#[derive(Debug, Default)]
pub struct KvCache;

impl Scorer for KvCache {
    fn score(&self, cx: &Cycle<'_>, endpoints: &[usize]) -> Vec<f64> {
        Self::scores(cx, endpoints).collect()
    }

    fn add_weighted(&self, cx: &Cycle<'_>, endpoints: &[usize], weight: f64, totals: &mut [f64]) {
        weigh(totals, weight, Self::scores(cx, endpoints));
    }
}

impl KvCache {
    /// The score of each entry of `endpoints`, in order.
    fn scores<'a>(cx: &'a Cycle<'_>, endpoints: &'a [usize]) -> impl Iterator<Item = f64> + 'a {
        endpoints
            .iter()
            .map(|&i| cx.candidate(i).map_or(0.0, |c| 1.0 - c.metrics.kv_usage))
    }

    /// Builds the scorer from its `parameters` (it takes none).
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        Params::new(Some(v), path, &[])?;
        Ok(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn prefers_free_kv_cache() {
        let c = candidates(&[(0, 0, 0.0), (0, 0, 0.25), (0, 0, 1.0)]);
        let s = with_cycle(&c, &[], |cx| KvCache.score(cx, &all(&c)));
        assert_eq!(s, vec![1.0, 0.75, 0.0]);
    }
}
