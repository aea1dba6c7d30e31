//! Continuous batching: the per-request state and the scheduler step.
//!
//! Each step, like vLLM v1's scheduler:
//! 1. running sequences are served first, in admission order: each computes
//!    its remaining tokens (one for a decoding sequence, a chunk of the prompt
//!    for a prefilling one) within the step's token budget and at most
//!    `long_prefill_token_threshold` of them (when set); a sequence that
//!    needs a new KV block when none is free preempts a victim chosen by the
//!    scheduling policy ([`super::policy`]: the most recently admitted, or the
//!    least important) in recompute mode: the victim frees its blocks, goes back
//!    to the waiting queue and later re-prefills prompt + output so far (a victim
//!    already scheduled in this step gives its tokens back; when the sequence is
//!    its own victim the ones after it still run in this step, where vLLM would
//!    leave them to its next step);
//! 2. then, unless the step preempted, waiting sequences are admitted in queue
//!    order (arrival, or priority then arrival) while the batch has room, the
//!    budget lasts and their blocks fit, each computing its uncached tokens within
//!    the budget and the same threshold (a request whose LoRA cannot join the
//!    batch is skipped; one whose blocks do not fit blocks the queue);
//! 3. the step's duration follows from its work ([`super::latency`]); every
//!    sequence whose computed tokens reach its length samples one token at the
//!    end of the step.

use super::kv_cache::KvCache;
use super::latency::StepWork;
use super::policy::{OrderKey, SchedulingPolicy};
use super::request::{
    EngineRequest, Event, EventKind, FinishReason, Finished, KvTransfer, RequestId, Timings, Usage,
};
use super::Engine;
use crate::rng::Rng;
use crate::tokenizer::{output_token_id, VOCABULARY};
use std::collections::BTreeSet;
use std::time::Duration;

/// One engine step: it runs from `started` to `ends_at`, and `events` happen at `ends_at`.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub started: Duration,
    pub ends_at: Duration,
    pub work: StepWork,
    pub events: Vec<Event>,
    /// The KV-cache changes of this step (empty unless events are on:
    /// [`Engine::enable_kv_events`](super::Engine::enable_kv_events)), in order.
    pub kv_events: Vec<super::kv_cache::KvEvent>,
}

/// A request inside the engine.
#[derive(Debug)]
pub(crate) struct Seq {
    pub(crate) id: RequestId,
    pub(crate) lora: Option<String>,
    /// The body's `priority` (lower first under `--scheduling-policy priority`).
    priority: i64,
    hash_seed: u64,
    /// Prompt, then output token ids.
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Output tokens this request will generate.
    target_len: usize,
    /// Reaching this many output tokens is finish_reason `length`.
    max_len: usize,
    generated: usize,
    /// Tokens whose KV is computed (or received).
    computed: usize,
    /// Tokens to compute before decoding (prompt, plus outputs after a preemption).
    prefill_end: usize,
    /// Hashes of the full blocks of `tokens[..prefill_end]`.
    hashes: Vec<u64>,
    /// Cached blocks pinned by this sequence (a prefix of `hashes`).
    shared: usize,
    /// Other blocks held.
    private: usize,
    cached_tokens: usize,
    kv_transfer: KvTransfer,
    /// P/D decode side: the KV arrives then.
    ready_at: Option<Duration>,
    arrival: Duration,
    scheduled: Option<Duration>,
    first_token: Option<Duration>,
    last_token: Option<Duration>,
    pub(crate) max_tokens_param: Option<u32>,
    text_rng: Rng,
    /// A pooling request: it finishes when its prefill does, without a token.
    pub(crate) pooling: bool,
}

impl Seq {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: RequestId,
        request: EngineRequest,
        target_len: usize,
        max_len: usize,
        hash_seed: u64,
        text_seed: u64,
        arrival: Duration,
        kv: &KvCache,
    ) -> Self {
        let prompt_len = request.prompt.len();
        let hashes = kv.block_hashes(hash_seed, &request.prompt);
        Seq {
            id,
            lora: request.lora,
            priority: request.priority,
            hash_seed,
            tokens: request.prompt,
            prompt_len,
            target_len,
            max_len,
            generated: 0,
            computed: 0,
            prefill_end: prompt_len,
            hashes,
            shared: 0,
            private: 0,
            cached_tokens: 0,
            kv_transfer: request.kv_transfer,
            ready_at: None,
            arrival,
            scheduled: None,
            first_token: None,
            last_token: None,
            max_tokens_param: request.max_tokens,
            text_rng: Rng::new(text_seed),
            pooling: false,
        }
    }

    /// Its place under the `priority` policy: smaller goes first.
    fn order_key(&self) -> OrderKey {
        (self.priority, self.arrival, self.id)
    }

    fn blocks_held(&self) -> usize {
        self.shared + self.private
    }

    fn in_prefill(&self) -> bool {
        self.computed < self.prefill_end
    }

    pub(crate) fn release_blocks(&mut self, kv: &mut KvCache) {
        kv.unpin(&self.hashes[..self.shared]);
        kv.release(self.private);
        self.shared = 0;
        self.private = 0;
    }

    /// Makes the computed full prompt blocks shareable.
    fn promote_blocks(&mut self, kv: &mut KvCache) {
        let computed_blocks =
            (self.computed.min(self.prefill_end) / kv.block_size()).min(self.hashes.len());
        let block_size = kv.block_size();
        while self.shared < computed_blocks && self.private > 0 {
            let i = self.shared;
            let (hashes, tokens, lora) = (&self.hashes, &self.tokens, &self.lora);
            kv.promote(hashes[i], || {
                let parent = i.checked_sub(1).and_then(|p| hashes.get(p)).copied();
                let block = tokens
                    .get(i * block_size..(i + 1) * block_size)
                    .unwrap_or_default()
                    .to_vec();
                (parent, block, lora.clone())
            });
            self.shared += 1;
            self.private -= 1;
        }
    }

    fn timings(&self, finished: Duration) -> Timings {
        Timings {
            arrival: self.arrival,
            scheduled: self.scheduled,
            first_token: self.first_token,
            finished,
        }
    }
}

impl Engine {
    /// When the engine wants its next [`step`](Self::step), or `None` if it
    /// has nothing to do until a request is submitted.
    pub fn next_step_at(&self) -> Option<Duration> {
        let ready_now = |s: &Seq| s.ready_at.is_none_or(|t| t <= self.busy_until);
        let earliest = self.busy_until.max(self.latest);
        if self.running.iter().any(ready_now) || (self.dirty && !self.waiting.is_empty()) {
            return Some(earliest);
        }
        self.running
            .iter()
            .filter_map(|s| s.ready_at)
            .min()
            .map(|t| t.max(earliest))
    }

    /// Runs one step starting at `now`. Returns `None` if the previous step
    /// has not ended yet or there is nothing to schedule.
    pub fn step(&mut self, now: Duration) -> Option<Step> {
        if now < self.busy_until || now < self.latest {
            return None;
        }
        self.latest = now;
        self.dirty = false;
        let mut budget = self.config.max_num_batched_tokens;
        // (index in `running`, tokens computed this step)
        let mut plan: Vec<(usize, usize)> = Vec::new();
        let mut preempted = false;

        // 1. Running sequences.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            if let Some(t) = self.running[i].ready_at {
                if t > now {
                    i += 1;
                    continue;
                }
                self.running[i].ready_at = None;
                self.running[i].computed = self.running[i].prefill_end;
                self.running[i].promote_blocks(&mut self.kv);
            }
            let seq = &self.running[i];
            let n = self.chunk(seq.tokens.len() - seq.computed).min(budget);
            let need = self
                .kv
                .blocks_for(seq.computed + n)
                .saturating_sub(seq.blocks_held());
            let mut scheduled = true;
            while need > 0 && !self.kv.allocate(need) {
                let victim = self.victim();
                self.preempt(victim);
                preempted = true;
                if victim == i {
                    scheduled = false;
                    break;
                }
                if victim < i {
                    // Already served in this step: it gives its tokens back.
                    i -= 1;
                    if let Some(k) = plan.iter().position(|&(j, _)| j == victim) {
                        budget += plan.remove(k).1;
                    }
                    for entry in plan.iter_mut().filter(|e| e.0 > victim) {
                        entry.0 -= 1;
                    }
                }
            }
            if !scheduled {
                // It was its own victim and left `running`; the next one is at `i`.
                continue;
            }
            self.running[i].private += need;
            plan.push((i, n));
            budget -= n;
            i += 1;
        }

        // 2. Waiting sequences.
        if !preempted {
            self.admit(now, &mut budget, &mut plan);
        }
        if plan.is_empty() {
            return None;
        }

        // 3. Duration.
        let mut work = StepWork {
            batch_seqs: plan.len(),
            kv_usage: self.kv.usage(),
            ..Default::default()
        };
        for &(i, n) in &plan {
            if self.running[i].in_prefill() {
                work.prefill_tokens += n;
            } else {
                work.decode_seqs += 1;
            }
        }
        let duration = self.config.latency.step(&work, &mut self.rng);
        let ends_at = now + duration;
        self.busy_until = ends_at;

        // 4. Outcomes at the end of the step.
        let mut events = Vec::with_capacity(plan.len() + 1);
        let mut finished = Vec::new();
        for &(i, n) in &plan {
            let seq = &mut self.running[i];
            let was_prefill = seq.in_prefill();
            seq.computed += n;
            if was_prefill && !seq.in_prefill() {
                seq.promote_blocks(&mut self.kv);
                if seq.generated == 0 {
                    self.metrics.prompt_tokens += seq.prompt_len as u64;
                }
            }
            if seq.computed < seq.tokens.len() {
                continue; // a prefill chunk that did not reach the end
            }
            if seq.pooling {
                // The pooled output exists at the end of the prefill: the request's
                // first (and only) output, timed like a first token, then it finishes.
                seq.first_token = Some(ends_at);
                self.metrics
                    .ttft
                    .observe(ends_at.saturating_sub(seq.arrival).as_secs_f64());
                finished.push(i);
                continue;
            }
            let word = seq.text_rng.range(0, VOCABULARY.len() as u64 - 1) as usize;
            seq.tokens.push(output_token_id(word));
            let index = seq.generated;
            seq.generated += 1;
            self.metrics.generation_tokens += 1;
            match seq.last_token {
                None => {
                    seq.first_token = Some(ends_at);
                    self.metrics
                        .ttft
                        .observe(ends_at.saturating_sub(seq.arrival).as_secs_f64());
                }
                Some(prev) => self
                    .metrics
                    .inter_token_latency
                    .observe(ends_at.saturating_sub(prev).as_secs_f64()),
            }
            seq.last_token = Some(ends_at);
            events.push(Event {
                request: seq.id,
                at: ends_at,
                kind: EventKind::Token {
                    index,
                    text: VOCABULARY[word],
                },
            });
            if seq.generated >= seq.target_len {
                finished.push(i);
            }
        }
        for i in finished.into_iter().rev() {
            let seq = self.running.remove(i);
            events.push(self.finish(seq, ends_at));
        }
        Some(Step {
            started: now,
            ends_at,
            work,
            events,
            kv_events: self.kv.take_events(),
        })
    }

    fn admit(&mut self, now: Duration, budget: &mut usize, plan: &mut Vec<(usize, usize)>) {
        let block_size = self.kv.block_size();
        let mut batch_loras: BTreeSet<String> =
            self.running.iter().filter_map(|s| s.lora.clone()).collect();
        let mut w = 0;
        while w < self.waiting.len() && self.running.len() < self.config.max_num_seqs && *budget > 0
        {
            let seq = &self.waiting[w];
            if let Some(lora) = &seq.lora {
                if !batch_loras.contains(lora) && batch_loras.len() >= self.config.max_loras {
                    w += 1;
                    continue;
                }
            }
            let remote_prefill = seq.kv_transfer == KvTransfer::RemotePrefill && seq.generated == 0;
            // At least the last token is always computed (as in vLLM).
            let hit_blocks = if remote_prefill {
                0
            } else {
                let max_hits = ((seq.prefill_end - 1) / block_size).min(seq.hashes.len());
                self.kv.lookup(&seq.hashes[..max_hits])
            };
            let need = self.kv.blocks_for(seq.prefill_end) - hit_blocks;
            let hits = &seq.hashes[..hit_blocks];
            let unused_hits = hits.len().saturating_sub(self.kv.pinned_among(hits));
            if need + unused_hits > self.kv.available() {
                break; // FIFO: the head waits for space
            }
            let Some(mut seq) = self.waiting.remove(w) else {
                break;
            };
            self.kv.pin(&seq.hashes[..hit_blocks]);
            if !self.kv.allocate(need) {
                // Not expected (checked above); put it back rather than run without blocks.
                self.kv.unpin(&seq.hashes[..hit_blocks]);
                self.waiting.insert(w, seq);
                break;
            }
            seq.shared = hit_blocks;
            seq.private = need;
            seq.computed = hit_blocks * block_size;
            if seq.scheduled.is_none() {
                seq.scheduled = Some(now);
                seq.cached_tokens = seq.computed;
                self.metrics.prefix_cache_queries += seq.prompt_len as u64;
                self.metrics.prefix_cache_hits += seq.cached_tokens as u64;
                self.metrics
                    .queue_time
                    .observe(now.saturating_sub(seq.arrival).as_secs_f64());
            }
            if let Some(lora) = &seq.lora {
                batch_loras.insert(lora.clone());
            }
            if remote_prefill {
                // The KV comes from the prefill side; the first token is a decode step.
                let transfer = self
                    .config
                    .latency
                    .kv_transfer(seq.prompt_len, &mut self.rng);
                seq.prefill_end = seq.prompt_len - 1;
                seq.computed = seq.prefill_end;
                if transfer.is_zero() {
                    // The KV is already there: decode in this very step.
                    seq.promote_blocks(&mut self.kv);
                    *budget -= 1;
                    plan.push((self.running.len(), 1));
                } else {
                    seq.ready_at = Some(now + transfer);
                }
                self.running.push(seq);
                continue;
            }
            let n = self.chunk(seq.prefill_end - seq.computed).min(*budget);
            *budget -= n;
            plan.push((self.running.len(), n));
            self.running.push(seq);
        }
    }

    /// The tokens a sequence with `remaining` tokens to compute may compute in one
    /// step before the step's budget: all of them, or `long_prefill_token_threshold`
    /// when that is set and smaller (vLLM v1 caps running and waiting requests alike).
    fn chunk(&self, remaining: usize) -> usize {
        match self.config.long_prefill_token_threshold {
            0 => remaining,
            threshold => remaining.min(threshold),
        }
    }

    /// Queues a waiting sequence: at the back (`fcfs`), or at its place by
    /// (priority, arrival) (`priority`).
    pub(crate) fn wait(&mut self, seq: Seq) {
        match self.config.scheduling_policy {
            SchedulingPolicy::Fcfs => self.waiting.push_back(seq),
            SchedulingPolicy::Priority => self.wait_in_order(seq),
        }
    }

    fn wait_in_order(&mut self, seq: Seq) {
        let key = seq.order_key();
        let at = self.waiting.partition_point(|s| s.order_key() < key);
        self.waiting.insert(at, seq);
    }

    /// The running sequence to preempt when a block is missing: the most recently
    /// admitted (`fcfs`), or the one with the highest (priority, arrival)
    /// (`priority`). Only called with a non-empty batch.
    fn victim(&self) -> usize {
        let last = self.running.len().saturating_sub(1);
        match self.config.scheduling_policy {
            SchedulingPolicy::Fcfs => last,
            SchedulingPolicy::Priority => self
                .running
                .iter()
                .enumerate()
                .max_by_key(|(_, s)| s.order_key())
                .map_or(last, |(i, _)| i),
        }
    }

    /// Moves `running[i]` back to the waiting queue (its head under `fcfs`, its
    /// place by priority under `priority`), freeing its blocks.
    fn preempt(&mut self, i: usize) {
        let mut seq = self.running.remove(i);
        seq.release_blocks(&mut self.kv);
        seq.computed = 0;
        seq.ready_at = None;
        seq.prefill_end = seq.tokens.len();
        seq.hashes = self.kv.block_hashes(seq.hash_seed, &seq.tokens);
        self.metrics.preemptions += 1;
        match self.config.scheduling_policy {
            SchedulingPolicy::Fcfs => self.waiting.push_front(seq),
            SchedulingPolicy::Priority => self.wait_in_order(seq),
        }
        self.dirty = true;
    }

    fn finish(&mut self, mut seq: Seq, at: Duration) -> Event {
        seq.release_blocks(&mut self.kv);
        self.dirty = true;
        let reason = if seq.pooling {
            FinishReason::Stop
        } else if seq.kv_transfer == KvTransfer::RemoteDecode {
            FinishReason::RemoteDecode
        } else if seq.generated >= seq.max_len {
            FinishReason::Length
        } else {
            FinishReason::Stop
        };
        let timings = seq.timings(at);
        let m = &mut self.metrics;
        *m.request_success.entry(reason.as_str()).or_default() += 1;
        m.e2e_latency
            .observe(at.saturating_sub(seq.arrival).as_secs_f64());
        if let (Some(scheduled), Some(first)) = (seq.scheduled, seq.first_token) {
            m.inference_time
                .observe(at.saturating_sub(scheduled).as_secs_f64());
            m.prefill_time
                .observe(first.saturating_sub(scheduled).as_secs_f64());
            m.decode_time
                .observe(at.saturating_sub(first).as_secs_f64());
            if seq.generated > 1 {
                m.request_time_per_output_token
                    .observe(at.saturating_sub(first).as_secs_f64() / (seq.generated - 1) as f64);
            }
        }
        m.request_prompt_tokens.observe(seq.prompt_len as f64);
        m.request_generation_tokens.observe(seq.generated as f64);
        Event {
            request: seq.id,
            at,
            kind: EventKind::Finished(Finished {
                reason,
                usage: Usage {
                    prompt_tokens: seq.prompt_len,
                    completion_tokens: seq.generated,
                    cached_tokens: seq.cached_tokens,
                },
                timings,
            }),
        }
    }
}
