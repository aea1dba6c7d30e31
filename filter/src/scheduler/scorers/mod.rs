//! Scorers: each returns a value in [0, 1] per endpoint (higher is better).
//!
//! | type | file | formula |
//! |---|---|---|
//! | `kv-cache-utilization-scorer` | [`kv_cache`] | `1 − kv_usage` |
//! | `queue-scorer` (`queue-depth-scorer`) | [`queue`] | `(maxQ − q)/(maxQ − minQ)`, all equal → 1 |
//! | `running-requests-size-scorer` | [`running_requests`] | same min-max on running requests |
//! | `load-aware-scorer` | [`load_aware`] | `0.5 × (1 − min(q, T)/T)`, empty queue 0.5 |
//! | `active-request-scorer` | [`active_request`] | in flight ≤ idle → 1, else `(max − n)/max × maxBusyScore` |
//! | `token-load-scorer` | [`token_load`] | `1 − min(load, T)/T`, load ≤ 0 → 1 |
//! | `lora-affinity-scorer` | [`lora_affinity`] | 1 / 0.8 / 0.6 / 0 |
//! | `prefix-cache-scorer` | [`prefix_cache`] | `matchedBlocks / totalBlocks` |
//! | `precise-prefix-cache-scorer` | [`precise_prefix_cache`] | same, blocks the servers report (KV events via `kv-relay`), approximate for stale servers |
//! | `session-affinity-scorer` | [`session_affinity`] | 1 for the session's endpoint, else 0 |
//! | `topology-affinity-scorer` | [`topology_affinity`] | P/D prefill: host 1, rack 0.2, zone 0.05, region 0.02 from the decode pick |
//! | `no-hit-lru-scorer` | [`no_hit_lru`] | cold requests spread to never/least recently used |
//! | `latency-scorer` (`slo-scorer`) | [`latency`] | predicted headroom tiers; composite before the predictor is ready |

pub mod active_request;
pub mod kv_cache;
pub mod latency;
pub mod load_aware;
pub mod lora_affinity;
pub mod no_hit_lru;
pub mod precise_prefix_cache;
pub mod prefix_cache;
pub mod queue;
pub mod running_requests;
pub mod session_affinity;
pub mod token_load;
pub mod topology_affinity;

/// Adds `weight` × each of `values`, clamped to [0, 1] (NaN as 0), to `totals` in order:
/// how a profile sums its scorers.
pub fn weigh(totals: &mut [f64], weight: f64, values: impl IntoIterator<Item = f64>) {
    for (t, v) in totals.iter_mut().zip(values) {
        // What `is_nan` and `clamp` give, in two comparisons.
        let v = if v >= 1.0 {
            1.0
        } else if v > 0.0 {
            v
        } else {
            0.0
        };
        *t += v * weight;
    }
}

/// Min-max normalisation where lower is better: `(max − v)/(max − min)`; all equal → 1.
pub fn lower_is_better(values: &[f64]) -> Vec<f64> {
    lower_is_better_each(values.iter().copied()).collect()
}

/// [`lower_is_better`] over values read twice from `values` (once for the bounds, once
/// for the scores) instead of a vector.
pub fn lower_is_better_each(
    values: impl Iterator<Item = f64> + Clone,
) -> impl Iterator<Item = f64> {
    // Comparisons rather than `f64::min`/`max`, which wasm32 calls out of line; NaN is
    // skipped alike.
    let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.clone() {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    // Empty, or all equal: every score is 1.
    let spread = max > min;
    values.map(move |v| if spread { (max - v) / (max - min) } else { 1.0 })
}
