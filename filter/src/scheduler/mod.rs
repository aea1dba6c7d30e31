//! The scheduler: profile handler → (per profile) filters → weighted scorers → picker.
//!
//! Everything here is host-independent: candidates, metrics, in-flight counts and the
//! prefix index are passed in, randomness comes from a seeded [`Rng`], time from the
//! caller. [`Scheduler::schedule`] decides; it changes nothing. The caller applies the
//! decision (destination header, in-flight counts, prefix index, [`Scheduler::pre_request`]).
//!
//! Scores follow the reference: each scorer's value is clamped to [0, 1] and multiplied
//! by its weight, and an endpoint's total is the plain weighted sum.

pub mod filters;
pub mod handlers;
pub mod pickers;
pub mod profile;
pub mod scorers;
pub mod session;

use crate::latency::{self, Estimate, Prediction, Slo};
use crate::prefix::hash::hash_prompt;
use crate::prefix::index::{PrefixIndex, PrefixMatch};
use crate::prefix::precise::PromptKeys;
use crate::prefix::rendezvous;
use crate::prefix::{PrefixConfig, CHARS_PER_TOKEN};
use crate::rng::Rng;

pub use crate::endpoint::{Candidate, Metrics};
pub use handlers::Handler;
pub use profile::Profile;

/// What the scheduler knows of a request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Request<'a> {
    /// The model the request is sent as (after rewrite).
    pub model: &'a str,
    /// The prompt text (completions) or flattened messages (chat).
    pub prompt: &'a str,
    /// The optional `cache_salt` of the body.
    pub cache_salt: Option<&'a str>,
    /// Body size in bytes.
    pub body_bytes: usize,
    /// `x-session-token`, for session affinity.
    pub session_token: Option<&'a str>,
    /// Now, in ms (for staleness checks).
    pub now_ms: i64,
    /// The TTFT/TPOT objectives (SLO headers).
    pub slo: Slo,
    /// The objective's priority (negative: sheddable).
    pub priority: i32,
    /// `x-prediction-based-scheduling` (true) / `-off` (false), when sent.
    pub prediction_based: Option<bool>,
    /// The predictor's state and the SLO requests running (with a latency producer).
    pub latency: Option<&'a latency::View>,
    /// The endpoint an earlier stage of this request chose (P/D: the decode pick, while
    /// the prefill profile runs), for the topology plugins; `None` otherwise.
    pub peer: Option<usize>,
    /// Whether the body carries multimodal parts (`image_url`, `video_url`,
    /// `input_audio`), for `always-disagg-multimodal-decider`.
    pub multimodal: bool,
    /// A chat request the filter could not render as the servers' chat template does
    /// (`precise-prefix-cache-scorer` with `tokenizer: relay`): precise matching falls
    /// back to the approximate index for it.
    pub unrendered_chat: bool,
}

impl Request<'_> {
    /// Estimated input tokens: `max(body bytes / 4, 1)`, else prompt chars / 4.
    pub fn input_tokens(&self) -> u64 {
        if self.body_bytes > 0 {
            (self.body_bytes as u64 / CHARS_PER_TOKEN).max(1)
        } else {
            ((self.prompt.chars().count() as u64 + CHARS_PER_TOKEN / 2) / CHARS_PER_TOKEN).max(1)
        }
    }

    /// Estimated tokens of the request: input + round(1.5 × input), as the reference.
    pub fn token_estimate(&self) -> u64 {
        let input = self.input_tokens();
        input + (input * 3).div_ceil(2)
    }
}

/// One scheduling cycle, as the plugins see it.
pub struct Cycle<'a> {
    /// The request.
    pub request: &'a Request<'a>,
    /// Every candidate; plugins receive indices into this slice.
    pub candidates: &'a [Candidate],
    /// Prefix match per candidate (same order) in the learned index; empty when no prefix
    /// plugin is configured.
    pub prefix: &'a [PrefixMatch],
    /// The rendezvous prior: candidates whose prefix affinity reads as this many blocks
    /// (`crate::prefix::rendezvous::promote`: the owners of a prompt this gateway has not
    /// routed anywhere, or the new and old owners of a group the load weights moved);
    /// empty when it does not apply.
    pub prior: &'a [(usize, u32)],
    /// The key the rendezvous order of this prompt's endpoints is drawn from (the chained
    /// hash of its leading blocks: `crate::prefix::rendezvous::key`), whether or not this
    /// gateway has seen it; `None` without the prior or without blocks.
    pub rendezvous_key: Option<u64>,
    /// Features and predictions per candidate (same order); empty without a latency
    /// producer.
    pub estimates: &'a [Estimate],
}

impl Cycle<'_> {
    /// The candidate at `i`.
    pub fn candidate(&self, i: usize) -> Option<&Candidate> {
        self.candidates.get(i)
    }

    /// The prefix match of candidate `i` in the learned index (zero when unknown): what
    /// decisions about cached tokens read (P/D, latency).
    pub fn prefix_match(&self, i: usize) -> PrefixMatch {
        self.prefix.get(i).copied().unwrap_or_default()
    }

    /// The prefix match of candidate `i` with the rendezvous prior (which sets the
    /// matched blocks of the candidates it names): what the prefix scorer and the
    /// affinity filter read.
    pub fn prefix_affinity(&self, i: usize) -> PrefixMatch {
        let mut m = self.prefix_match(i);
        if let Some(&(_, blocks)) = self.prior.iter().find(|(c, _)| *c == i) {
            m.matched = blocks.min(m.total);
        }
        m
    }

    /// The latency prediction for candidate `i`, once the predictor is ready.
    pub fn prediction(&self, i: usize) -> Option<&Prediction> {
        self.estimates.get(i).and_then(|e| e.prediction.as_ref())
    }
}

/// Narrows the candidates.
pub trait Filter {
    /// The endpoints kept, a subset of `endpoints` (indices into `cx.candidates`).
    fn filter(&self, cx: &Cycle<'_>, endpoints: Vec<usize>, rng: &mut Rng) -> Vec<usize>;
}

/// Scores the candidates, 0..1 each (values outside are clamped).
pub trait Scorer {
    /// One score per entry of `endpoints`.
    fn score(&self, cx: &Cycle<'_>, endpoints: &[usize]) -> Vec<f64>;
    /// Adds `weight` × each entry's score, clamped, to `totals` (same order as
    /// `endpoints`; [`scorers::weigh`]). The default calls [`Scorer::score`]; a scorer
    /// on a hot path scores in the same pass instead, with no vector of its own.
    fn add_weighted(&self, cx: &Cycle<'_>, endpoints: &[usize], weight: f64, totals: &mut [f64]) {
        scorers::weigh(totals, weight, self.score(cx, endpoints));
    }
    /// Called after a decision is applied (state for later picks).
    fn pre_request(&self, _cx: &Cycle<'_>, _decision: &Decision) {}
}

/// Chooses among scored candidates.
pub trait Picker {
    /// The chosen endpoints, best first (`(index, total score)` pairs in, indices out).
    fn pick(&self, scored: Vec<(usize, f64)>, rng: &mut Rng) -> Vec<usize>;

    /// Like [`Picker::pick`], from a profile's columns: `endpoints` (indices into
    /// `cx.candidates`) with their total `scores` (same order). A picker may read the
    /// candidates (e.g. their requests in flight, to break ties). The default pairs them
    /// and calls [`Picker::pick`]; a picker on a hot path reads the columns in place.
    fn pick_among(
        &self,
        _cx: &Cycle<'_>,
        endpoints: &[usize],
        scores: &[f64],
        rng: &mut Rng,
    ) -> Vec<usize> {
        self.pick(
            endpoints
                .iter()
                .copied()
                .zip(scores.iter().copied())
                .collect(),
            rng,
        )
    }
}

/// Where time went, for `inference_extension_plugin_duration_seconds`.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginSample {
    /// `ProfilePicker`, `Filter`, `Scorer`, `Picker` or `ProcessProfilesResults`.
    pub extension_point: &'static str,
    /// The plugin's type.
    pub plugin_type: String,
    /// The plugin's name.
    pub plugin_name: String,
    /// Nanoseconds.
    pub ns: u64,
}

/// The extension point under which a [`Probe`] times the latency predictor (the
/// reference runs its `predicted-latency-producer` as a `PrepareData` plugin).
pub const PREDICTION_POINT: &str = "PrepareData";

/// Measures plugins when a clock is given. Consecutive measurements share their boundary
/// (the end of one plugin is the start of the next), so `n` plugins cost `n + 1` clock
/// reads; the little work between two plugins counts towards the second.
pub struct Probe<'a> {
    clock: Option<&'a dyn Fn() -> u64>,
    last: Option<u64>,
    /// The samples taken.
    pub samples: Vec<PluginSample>,
}

impl<'a> Probe<'a> {
    /// A probe reading `clock` (ns), or none.
    pub fn new(clock: Option<&'a dyn Fn() -> u64>) -> Self {
        Self {
            clock,
            last: None,
            samples: Vec::new(),
        }
    }

    /// The start of a measurement: the end of the previous one, or now (0 without a clock).
    pub fn now(&mut self) -> u64 {
        match self.last.take() {
            Some(t) => t,
            None => self.clock.map_or(0, |c| c()),
        }
    }

    /// Records the time since `start`.
    pub fn record(&mut self, point: &'static str, plugin_type: &str, name: &str, start: u64) {
        if let Some(clock) = self.clock {
            let end = clock();
            self.last = Some(end);
            self.samples.push(PluginSample {
                extension_point: point,
                plugin_type: plugin_type.to_string(),
                plugin_name: name.to_string(),
                ns: end.saturating_sub(start),
            });
        }
    }

    /// Forgets the last boundary (call when unmeasured work follows).
    pub fn pause(&mut self) {
        self.last = None;
    }
}

/// The outcome of one profile.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileResult {
    /// The profile's name.
    pub profile: String,
    /// Chosen candidates (indices), best first.
    pub targets: Vec<usize>,
}

/// The scheduling decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The primary profile's name.
    pub profile: String,
    /// Candidate indices for `x-gateway-destination-endpoint`: primary, then fallbacks.
    pub targets: Vec<usize>,
    /// Candidate index of the prefill endpoint (P/D), for `x-prefiller-host-port`.
    pub prefill: Option<usize>,
    /// The request's block hashes (for the prefix index).
    pub hashes: Vec<u64>,
    /// Prefix match per candidate (empty without a prefix plugin).
    pub prefix: Vec<PrefixMatch>,
    /// The rendezvous prior: candidates whose prefix affinity read as this many blocks
    /// (`crate::prefix::rendezvous::promote`; empty when it did not apply).
    pub prior: Vec<(usize, u32)>,
    /// Block size in tokens used for the hashes.
    pub block_size_tokens: u32,
    /// Whether P/D disaggregation was decided.
    pub disaggregated: bool,
    /// The encode endpoints (E/P/D), when the encode stage ran.
    pub encoders: Vec<usize>,
    /// Features and predictions per candidate (empty without a latency producer).
    pub estimates: Vec<Estimate>,
    /// The prompt's block keys as the relay keys them (for speculative entries; empty
    /// without `precise-prefix-cache-scorer`).
    pub precise_keys: PromptKeys,
}

impl Decision {
    /// The primary endpoint's index.
    pub fn primary(&self) -> Option<usize> {
        self.targets.first().copied()
    }
}

/// Why no endpoint was chosen.
#[derive(Debug, Clone, PartialEq)]
pub enum ScheduleError {
    /// No candidate endpoints at all.
    NoCandidates,
    /// A profile's filters removed every endpoint.
    NoEndpoints {
        /// The profile that failed.
        profile: String,
    },
    /// `latency-slo-admitter`: a sheddable request no endpoint is predicted to serve
    /// within its objectives.
    SloUnattainable {
        /// The request's objectives.
        slo: Slo,
    },
    /// `probabilistic-admitter`: a sheddable request shed at this saturation.
    Shed {
        /// The candidates' saturation.
        saturation: f64,
    },
}

impl std::fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScheduleError::NoCandidates => write!(f, "no model server endpoint is available"),
            ScheduleError::NoEndpoints { profile } => write!(
                f,
                "no model server endpoint is available (every endpoint was filtered out by profile \"{profile}\")"
            ),
            ScheduleError::Shed { saturation } => write!(
                f,
                "sheddable request dropped: the pool is at saturation {saturation:.2} (probabilistic-admitter)"
            ),
            ScheduleError::SloUnattainable { slo } => {
                let mut parts = Vec::new();
                if let Some(t) = slo.ttft_ms {
                    parts.push(format!("TTFT {t} ms"));
                }
                if let Some(t) = slo.tpot_ms {
                    parts.push(format!("TPOT {t} ms"));
                }
                write!(
                    f,
                    "no model server endpoint is predicted to meet this request's SLO ({}); sheddable request dropped",
                    parts.join(", ")
                )
            }
        }
    }
}

/// What [`Scheduler::prepare`] finds.
#[derive(Debug, Default)]
pub struct Prepared {
    /// The request's block hashes (the approximate index's).
    pub hashes: Vec<u64>,
    /// The prefix match per candidate (precise where the servers report).
    pub matches: Vec<PrefixMatch>,
    /// Block size in tokens of `hashes`.
    pub block_size_tokens: u32,
    /// The rendezvous prior (`crate::prefix::rendezvous`).
    pub prior: Vec<(usize, u32)>,
    /// The prompt's rendezvous key (`crate::prefix::rendezvous::key`).
    pub rendezvous_key: Option<u64>,
    /// The prompt's block keys as the relay keys them (with `precise-prefix-cache-scorer`).
    pub precise_keys: PromptKeys,
}

/// The configured scheduler (built by `crate::runtime::load`).
pub struct Scheduler {
    /// Profiles by name, in configuration order.
    pub profiles: Vec<Profile>,
    /// The profile handler.
    pub handler: Handler,
    /// Prefix parameters, when a plugin needs prefix match information.
    pub prefix: Option<PrefixConfig>,
    /// `precise-prefix-cache-scorer`: prefix matches from the servers' KV events, where
    /// known and fresh, replace the approximate ones.
    pub precise: Option<crate::prefix::precise::PreciseConfig>,
    /// The latency predictor's settings, when a latency producer is configured.
    pub latency: Option<latency::Settings>,
    /// `latency-slo-admitter`: sheddable requests no endpoint can serve are refused.
    pub slo_admitter: bool,
    /// `probabilistic-admitter`: sheddable requests shed with a probability rising with
    /// the candidates' saturation.
    pub probabilistic: Option<crate::flow_control::probabilistic::Probabilistic>,
}

impl Scheduler {
    /// Whether the handler decides on the request's multimodal parts (an encode stage
    /// with `always-disagg-multimodal-decider`): only then is the body scanned for them.
    pub fn reads_multimodal(&self) -> bool {
        matches!(&self.handler, Handler::Disagg(d)
            if matches!(d.encode, Some((_, handlers::pd::Decider::Multimodal)))
                || d.decider == Some(handlers::pd::Decider::Multimodal))
    }

    /// The profile called `name`.
    pub fn profile(&self, name: &str) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// Block size in tokens for this cycle: the first candidate's engine block size with
    /// autoTune, else the configured one.
    pub fn block_size_tokens(&self, candidates: &[Candidate]) -> u64 {
        let Some(p) = &self.prefix else { return 0 };
        let tuned = if p.auto_tune {
            candidates
                .first()
                .and_then(|c| c.metrics.block_size)
                .filter(|b| *b > 0)
        } else {
            None
        };
        tuned.unwrap_or(p.block_size_tokens).max(1)
    }

    /// LRU capacity for `candidate` in the prefix index.
    pub fn lru_capacity(&self, candidate: &Candidate) -> u64 {
        let Some(p) = &self.prefix else { return 0 };
        if p.auto_tune {
            if let Some(n) = candidate.metrics.num_blocks.filter(|n| *n > 0) {
                return n;
            }
        }
        p.lru_capacity_per_server
    }

    /// Hashes the request and matches it against `index` (when a prefix plugin is
    /// configured), and finds the rendezvous prior for it.
    pub fn prepare(
        &self,
        request: &Request<'_>,
        candidates: &[Candidate],
        index: &PrefixIndex,
    ) -> Prepared {
        let Some(p) = &self.prefix else {
            return Prepared::default();
        };
        let block_tokens = self.block_size_tokens(candidates);
        let block_chars = usize::try_from(block_tokens * CHARS_PER_TOKEN).unwrap_or(usize::MAX);
        let max_blocks = usize::try_from(p.max_prefix_blocks).unwrap_or(usize::MAX);
        let hashes = hash_prompt(
            request.model,
            request.cache_salt,
            request.prompt.as_bytes(),
            block_chars,
            max_blocks,
        );
        let bs = u32::try_from(block_tokens).unwrap_or(u32::MAX);
        let addresses = || candidates.iter().map(|c| c.address.as_str());
        let mut matches = index.matches_by_key(&hashes, candidates.iter().map(Candidate::key), bs);
        // Precise matches replace the learned ones where the servers report; a prompt some
        // server reports holding part of is not cold, so the rendezvous prior is off.
        let mut reported_hit = false;
        let mut precise_keys = PromptKeys::new();
        if let Some(precise) = self.precise.as_ref().filter(|_| !request.unrendered_chat) {
            let (reported, keys) = index.precise.matches(
                precise,
                request.model,
                request.prompt,
                addresses(),
                request.now_ms,
            );
            for (m, r) in matches.iter_mut().zip(reported) {
                if let Some(r) = r {
                    reported_hit |= r.matched > 0;
                    *m = r;
                }
            }
            precise_keys = keys;
        }
        let prior_blocks = usize::try_from(p.rendezvous_blocks).unwrap_or(usize::MAX);
        let choices = usize::try_from(p.rendezvous_choices).unwrap_or(1);
        let prior = if reported_hit {
            Vec::new()
        } else {
            // 0: the full weight (`rendezvousPriorLoadWeights: false`).
            let weighted = u16::from(p.rendezvous_load_weights);
            let endpoints = candidates
                .iter()
                .map(|c| (c.address.as_str(), weighted * c.metrics.prior_weight));
            rendezvous::promote(prior_blocks, choices, &hashes, &matches, endpoints)
        };
        let rendezvous_key = rendezvous::key(prior_blocks, &hashes);
        Prepared {
            hashes,
            matches,
            block_size_tokens: bs,
            prior,
            rendezvous_key,
            precise_keys,
        }
    }

    /// Decides where `request` goes. Changes nothing.
    pub fn schedule(
        &self,
        request: &Request<'_>,
        candidates: &[Candidate],
        index: &PrefixIndex,
        rng: &mut Rng,
        probe: &mut Probe<'_>,
    ) -> Result<Decision, ScheduleError> {
        if candidates.is_empty() {
            return Err(ScheduleError::NoCandidates);
        }
        if let Some(admitter) = &self.probabilistic {
            if request.priority < 0 && admitter.sheds(request.priority, candidates, rng.next_f64())
            {
                return Err(ScheduleError::Shed {
                    saturation: admitter.saturation(candidates),
                });
            }
        }
        let Prepared {
            hashes,
            matches: prefix,
            block_size_tokens,
            prior,
            rendezvous_key,
            precise_keys,
        } = self.prepare(request, candidates, index);
        let estimates = match &self.latency {
            Some(settings) => {
                let start = probe.now();
                let estimates = latency::estimate(
                    settings,
                    request.latency,
                    request.input_tokens(),
                    request.slo,
                    candidates,
                    &prefix,
                );
                probe.record(
                    PREDICTION_POINT,
                    latency::producer::TYPE,
                    latency::producer::TYPE,
                    start,
                );
                probe.pause();
                estimates
            }
            None => Vec::new(),
        };
        if self.slo_admitter
            && request.priority < 0
            && request.slo.any()
            && !latency::admits(&estimates, candidates)
        {
            return Err(ScheduleError::SloUnattainable { slo: request.slo });
        }
        let cx = Cycle {
            request,
            candidates,
            prefix: &prefix,
            prior: &prior,
            rendezvous_key,
            estimates: &estimates,
        };
        let outcome = self.handler.run(self, &cx, rng, probe);
        probe.pause();
        let outcome = outcome?;
        Ok(Decision {
            profile: outcome.primary.profile,
            targets: outcome.primary.targets,
            prefill: outcome.prefill,
            hashes,
            prefix,
            prior,
            block_size_tokens,
            disaggregated: outcome.disaggregated,
            encoders: outcome.encoders,
            estimates,
            precise_keys,
        })
    }

    /// Lets stateful plugins learn from an applied decision.
    pub fn pre_request(
        &self,
        request: &Request<'_>,
        candidates: &[Candidate],
        decision: &Decision,
    ) {
        let cx = Cycle {
            request,
            candidates,
            prefix: &decision.prefix,
            prior: &decision.prior,
            // Filters do not run after a decision.
            rendezvous_key: None,
            estimates: &decision.estimates,
        };
        for p in &self.profiles {
            for s in &p.scorers {
                s.plugin.pre_request(&cx, decision);
            }
        }
    }
}

/// Helpers for the plugin tests.
#[cfg(test)]
pub mod testing {
    use super::*;

    /// Candidates `10.0.0.<i+1>:8000` with the given waiting, running and KV usage.
    pub fn candidates(loads: &[(u64, u64, f64)]) -> Vec<Candidate> {
        loads
            .iter()
            .enumerate()
            .map(|(i, (w, r, kv))| Candidate {
                address: format!("10.0.0.{}:8000", i + 1),
                metrics: Metrics {
                    waiting: *w,
                    running: *r,
                    kv_usage: *kv,
                    updated_ms: Some(0),
                    ..Metrics::default()
                },
                ..Candidate::default()
            })
            .collect()
    }

    /// Runs `f` with a cycle over `candidates` and prefix matches `prefix`.
    pub fn with_cycle<R>(
        candidates: &[Candidate],
        prefix: &[PrefixMatch],
        f: impl FnOnce(&Cycle<'_>) -> R,
    ) -> R {
        let request = Request {
            model: "m",
            prompt: "hello",
            ..Request::default()
        };
        let cx = Cycle {
            request: &request,
            candidates,
            prefix,
            prior: &[],
            rendezvous_key: None,
            estimates: &[],
        };
        f(&cx)
    }

    /// A cycle over `candidates` for `request`, with no prefix or latency information.
    pub fn cycle_for<'a>(request: &'a Request<'a>, candidates: &'a [Candidate]) -> Cycle<'a> {
        Cycle {
            request,
            candidates,
            prefix: &[],
            prior: &[],
            rendezvous_key: None,
            estimates: &[],
        }
    }

    /// All indices of `candidates`.
    pub fn all(candidates: &[Candidate]) -> Vec<usize> {
        (0..candidates.len()).collect()
    }
}

#[cfg(test)]
mod slo_tests;
#[cfg(test)]
mod tests;
