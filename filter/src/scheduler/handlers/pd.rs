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
//! Deliberate difference from the reference: when disaggregation is decided but
//! the prefill profile finds no endpoint, the request still runs decode-only, but the
//! outcome says so (`disaggregated` true, `prefill` none) and the proxy logs it.

use super::{Outcome, Scheduler};
use crate::config::validate::{as_str, err};
use crate::config::{ConfigError, Params};
use crate::rng::Rng;
use crate::scheduler::{Cycle, Probe, ScheduleError};
use serde_json::Value;

/// The handler's type name in `EndpointPickerConfig`.
pub const TYPE: &str = "disagg-profile-handler";
/// The prefix-based decider's type name.
pub const PREFIX_BASED_DECIDER: &str = "prefix-based-pd-decider";
/// The always-disaggregate decider's type name.
pub const ALWAYS_DECIDER: &str = "always-disagg-pd-decider";
/// The encode-stage decider's type name (E/P/D): encode when the request has
/// multimodal parts.
pub const MULTIMODAL_DECIDER: &str = "always-disagg-multimodal-decider";
/// The handler's parameters.
pub const PARAMETERS: &[&str] = &["profiles", "deciders", "stageOrder"];

/// Role label key of P/D endpoints.
pub const ROLE_LABEL: &str = "llm-d.ai/role";

/// Whether to run the prefill stage.
#[derive(Debug, Clone, PartialEq)]
pub enum Decider {
    /// `always-disagg-pd-decider`.
    Always,
    /// `always-disagg-multimodal-decider`: the request has multimodal parts.
    Multimodal,
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
        self.decide_for(false, prompt_tokens, cached)
    }

    /// [`Decider::decide`] for a request that has (`multimodal`) multimodal parts or not.
    pub fn decide_for(
        &self,
        multimodal: bool,
        prompt_tokens: u64,
        cached: Option<(u64, u64)>,
    ) -> bool {
        match self {
            Decider::Always => true,
            Decider::Multimodal => multimodal,
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
    /// The prefill decider; `None`: no prefill stage (`deciders` given without `prefill`).
    pub decider: Option<Decider>,
    /// The encode stage: its profile and decider (`deciders.encode`).
    pub encode: Option<(String, Decider)>,
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
        let multimodal = cx.request.multimodal;
        let tokens = cx.request.input_tokens();
        let disaggregated = self
            .decider
            .as_ref()
            .is_some_and(|d| d.decide_for(multimodal, tokens, cached));
        let encoding = self
            .encode
            .as_ref()
            .filter(|(_, d)| d.decide_for(multimodal, tokens, cached));
        probe.record("ProfilePicker", "disagg-profile-handler", "decider", start);
        // Later stages see the decode pick as the request's peer (topology plugins).
        let staged = super::super::Request {
            peer: primary.targets.first().copied(),
            ..*cx.request
        };
        let scx = Cycle {
            request: &staged,
            candidates: cx.candidates,
            prefix: cx.prefix,
            prior: cx.prior,
            rendezvous_key: cx.rendezvous_key,
            estimates: cx.estimates,
        };
        let mut encoders = Vec::new();
        if let Some((name, _)) = encoding {
            if let Some(p) = scheduler.profile(name) {
                encoders = p
                    .run(&scx, rng, probe)
                    .map(|r| r.targets)
                    .unwrap_or_default();
            }
        }
        let mut prefill = None;
        if disaggregated {
            if let Some(p) = scheduler.profile(&self.prefill) {
                prefill = p
                    .run(&scx, rng, probe)
                    .ok()
                    .and_then(|r| r.targets.first().copied());
            }
        }
        Ok(Outcome {
            primary,
            prefill,
            disaggregated,
            encoders,
        })
    }
}

impl Decider {
    /// `prefix-based-pd-decider` from its `parameters`: `nonCachedTokens`, `promptTokens`.
    pub fn prefix_based(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(Some(v), path, &["nonCachedTokens", "promptTokens"])?;
        let nc = p.i64("nonCachedTokens", 0)?;
        let pt = p.i64("promptTokens", 0)?;
        if nc < 0 || pt < 0 {
            let f = if nc < 0 {
                "nonCachedTokens"
            } else {
                "promptTokens"
            };
            return Err(err(&p.path(f), "must not be negative"));
        }
        Ok(Decider::PrefixBased {
            non_cached_tokens: nc.unsigned_abs(),
            prompt_tokens: pt.unsigned_abs(),
        })
    }

    /// `always-disagg-pd-decider` from its `parameters` (it takes none).
    pub fn always(v: &Value, path: &str) -> Result<Self, ConfigError> {
        Params::new(Some(v), path, &[])?;
        Ok(Decider::Always)
    }

    /// `always-disagg-multimodal-decider` from its `parameters` (it takes none).
    pub fn multimodal(v: &Value, path: &str) -> Result<Self, ConfigError> {
        Params::new(Some(v), path, &[])?;
        Ok(Decider::Multimodal)
    }
}

impl Disagg {
    /// Builds the handler from its `parameters` (`path`): `profiles` (`decode`, `prefill`,
    /// `encode` profile names), `deciders` (`prefill`, `encode`: declared deciders, looked
    /// up with `decider`) and `stageOrder` (only `decode-first`). With `deciders` given, a
    /// stage runs only if its decider is named (llm-d-router); without `deciders`, the
    /// prefill stage runs for every request (the v1 handler's default). Every profile a
    /// stage needs must exist among `profiles`.
    pub fn from_parameters(
        v: &Value,
        path: &str,
        profiles: &[&str],
        decider: impl Fn(&str) -> Option<Decider>,
    ) -> Result<Self, ConfigError> {
        let params = Params::new(Some(v), path, PARAMETERS)?;
        params.only("stageOrder", "decode-first")?;
        let names = params
            .get("profiles")
            .map(|v| {
                Params::new(
                    Some(v),
                    &params.path("profiles"),
                    &["decode", "prefill", "encode"],
                )
            })
            .transpose()?;
        let name_of = |stage: &str| -> Result<String, ConfigError> {
            match &names {
                Some(pp) => pp.string(stage, stage),
                None => Ok(stage.to_string()),
            }
        };
        let require = |stage: &str, name: &str| -> Result<(), ConfigError> {
            if profiles.contains(&name) {
                return Ok(());
            }
            Err(match names.as_ref().filter(|pp| pp.get(stage).is_some()) {
                Some(pp) => err(
                    &pp.path(stage),
                    format!("no scheduling profile is named \"{name}\""),
                ),
                None => err(
                    path,
                    format!("disagg-profile-handler needs a scheduling profile named \"{name}\" (or set profiles.{stage})"),
                ),
            })
        };
        let decode = name_of("decode")?;
        let prefill = name_of("prefill")?;
        let encode_profile = name_of("encode")?;
        require("decode", &decode)?;
        let (prefill_decider, encode_decider) = match params.get("deciders") {
            None => (Some(Decider::Always), None),
            Some(v) => {
                let dp = Params::new(Some(v), &params.path("deciders"), &["prefill", "encode"])?;
                let named = |stage: &str| -> Result<Option<Decider>, ConfigError> {
                    let Some(r) = dp.get(stage) else {
                        return Ok(None);
                    };
                    let rp = dp.path(stage);
                    let name = as_str(r, &rp)?;
                    decider(name).map(Some).ok_or_else(|| {
                        err(&rp, format!("\"{name}\" is not a declared decider plugin"))
                    })
                };
                (named("prefill")?, named("encode")?)
            }
        };
        if prefill_decider.is_some() {
            require("prefill", &prefill)?;
        }
        if encode_decider.is_some() {
            require("encode", &encode_profile)?;
        }
        Ok(Self {
            decode,
            prefill,
            decider: prefill_decider,
            encode: encode_decider.map(|d| (encode_profile, d)),
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
