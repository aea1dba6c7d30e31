//! Model-server counters read from vLLM's `/metrics` (as `vllm-sim` exposes them)
//! before and after a run, so prefix-cache hit rates and request counts are "as the
//! servers report them".

use serde_json::{json, Value};

/// The counters of one server at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counters {
    /// `vllm:prefix_cache_queries_total` (prompt tokens looked up).
    pub prefix_queries: f64,
    /// `vllm:prefix_cache_hits_total` (prompt tokens found cached).
    pub prefix_hits: f64,
    /// `vllm:request_success_total`, all finish reasons.
    pub requests: f64,
    /// `vllm:generation_tokens_total`.
    pub generation_tokens: f64,
    /// `vllm:num_preemptions_total`.
    pub preemptions: f64,
}

/// Sum of every sample of a metric (all label sets). Older vLLM names
/// (`vllm:gpu_prefix_cache_*`) are not read.
pub fn sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            if !(rest.starts_with('{') || rest.starts_with(' ')) {
                return None;
            }
            l.rsplit(' ').next()?.parse::<f64>().ok()
        })
        .sum()
}

impl Counters {
    pub fn parse(text: &str) -> Counters {
        Counters {
            prefix_queries: sum(text, "vllm:prefix_cache_queries_total"),
            prefix_hits: sum(text, "vllm:prefix_cache_hits_total"),
            requests: sum(text, "vllm:request_success_total"),
            generation_tokens: sum(text, "vllm:generation_tokens_total"),
            preemptions: sum(text, "vllm:num_preemptions_total"),
        }
    }

    /// What happened between `before` and `self`.
    pub fn since(&self, before: &Counters) -> Counters {
        Counters {
            prefix_queries: self.prefix_queries - before.prefix_queries,
            prefix_hits: self.prefix_hits - before.prefix_hits,
            requests: self.requests - before.requests,
            generation_tokens: self.generation_tokens - before.generation_tokens,
            preemptions: self.preemptions - before.preemptions,
        }
    }

    /// Hits / queries (`None` without queries).
    pub fn hit_rate(&self) -> Option<f64> {
        (self.prefix_queries > 0.0).then(|| self.prefix_hits / self.prefix_queries)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "prefix_cache_queries": self.prefix_queries,
            "prefix_cache_hits": self.prefix_hits,
            "prefix_cache_hit_rate": self.hit_rate(),
            "requests": self.requests,
            "generation_tokens": self.generation_tokens,
            "preemptions": self.preemptions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{model_name=\"sim-model\"} 1000
vllm:prefix_cache_hits_total{model_name=\"sim-model\"} 750
vllm:prefix_cache_hits_total_other 9
vllm:request_success_total{finished_reason=\"length\",model_name=\"sim-model\"} 10
vllm:request_success_total{finished_reason=\"stop\",model_name=\"sim-model\"} 2
vllm:generation_tokens_total 5e2
";

    #[test]
    fn sums_label_sets_and_ignores_longer_names() {
        let c = Counters::parse(TEXT);
        assert_eq!(c.prefix_queries, 1000.0);
        assert_eq!(c.prefix_hits, 750.0);
        assert_eq!(c.requests, 12.0);
        assert_eq!(c.generation_tokens, 500.0);
        assert_eq!(c.preemptions, 0.0);
        assert_eq!(c.hit_rate(), Some(0.75));
    }

    #[test]
    fn deltas() {
        let after = Counters::parse(TEXT);
        let before = Counters {
            prefix_queries: 200.0,
            prefix_hits: 50.0,
            ..Counters::default()
        };
        let d = after.since(&before);
        assert_eq!(d.prefix_queries, 800.0);
        assert_eq!(d.hit_rate(), Some(700.0 / 800.0));
        assert_eq!(Counters::default().hit_rate(), None);
    }
}
