//! The latency model: how long one engine step takes.
//!
//! vLLM runs in steps. In each step it computes the KV of some prompt tokens
//! (prefill, possibly chunked) and decodes one token for every running sequence
//! that has finished its prefill. The duration of a step is:
//!
//! ```text
//! prefill = prefill_overhead + prefill_per_token × prefill_tokens      (if any prefill tokens)
//! decode  = inter_token_latency × (1 + batch_slowdown × (seqs − 1))
//!                               × (1 + kv_slowdown × kv_usage)         (if any sequence decodes)
//! step    = (prefill + decode) × jitter,  jitter ~ Normal(1, jitter_std) clamped to [0.3, 1.7]
//! ```
//!
//! so a request's TTFT is its queue time plus the step(s) that prefill its
//! uncached tokens, and its inter-token latency is the duration of the decode
//! steps, which grows with the batch size and with KV-cache usage.
//! See the crate README for where each profile figure comes from.

use crate::rng::Rng;
use std::time::Duration;

/// A named set of latency parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct LatencyProfile {
    pub name: String,
    /// Fixed cost of a step that prefills anything.
    pub prefill_overhead: Duration,
    /// Cost of each uncached prompt token prefilled.
    pub prefill_per_token: Duration,
    /// Duration of a decode step with one sequence and an empty KV cache.
    pub inter_token_latency: Duration,
    /// Relative growth of a decode step per extra running sequence.
    pub batch_slowdown: f64,
    /// Relative growth of a decode step at 100 % KV-cache usage.
    pub kv_slowdown: f64,
    /// P/D decode side: fixed cost of pulling the prompt's KV from the prefill side.
    pub kv_transfer_overhead: Duration,
    /// P/D decode side: cost per prompt token of the KV transfer.
    pub kv_transfer_per_token: Duration,
    /// Relative standard deviation of each step's duration (0 = none).
    pub jitter: f64,
    /// Multiplies every duration (admin knob to make a server slow at run time).
    pub scale: f64,
}

/// What a step does, as far as its duration is concerned.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepWork {
    /// Prompt tokens computed in this step (uncached only).
    pub prefill_tokens: usize,
    /// Sequences that produce a decode token in this step.
    pub decode_seqs: usize,
    /// Sequences in the batch (prefilling and decoding).
    pub batch_seqs: usize,
    /// KV-cache usage at the start of the step, 0..1.
    pub kv_usage: f64,
}

/// Profile names accepted by [`LatencyProfile::by_name`].
pub const PROFILE_NAMES: &[&str] = &["h100-llama-8b", "zero"];

impl LatencyProfile {
    /// Answers at once: every step takes no time. For overhead benchmarks.
    pub fn zero() -> Self {
        LatencyProfile {
            name: "zero".into(),
            prefill_overhead: Duration::ZERO,
            prefill_per_token: Duration::ZERO,
            inter_token_latency: Duration::ZERO,
            batch_slowdown: 0.0,
            kv_slowdown: 0.0,
            kv_transfer_overhead: Duration::ZERO,
            kv_transfer_per_token: Duration::ZERO,
            jitter: 0.0,
            scale: 1.0,
        }
    }

    /// Llama-3.1-8B (bf16) on one H100: figures of llm-d-inference-sim's
    /// `manifests/latency-profiles/8b-h100-balanced-*` (see README).
    pub fn h100_llama_8b() -> Self {
        LatencyProfile {
            name: "h100-llama-8b".into(),
            prefill_overhead: Duration::from_millis(30),
            prefill_per_token: Duration::from_micros(250),
            inter_token_latency: Duration::from_millis(12),
            // time-factor-under-load 2.0 at max-num-seqs 16: ITL doubles at 16 sequences.
            batch_slowdown: 1.0 / 15.0,
            // Roofline estimate: a full KV cache read costs about as much as the weights.
            kv_slowdown: 1.0,
            kv_transfer_overhead: Duration::from_millis(2),
            kv_transfer_per_token: Duration::from_micros(3),
            // ITL 12 ms ± 2 ms.
            jitter: 0.15,
            scale: 1.0,
        }
    }

    pub fn by_name(name: &str) -> Option<Self> {
        match name {
            "zero" => Some(Self::zero()),
            "h100-llama-8b" | "h100" => Some(Self::h100_llama_8b()),
            _ => None,
        }
    }

    /// The duration of a step, before jitter.
    pub fn mean_step(&self, work: &StepWork) -> Duration {
        let mut secs = 0.0;
        if work.prefill_tokens > 0 {
            secs += self.prefill_overhead.as_secs_f64()
                + self.prefill_per_token.as_secs_f64() * work.prefill_tokens as f64;
        }
        if work.decode_seqs > 0 {
            let extra_seqs = work.batch_seqs.max(1) - 1;
            secs += self.inter_token_latency.as_secs_f64()
                * (1.0 + self.batch_slowdown * extra_seqs as f64)
                * (1.0 + self.kv_slowdown * work.kv_usage.clamp(0.0, 1.0));
        }
        Duration::from_secs_f64((secs * self.scale).max(0.0))
    }

    /// The duration of a step, with seeded jitter.
    pub fn step(&self, work: &StepWork, rng: &mut Rng) -> Duration {
        jittered(self.mean_step(work), self.jitter, rng)
    }

    /// P/D decode side: time to receive the KV of `prompt_tokens` tokens.
    pub fn kv_transfer(&self, prompt_tokens: usize, rng: &mut Rng) -> Duration {
        let secs = self.kv_transfer_overhead.as_secs_f64()
            + self.kv_transfer_per_token.as_secs_f64() * prompt_tokens as f64;
        jittered(Duration::from_secs_f64(secs * self.scale), self.jitter, rng)
    }
}

/// `mean × Normal(1, rel_std)` clamped to [0.3, 1.7] × mean, like llm-d-inference-sim.
fn jittered(mean: Duration, rel_std: f64, rng: &mut Rng) -> Duration {
    if mean.is_zero() || rel_std <= 0.0 {
        return mean;
    }
    let factor = rng.normal(1.0, rel_std).clamp(0.3, 1.7);
    mean.mul_f64(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(prefill_tokens: usize, decode_seqs: usize, kv_usage: f64) -> StepWork {
        StepWork {
            prefill_tokens,
            decode_seqs,
            batch_seqs: decode_seqs.max(1),
            kv_usage,
        }
    }

    #[test]
    fn h100_profile_matches_its_published_figures() {
        let p = LatencyProfile::h100_llama_8b();
        // Prefill of 1000 uncached tokens alone: 30 ms + 1000 × 250 µs.
        assert_eq!(p.mean_step(&work(1000, 0, 0.0)), Duration::from_millis(280));
        // One sequence decoding with an empty cache: 12 ms.
        assert_eq!(p.mean_step(&work(0, 1, 0.0)), Duration::from_millis(12));
        // 16 sequences: doubled.
        let d16 = p.mean_step(&work(0, 16, 0.0)).as_secs_f64();
        assert!((d16 - 0.024).abs() < 1e-9);
        // KV usage slows decoding.
        assert!(p.mean_step(&work(0, 1, 0.8)) > p.mean_step(&work(0, 1, 0.1)));
    }

    #[test]
    fn zero_profile_takes_no_time_and_jitter_stays_in_bounds() {
        let mut rng = Rng::new(1);
        assert_eq!(
            LatencyProfile::zero().step(&work(5000, 64, 1.0), &mut rng),
            Duration::ZERO
        );
        let p = LatencyProfile::h100_llama_8b();
        for _ in 0..1000 {
            let d = p.step(&work(0, 1, 0.0), &mut rng).as_secs_f64();
            assert!((0.012 * 0.3 - 1e-9..=0.012 * 1.7 + 1e-9).contains(&d));
        }
    }

    #[test]
    fn scale_multiplies_durations() {
        let mut p = LatencyProfile::h100_llama_8b();
        p.scale = 10.0;
        assert_eq!(p.mean_step(&work(0, 1, 0.0)), Duration::from_millis(120));
    }
}
