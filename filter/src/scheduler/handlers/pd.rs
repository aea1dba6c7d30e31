//! `disagg-profile-handler` (router, decode-first order) and its prefill deciders.
//!
//! Decode runs first and is the primary profile: the request is routed to the decode
//! endpoint. A decode failure fails the request. Then the decider says whether to
//! disaggregate; if so the prefill profile runs and its endpoint goes in
//! `x-prefiller-host-port`.
//!
//! `prefix-based-pd-decider`: disaggregate iff the prompt passes the `promptTokens` gate
//! (0 = off) and `promptTokens − cachedBlocks × blockSizeTokens ≥ nonCachedTokens`
//! (`nonCachedTokens` 0 = never), using the chosen decode endpoint's prefix match; no
//! match information means no disaggregation. `always-disagg-pd-decider`: always.
//!
//! Deliberate difference from the reference (§15 #24): when disaggregation is decided but
//! the prefill profile finds no endpoint, the request still runs decode-only, but the
//! outcome says so (`disaggregated` true, `prefill` none) and the proxy logs it.

use super::{Outcome, Scheduler};
use crate::rng::Rng;
use crate::scheduler::{Cycle, Probe, ScheduleError};

/// Role label key of P/D endpoints.
pub const ROLE_LABEL: &str = "llm-d.ai/role";

/// Whether to run the prefill stage.
#[derive(Debug, Clone, PartialEq)]
pub enum Decider {
    /// `always-disagg-pd-decider`.
    Always,
    /// `prefix-based-pd-decider`.
    PrefixBased {
        /// Uncached prompt tokens that justify a remote prefill (0 = never).
        non_cached_tokens: u64,
        /// Minimum prompt tokens (0 = no minimum).
        prompt_tokens: u64,
    },
}

impl Decider {
    /// The decision for a request of `prompt_tokens` whose decode endpoint has
    /// `cached_blocks` blocks of `block_size_tokens` cached (`None`: no match information).
    pub fn decide(&self, prompt_tokens: u64, cached: Option<(u64, u64)>) -> bool {
        match self {
            Decider::Always => true,
            Decider::PrefixBased {
                non_cached_tokens,
                prompt_tokens: gate,
            } => {
                let Some((blocks, block_size)) = cached else {
                    return false;
                };
                if *non_cached_tokens == 0 || (*gate > 0 && prompt_tokens < *gate) {
                    return false;
                }
                let uncached = prompt_tokens.saturating_sub(blocks.saturating_mul(block_size));
                uncached >= *non_cached_tokens
            }
        }
    }
}

/// The disaggregation handler.
#[derive(Debug, Clone, PartialEq)]
pub struct Disagg {
    /// Decode profile name.
    pub decode: String,
    /// Prefill profile name.
    pub prefill: String,
    /// The prefill decider.
    pub decider: Decider,
}

impl Disagg {
    /// Runs decode, then prefill if the decider approves.
    pub fn run(
        &self,
        scheduler: &Scheduler,
        cx: &Cycle<'_>,
        rng: &mut Rng,
        probe: &mut Probe<'_>,
    ) -> Result<Outcome, ScheduleError> {
        let decode = scheduler
            .profile(&self.decode)
            .ok_or(ScheduleError::NoCandidates)?;
        let primary = decode.run(cx, rng, probe)?;
        let start = probe.now();
        let cached = primary.targets.first().and_then(|&i| {
            if cx.prefix.is_empty() {
                return None;
            }
            let m = cx.prefix_match(i);
            Some((u64::from(m.matched), u64::from(m.block_size_tokens)))
        });
        let disaggregated = self.decider.decide(cx.request.input_tokens(), cached);
        probe.record("ProfilePicker", "disagg-profile-handler", "decider", start);
        let mut prefill = None;
        if disaggregated {
            if let Some(p) = scheduler.profile(&self.prefill) {
                prefill = p
                    .run(cx, rng, probe)
                    .ok()
                    .and_then(|r| r.targets.first().copied());
            }
        }
        Ok(Outcome {
            primary,
            prefill,
            disaggregated,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn prefix_based_decider_uses_the_uncached_prompt_length() {
        let d = Decider::PrefixBased {
            non_cached_tokens: 512,
            prompt_tokens: 1024,
        };
        // 2000 tokens, 10 blocks of 16 cached: 1840 uncached >= 512.
        assert!(d.decide(2000, Some((10, 16))));
        // 2000 tokens, 100 blocks of 16 cached: 400 uncached < 512.
        assert!(!d.decide(2000, Some((100, 16))));
        // Under the prompt gate.
        assert!(!d.decide(1000, Some((0, 16))));
        // No match information: no disaggregation.
        assert!(!d.decide(5000, None));
        let never = Decider::PrefixBased {
            non_cached_tokens: 0,
            prompt_tokens: 0,
        };
        assert!(!never.decide(1_000_000, Some((0, 16))));
        assert!(Decider::Always.decide(1, None));
    }
}
