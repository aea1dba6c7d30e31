//! The simulated vLLM engine: continuous batching over a prefix-cached KV
//! cache, with a step-based latency model.
//!
//! The engine holds no clock and no runtime: every call takes `now` (a
//! [`Duration`] since the engine's epoch). The HTTP server drives it in real
//! time; [`crate::sim::run`] (or any discrete-event simulator) drives
//! it in virtual time. The protocol is:
//!
//! 1. [`Engine::submit`] a request at its arrival time;
//! 2. ask [`Engine::next_step_at`] when the engine wants to run next;
//! 3. at that time call [`Engine::step`]; the returned [`Step`] says when it
//!    ends and what happens then (tokens, finished requests);
//! 4. repeat from 2 (submissions may happen at any time in between).

mod batch;
pub mod kv_cache;
pub mod latency;
pub mod output;
mod policy;
mod request;

pub use batch::Step;
pub use policy::SchedulingPolicy;
pub use request::{
    EngineRequest, Event, EventKind, FinishReason, Finished, KvTransfer, RequestId, SubmitError,
    Timings, Usage,
};

use crate::metrics::{self, Gauges, Metrics, MetricsOptions};
use crate::rng::Rng;
use batch::Seq;
use kv_cache::KvCache;
use latency::LatencyProfile;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

/// Engine settings. Defaults are documented in the README.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// The served model name (metric label, block-hash seed).
    pub model: String,
    /// Sequences in the running batch (`--max-num-seqs`).
    pub max_num_seqs: usize,
    /// Requests allowed to wait (`--max-waiting-queue-length`); more get 429.
    pub max_waiting_queue_length: usize,
    /// Context window (`--max-model-len`).
    pub max_model_len: usize,
    /// Token budget of one step (`--max-num-batched-tokens`), for chunked prefill.
    pub max_num_batched_tokens: usize,
    /// Most tokens one request computes in a step (`--long-prefill-token-threshold`;
    /// 0 = no cap but the step's budget): a longer prompt is prefilled in chunks of at
    /// most this many tokens, as vLLM v1 does.
    pub long_prefill_token_threshold: usize,
    /// Tokens per KV block (`--block-size`).
    pub block_size: usize,
    /// KV-cache capacity in blocks (`--num-gpu-blocks` / `--kv-cache-size`).
    pub num_gpu_blocks: usize,
    /// Distinct LoRA adapters in one batch (`--max-loras`).
    pub max_loras: usize,
    /// Order of the waiting queue and choice of preemption victim
    /// (`--scheduling-policy`, [`SchedulingPolicy`]).
    pub scheduling_policy: SchedulingPolicy,
    pub latency: LatencyProfile,
    pub seed: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            model: "sim-model".into(),
            max_num_seqs: 5,
            max_waiting_queue_length: 1000,
            max_model_len: 4096,
            max_num_batched_tokens: 8192,
            long_prefill_token_threshold: 0,
            block_size: 16,
            num_gpu_blocks: 4096,
            max_loras: 1,
            scheduling_policy: SchedulingPolicy::Fcfs,
            latency: LatencyProfile::h100_llama_8b(),
            seed: 0,
        }
    }
}

/// Queue and cache state at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineSnapshot {
    pub running: usize,
    pub waiting: usize,
    /// Pinned blocks / capacity, 0..1.
    pub kv_usage: f64,
    pub pinned_blocks: usize,
    /// Unused blocks kept for prefix hits.
    pub cached_blocks: usize,
    pub running_loras: Vec<String>,
    pub waiting_loras: Vec<String>,
}

/// The simulated engine. See the module docs for how to drive it.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    kv: KvCache,
    rng: Rng,
    next_id: RequestId,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    /// The current step ends then; no new step before.
    busy_until: Duration,
    /// The latest time the engine was told about (time never goes back).
    latest: Duration,
    /// Something changed that may let a waiting request in.
    dirty: bool,
    /// Loaded LoRA adapters: name → path.
    loras: BTreeMap<String, String>,
    metrics: Metrics,
}

impl Engine {
    pub fn new(config: EngineConfig) -> Self {
        let mut config = config;
        config.max_num_seqs = config.max_num_seqs.max(1);
        config.max_num_batched_tokens = config.max_num_batched_tokens.max(1);
        config.block_size = config.block_size.max(1);
        Engine {
            kv: KvCache::new(config.num_gpu_blocks, config.block_size),
            rng: Rng::new(config.seed),
            next_id: 1,
            waiting: VecDeque::new(),
            running: Vec::new(),
            busy_until: Duration::ZERO,
            latest: Duration::ZERO,
            dirty: false,
            loras: BTreeMap::new(),
            metrics: Metrics::new(config.max_model_len),
            config,
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Records KV-cache events from now on; each [`Step`] carries those of its step
    /// (what vLLM publishes with `--kv-events-config`).
    pub fn enable_kv_events(&mut self) {
        self.kv.record_events();
    }

    /// Drops every cached block no request uses (vLLM's `POST /reset_prefix_cache`);
    /// the `AllBlocksCleared` event goes out with the next step, or from
    /// [`take_kv_events`](Self::take_kv_events). Returns the blocks dropped.
    pub fn reset_prefix_cache(&mut self) -> usize {
        self.dirty = true;
        self.kv.reset_prefix_cache()
    }

    /// KV events recorded since the last step (those not yet handed out with one).
    pub fn take_kv_events(&mut self) -> Vec<kv_cache::KvEvent> {
        self.kv.take_events()
    }

    /// Changes the latency model (takes effect at the next step).
    pub fn set_latency(&mut self, latency: LatencyProfile) {
        self.config.latency = latency;
    }

    /// Queues a request that arrived at `now`.
    pub fn submit(
        &mut self,
        request: EngineRequest,
        now: Duration,
    ) -> Result<RequestId, SubmitError> {
        self.enqueue(request, false, now)
    }

    /// Queues a pooling request (embeddings, scores, classification, ...) that arrived
    /// at `now`. Its prompt is prefilled like any other (batched, chunked, prefix-cached)
    /// and it finishes at the end of its prefill without an output token, with finish
    /// reason `stop` and 0 completion tokens, as vLLM's pooling requests do. The prompt
    /// may fill the whole context window.
    pub fn submit_pooling(
        &mut self,
        prompt: Vec<u32>,
        lora: Option<String>,
        now: Duration,
    ) -> Result<RequestId, SubmitError> {
        let request = EngineRequest {
            prompt,
            lora,
            ..EngineRequest::default()
        };
        self.enqueue(request, true, now)
    }

    fn enqueue(
        &mut self,
        request: EngineRequest,
        pooling: bool,
        now: Duration,
    ) -> Result<RequestId, SubmitError> {
        self.latest = self.latest.max(now);
        let now = self.latest;
        let prompt_len = request.prompt.len();
        if prompt_len == 0 {
            return Err(SubmitError::EmptyPrompt);
        }
        if let Some(lora) = &request.lora {
            if !self.loras.contains_key(lora) {
                return Err(SubmitError::UnknownLora(lora.clone()));
            }
        }
        let max_model_len = self.config.max_model_len;
        let too_long = match request.max_tokens {
            _ if pooling => prompt_len > max_model_len,
            Some(0) => return Err(SubmitError::InvalidMaxTokens(0)),
            Some(m) => prompt_len + m as usize > max_model_len,
            None => prompt_len >= max_model_len,
        };
        if too_long {
            return Err(SubmitError::ContextTooLong {
                max_model_len,
                prompt_tokens: prompt_len,
                max_tokens: request.max_tokens,
            });
        }
        if request.priority != 0 && self.config.scheduling_policy == SchedulingPolicy::Fcfs {
            return Err(SubmitError::PriorityNotEnabled(request.priority));
        }
        if self.waiting.len() >= self.config.max_waiting_queue_length {
            return Err(SubmitError::QueueFull);
        }
        let limit = max_model_len - prompt_len;
        let target = match request.kv_transfer {
            _ if pooling => 0,
            KvTransfer::RemoteDecode => 1,
            _ => output::sample_output_len(
                &mut self.rng,
                request.max_tokens,
                request.ignore_eos,
                limit,
            ),
        };
        if self.kv.blocks_for(prompt_len + target) > self.kv.capacity() {
            return Err(SubmitError::KvCapacity);
        }
        let max_len = request
            .max_tokens
            .map_or(limit, |m| (m as usize).min(limit));
        let id = self.next_id;
        self.next_id += 1;
        let text_seed = self.rng.next_u64();
        let hash_seed = kv_cache::name_seed(request.lora.as_deref().unwrap_or(&self.config.model));
        let mut seq = Seq::new(
            id, request, target, max_len, hash_seed, text_seed, now, &self.kv,
        );
        seq.pooling = pooling;
        if let Some(m) = seq.max_tokens_param {
            self.metrics.request_params_max_tokens.observe(m as f64);
        }
        self.wait(seq);
        self.dirty = true;
        Ok(id)
    }

    /// Drops a request (client gone). Returns false if it is unknown or finished.
    pub fn abort(&mut self, id: RequestId, _now: Duration) -> bool {
        let seq = if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            self.waiting.remove(i)
        } else if let Some(i) = self.running.iter().position(|s| s.id == id) {
            Some(self.running.remove(i))
        } else {
            None
        };
        let Some(mut seq) = seq else {
            return false;
        };
        seq.release_blocks(&mut self.kv);
        *self
            .metrics
            .request_success
            .entry(FinishReason::Abort.as_str())
            .or_default() += 1;
        self.dirty = true;
        true
    }

    /// Loads a LoRA adapter. Errors if one of that name is already loaded.
    pub fn load_lora(&mut self, name: &str, path: &str) -> Result<(), String> {
        if self.loras.contains_key(name) {
            return Err(format!(
                "The lora adapter '{name}' has already been loaded."
            ));
        }
        self.loras.insert(name.to_string(), path.to_string());
        Ok(())
    }

    /// Unloads a LoRA adapter. Errors if it is not loaded.
    pub fn unload_lora(&mut self, name: &str) -> Result<(), String> {
        self.loras
            .remove(name)
            .map(|_| ())
            .ok_or_else(|| format!("The lora adapter '{name}' cannot be found."))
    }

    /// Loaded LoRA adapters: (name, path).
    pub fn loras(&self) -> impl Iterator<Item = (&str, &str)> {
        self.loras.iter().map(|(n, p)| (n.as_str(), p.as_str()))
    }

    pub fn has_lora(&self, name: &str) -> bool {
        self.loras.contains_key(name)
    }

    /// Requests waiting plus running.
    pub fn in_flight(&self) -> usize {
        self.waiting.len() + self.running.len()
    }

    pub fn snapshot(&self) -> EngineSnapshot {
        EngineSnapshot {
            running: self.running.len(),
            waiting: self.waiting.len(),
            kv_usage: self.kv.usage(),
            pinned_blocks: self.kv.pinned(),
            cached_blocks: self.kv.unused_cached(),
            running_loras: lora_names(self.running.iter()),
            waiting_loras: lora_names(self.waiting.iter()),
        }
    }

    /// Counters and histograms so far.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Prometheus text. `unix_time` is the wall-clock (or virtual) time in
    /// seconds, the value of `vllm:lora_requests_info`.
    pub fn render_metrics(&self, opts: &MetricsOptions, unix_time: f64) -> String {
        let s = self.snapshot();
        let gauges = Gauges {
            running: s.running,
            waiting: s.waiting,
            kv_usage: s.kv_usage,
            block_size: self.config.block_size,
            num_gpu_blocks: self.config.num_gpu_blocks,
            max_loras: self.config.max_loras,
            running_loras: s.running_loras,
            waiting_loras: s.waiting_loras,
        };
        metrics::render(&self.config.model, &self.metrics, &gauges, opts, unix_time)
    }
}

fn lora_names<'a>(seqs: impl Iterator<Item = &'a Seq>) -> Vec<String> {
    seqs.filter_map(|s| s.lora.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}
