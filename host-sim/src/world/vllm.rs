//! Model servers backed by the `vllm-sim` engine, in virtual time.
//!
//! [`VllmUpstream`] answers like a `vllm-sim` HTTP server (same routes, statuses, headers,
//! SSE frames, JSON bodies and error bodies, `x-sim-server` and `x-inference-port`), but
//! its latencies come from stepping the engine (continuous batching, prefix-cached KV
//! cache, the calibrated latency profiles) on host-sim's virtual clock instead of the
//! wall clock:
//!
//! * [`Upstream::start`] runs the engine's steps due until `now`, then parses the
//!   OpenAI body exactly as the server does and submits it (one engine request per
//!   prompt); refusals are answered at once with the server's status and error body;
//! * a streaming response's head is sent at submission, then one `Data` per engine step
//!   that produced something for the request (the frames the server's SSE stream writes
//!   together), the last one ending with `data: [DONE]`;
//! * a non-streaming response is sent whole when its last choice finishes, with
//!   `content-length` as hyper sets it;
//! * [`Upstream::next_wake`] is the earliest of the next engine step and the next
//!   pending emission; [`Upstream::metrics`] renders the engine's `/metrics` text.
//!
//! Virtual time `t` ([`Nanos`] since the start of the run) is the engine's
//! `Duration::from_nanos(t)`: the engine's epoch is the start of the run.

use super::clock::{Nanos, EPOCH_NANOS, SEC};
use super::upstream::{Condition, Emit, KvPublished, Upstream, UpstreamRequest};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;
use vllm_sim::api::errors::ApiError;
use vllm_sim::api::openai::{self, Api, Choice, ChunkWriter, InferenceRequest};
use vllm_sim::api::responses::{self, ResponseMeta};
use vllm_sim::api::sse::{Routed, SseEncoder};
use vllm_sim::api::{anthropic, generate};
use vllm_sim::engine::latency::LatencyProfile;
use vllm_sim::engine::SchedulingPolicy;
use vllm_sim::engine::{Engine, EngineConfig, EngineRequest, EventKind, KvTransfer, RequestId};
use vllm_sim::engine::{EngineSnapshot, Usage};
use vllm_sim::failures::{self, FailureConfig};
use vllm_sim::metrics::MetricsOptions;

/// More engine steps than this in one call means the engine does not settle (a bug).
const MAX_STEPS_PER_CALL: usize = 1 << 24;

/// Settings of a [`VllmUpstream`]: the engine's and the server's (the `vllm-sim` flags
/// that matter in a simulation).
#[derive(Debug, Clone)]
pub struct VllmConfig {
    /// Its `ip:port`: the `x-sim-server` value (as `vllm-sim` sends by default) and the
    /// port of `x-inference-port`.
    pub address: String,
    /// The engine: `model`, `max_num_seqs`, `max_waiting_queue_length`,
    /// `num_gpu_blocks`, `block_size`, `latency` (profile), `seed`, ...
    pub engine: EngineConfig,
    /// Names the model answers to (`--served-model-name`); empty: `engine.model`.
    pub served_model_names: Vec<String>,
    /// `/metrics` naming (`--metrics-style`, `--legacy-metrics`).
    pub metrics: MetricsOptions,
    /// Failure injection (`--failure-injection-rate`, `--failure-types`).
    pub failures: FailureConfig,
    /// Larger request bodies get 413 (`--max-request-body-size-mb`).
    pub max_request_body_bytes: usize,
    /// Publish KV-cache events (`--kv-events-config` with `enable_kv_cache_events`), for
    /// the world's relay ([`Upstream::take_kv_events`]).
    pub kv_events: bool,
}

impl VllmConfig {
    /// `vllm-sim`'s defaults (profile `h100-llama-8b`, `max-num-seqs` 5, 4,096 KV
    /// blocks, seed 0, model `sim-model`) at `address`.
    pub fn new(address: &str) -> VllmConfig {
        VllmConfig {
            address: address.to_string(),
            engine: EngineConfig::default(),
            served_model_names: Vec::new(),
            metrics: MetricsOptions::default(),
            failures: FailureConfig::default(),
            max_request_body_bytes: 4 << 20,
            kv_events: false,
        }
    }

    /// The latency profile by name (`h100-llama-8b`, `zero`).
    ///
    /// # Panics
    /// On an unknown name.
    pub fn profile(mut self, name: &str) -> Self {
        self.engine.latency = LatencyProfile::by_name(name)
            .unwrap_or_else(|| panic!("unknown vllm-sim latency profile {name:?}"));
        self
    }

    /// A latency profile.
    pub fn latency(mut self, latency: LatencyProfile) -> Self {
        self.engine.latency = latency;
        self
    }

    /// `--max-num-seqs`: the running batch size.
    pub fn max_num_seqs(mut self, n: usize) -> Self {
        self.engine.max_num_seqs = n;
        self
    }

    /// `--max-waiting-queue-length`: waiting requests beyond which a request gets 429.
    pub fn max_waiting(mut self, n: usize) -> Self {
        self.engine.max_waiting_queue_length = n;
        self
    }

    /// `--scheduling-policy`: the waiting order and preemption victim
    /// (`fcfs`, or `priority` by the body's `priority`, lower first).
    pub fn scheduling_policy(mut self, policy: SchedulingPolicy) -> Self {
        self.engine.scheduling_policy = policy;
        self
    }

    /// `--num-gpu-blocks`: KV-cache capacity in blocks.
    pub fn kv_blocks(mut self, n: usize) -> Self {
        self.engine.num_gpu_blocks = n;
        self
    }

    /// `--seed`: output lengths, output text and latency jitter.
    pub fn seed(mut self, seed: u64) -> Self {
        self.engine.seed = seed;
        self
    }

    /// `--model`: the model name (responses, `model_name` label, block-hash seed).
    pub fn model(mut self, name: &str) -> Self {
        self.engine.model = name.to_string();
        self
    }

    /// Publishing KV-cache events (`--kv-events-config`): each engine step's
    /// `BlockStored` / `BlockRemoved` / `AllBlocksCleared`, for the world's relay.
    pub fn kv_events(mut self, on: bool) -> Self {
        self.kv_events = on;
        self
    }

    /// The server.
    pub fn build(self) -> VllmUpstream {
        VllmUpstream::with(self)
    }
}

/// Which API's body a non-streamed answer has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    OpenAi(Api),
    Responses,
    Messages,
    Generate,
}

/// How one HTTP request is being answered.
#[derive(Debug)]
enum Answer {
    /// Streaming: the head is out; frames per engine step.
    Stream(SseEncoder),
    /// Not streaming: the choices so far; one body at the end.
    Json {
        api: Shape,
        id: String,
        created: u64,
        model: String,
        choices: Vec<Choice>,
        usage: Usage,
        unfinished: usize,
        remote_decode: bool,
    },
}

#[derive(Debug)]
struct Active {
    engine_ids: Vec<RequestId>,
    answer: Answer,
}

/// A `vllm-sim` server in virtual time (see the module docs).
#[derive(Debug)]
pub struct VllmUpstream {
    cfg: VllmConfig,
    aliases: Vec<String>,
    model: String,
    port: String,
    engine: Engine,
    /// The latency profile before any [`Condition::Slowed`].
    base_latency: LatencyProfile,
    failing: Option<u16>,
    rng: vllm_sim::rng::Rng,
    active: BTreeMap<u64, Active>,
    /// Engine request → (request id, choice).
    by_engine: HashMap<RequestId, (u64, usize)>,
    /// What is to be sent, by (time, order).
    outbox: BTreeMap<(Nanos, u64), Emit>,
    seq: u64,
    /// A step wanted at this time scheduled nothing; wait for a change.
    stalled_at: Option<Duration>,
    next_request: u64,
    /// Unix seconds of the server's start (virtual epoch).
    created: u64,
    /// KV-event batches not taken yet (when publishing), with their step's end.
    kv_published: Option<Vec<(Nanos, Vec<vllm_sim::engine::kv_cache::KvEvent>)>>,
}

fn engine_time(t: Nanos) -> Duration {
    Duration::from_nanos(t)
}

fn nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn unix_secs(now: Nanos) -> u64 {
    (EPOCH_NANOS + now) / SEC
}

impl VllmUpstream {
    /// A server at `address` (its `x-sim-server`) running `engine`.
    pub fn new(address: &str, engine: EngineConfig) -> VllmUpstream {
        let mut cfg = VllmConfig::new(address);
        cfg.engine = engine;
        VllmUpstream::with(cfg)
    }

    /// A server with these settings.
    pub fn with(cfg: VllmConfig) -> VllmUpstream {
        let mut cfg = cfg;
        if cfg.served_model_names.is_empty() {
            cfg.served_model_names = vec![cfg.engine.model.clone()];
        }
        let model = cfg.served_model_names[0].clone();
        cfg.engine.model = model.clone();
        let port = cfg
            .address
            .rsplit_once(':')
            .map_or_else(String::new, |(_, p)| p.to_string());
        let mut engine = Engine::new(cfg.engine.clone());
        if cfg.kv_events {
            engine.enable_kv_events();
        }
        VllmUpstream {
            aliases: cfg.served_model_names.clone(),
            model,
            port,
            engine,
            kv_published: cfg.kv_events.then(Vec::new),
            base_latency: cfg.engine.latency.clone(),
            failing: None,
            // As the server's rank 0 seeds its failure draws.
            rng: vllm_sim::rng::Rng::new(cfg.engine.seed ^ 0x5eed_fa11),
            active: BTreeMap::new(),
            by_engine: HashMap::new(),
            outbox: BTreeMap::new(),
            seq: 0,
            stalled_at: None,
            next_request: 1,
            created: unix_secs(0),
            cfg,
        }
    }

    /// Wraps it for sharing: add a clone to the sim (`Box::new(shared.clone())`) and keep
    /// one to look at the engine mid-run.
    pub fn shared(self) -> Rc<RefCell<VllmUpstream>> {
        Rc::new(RefCell::new(self))
    }

    /// Its settings.
    pub fn config(&self) -> &VllmConfig {
        &self.cfg
    }

    /// The engine (queues, KV cache, counters) as of the last call.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Running and waiting requests, KV usage, as of the last call.
    pub fn snapshot(&self) -> EngineSnapshot {
        self.engine.snapshot()
    }

    /// HTTP requests not answered completely yet.
    pub fn active(&self) -> usize {
        self.active.len()
    }

    fn push(&mut self, at: Nanos, emit: Emit) {
        self.seq += 1;
        self.outbox.insert((at, self.seq), emit);
    }

    fn headers(&self, content_type: &str) -> Vec<(String, String)> {
        vec![
            ("content-type".into(), content_type.into()),
            ("x-sim-server".into(), self.cfg.address.clone()),
            ("x-inference-port".into(), self.port.clone()),
        ]
    }

    /// A whole response at `at` (hyper adds `content-length`).
    fn respond(&mut self, at: Nanos, id: u64, status: u16, content_type: &str, body: String) {
        let mut headers = self.headers(content_type);
        if !body.is_empty() {
            headers.push(("content-length".into(), body.len().to_string()));
        }
        self.push(
            at,
            Emit::Head {
                id,
                status,
                headers,
            },
        );
        if !body.is_empty() {
            self.push(
                at,
                Emit::Data {
                    id,
                    bytes: body.into_bytes(),
                },
            );
        }
        self.push(at, Emit::End { id });
    }

    fn error(&mut self, at: Nanos, id: u64, e: &ApiError) {
        self.respond(at, id, e.status, "application/json", e.to_json());
    }

    /// The next engine step, unless it is one that just scheduled nothing.
    fn next_step(&self) -> Option<Duration> {
        self.engine
            .next_step_at()
            .filter(|t| self.stalled_at.is_none_or(|s| *t > s))
    }

    /// Runs every engine step due at or before `now`; their events go to the outbox.
    fn advance(&mut self, now: Nanos) {
        let limit = engine_time(now);
        for _ in 0..MAX_STEPS_PER_CALL {
            let Some(t) = self.next_step().filter(|t| *t <= limit) else {
                return;
            };
            let Some(mut step) = self.engine.step(t) else {
                self.stalled_at = Some(t);
                continue;
            };
            self.stalled_at = None;
            if let Some(published) = self.kv_published.as_mut() {
                if !step.kv_events.is_empty() {
                    published.push((nanos(step.ends_at), std::mem::take(&mut step.kv_events)));
                }
            }
            self.deliver(nanos(step.ends_at), step.events);
        }
        panic!(
            "vllm engine at {} did not settle within {MAX_STEPS_PER_CALL} steps",
            self.cfg.address
        );
    }

    /// A step's events, at its end: one frame group per request, in order.
    fn deliver(&mut self, at: Nanos, events: Vec<vllm_sim::engine::Event>) {
        let mut order: Vec<u64> = Vec::new();
        let mut frames: HashMap<u64, String> = HashMap::new();
        for event in events {
            let Some(&(id, choice)) = self.by_engine.get(&event.request) else {
                continue;
            };
            if matches!(event.kind, EventKind::Finished(_)) {
                self.by_engine.remove(&event.request);
            }
            let Some(active) = self.active.get_mut(&id) else {
                continue;
            };
            match &mut active.answer {
                Answer::Stream(enc) => {
                    let out = frames.entry(id).or_insert_with(|| {
                        order.push(id);
                        String::new()
                    });
                    enc.event(
                        out,
                        Routed {
                            choice,
                            kind: event.kind,
                        },
                    );
                }
                Answer::Json {
                    choices,
                    usage,
                    unfinished,
                    ..
                } => {
                    let Some(c) = choices.get_mut(choice) else {
                        continue;
                    };
                    match event.kind {
                        EventKind::Token { text, .. } => c.text.push_str(text),
                        EventKind::Finished(f) => {
                            c.finish_reason = Some(f.reason);
                            usage.prompt_tokens += f.usage.prompt_tokens;
                            usage.completion_tokens += f.usage.completion_tokens;
                            usage.cached_tokens += f.usage.cached_tokens;
                            *unfinished -= 1;
                            if *unfinished == 0 {
                                order.push(id);
                            }
                        }
                    }
                }
            }
        }
        for id in order {
            let Some(active) = self.active.get(&id) else {
                continue;
            };
            match &active.answer {
                Answer::Stream(enc) => {
                    let done = enc.is_done();
                    let bytes = frames.remove(&id).unwrap_or_default().into_bytes();
                    if !bytes.is_empty() {
                        self.push(at, Emit::Data { id, bytes });
                    }
                    if done {
                        self.push(at, Emit::End { id });
                        self.active.remove(&id);
                    }
                }
                Answer::Json {
                    api,
                    id: rid,
                    created,
                    model,
                    choices,
                    usage,
                    remote_decode,
                    ..
                } => {
                    let text = choices.first().map_or("", |c| c.text.as_str());
                    let reason = choices
                        .first()
                        .and_then(|c| c.finish_reason)
                        .unwrap_or(vllm_sim::engine::FinishReason::Stop);
                    let body = match *api {
                        Shape::OpenAi(api) => openai::response_json(
                            api,
                            rid,
                            *created,
                            model,
                            choices,
                            usage,
                            *remote_decode,
                        ),
                        Shape::Responses => {
                            let meta = ResponseMeta {
                                id: rid.clone(),
                                item_id: format!("msg_{rid}"),
                                created_at: *created,
                                model: model.clone(),
                                max_output_tokens: usage.completion_tokens as u64,
                                instructions: None,
                                metadata: serde_json::Value::Null,
                                temperature: 1.0,
                                top_p: 1.0,
                                user: None,
                            };
                            responses::response_object(&meta, text, Some((reason, usage)))
                                .to_string()
                        }
                        Shape::Messages => {
                            anthropic::response_json(rid, model, text, reason, usage)
                        }
                        Shape::Generate => generate::vllm_json(rid, *created, model, reason, usage),
                    };
                    self.active.remove(&id);
                    self.respond(at, id, 200, "application/json", body);
                }
            }
        }
    }

    /// `POST /v1/completions` or `/v1/chat/completions`, as the server's `inference` route.
    fn inference(&mut self, now: Nanos, id: u64, api: Api, req: &UpstreamRequest) {
        if let Some(status) = self.failing {
            let e = failures::error_for_header(&status.to_string(), &self.model);
            return self.error(now, id, &e);
        }
        if let Some(value) = req.header("x-return-error") {
            let e = failures::error_for_header(value, &self.model);
            return self.error(now, id, &e);
        }
        if let Some(failure) = self.cfg.failures.pick(&mut self.rng) {
            let e = failure.error(&self.model);
            return self.error(now, id, &e);
        }
        if req.body.len() > self.cfg.max_request_body_bytes {
            let e = ApiError::new(
                413,
                format!(
                    "Request body exceeds {} bytes",
                    self.cfg.max_request_body_bytes
                ),
            );
            return self.error(now, id, &e);
        }
        let request = match openai::parse(api, &req.body) {
            Ok(r) => r,
            Err(e) => return self.error(now, id, &e),
        };
        let lora = match request.model.as_deref() {
            None => None,
            Some(m) if self.aliases.iter().any(|a| a == m) => None,
            Some(m) if self.engine.has_lora(m) => Some(m.to_string()),
            Some(m) => return self.error(now, id, &ApiError::model_not_found(m)),
        };
        let display_model = request.model.clone().unwrap_or_else(|| self.model.clone());
        let ids = match self.submit(now, &request, lora) {
            Ok(ids) => ids,
            Err(e) => return self.error(now, id, &e),
        };
        for (choice, eid) in ids.iter().enumerate() {
            self.by_engine.insert(*eid, (id, choice));
        }
        let n = self.next_request;
        self.next_request += 1;
        let rid = match api {
            Api::Completions => format!("cmpl-{:016x}{n:016x}", self.created),
            Api::Chat => format!("chatcmpl-{:016x}{n:016x}", self.created),
        };
        let created = unix_secs(now);
        let answer = if request.stream {
            let prompt_tokens: Vec<usize> = request.prompts.iter().map(Vec::len).collect();
            let writer = ChunkWriter::new(api, &rid, created, &display_model);
            let mut headers = self.headers("text/event-stream; charset=utf-8");
            headers.insert(1, ("cache-control".into(), "no-cache".into()));
            self.push(
                now,
                Emit::Head {
                    id,
                    status: 200,
                    headers,
                },
            );
            Answer::Stream(SseEncoder::new(
                writer,
                api == Api::Chat,
                request.include_usage,
                request.continuous_usage,
                &prompt_tokens,
            ))
        } else {
            Answer::Json {
                api: Shape::OpenAi(api),
                id: rid,
                created,
                model: display_model,
                choices: vec![Choice::default(); ids.len()],
                usage: Usage::default(),
                unfinished: ids.len(),
                remote_decode: request.kv_transfer == KvTransfer::RemoteDecode,
            }
        };
        self.active.insert(
            id,
            Active {
                engine_ids: ids,
                answer,
            },
        );
    }

    /// `/v1/responses`, `/v1/messages`, `/inference/v1/generate`: parsed as the server
    /// parses them, one engine request, answered whole (a streamed request is answered
    /// whole too: the tests of these APIs here look at where they run, not their frames).
    fn other(&mut self, now: Nanos, id: u64, shape: Shape, req: &UpstreamRequest) {
        let parsed = match shape {
            Shape::Responses => {
                responses::parse(&req.body).map(|r| (r.model, r.prompt, r.max_output_tokens))
            }
            Shape::Messages => anthropic::parse(&req.body, false)
                .map(|r| (Some(r.model), r.prompt, Some(r.max_tokens))),
            Shape::Generate => {
                generate::parse_vllm(&req.body).map(|r| (r.model, r.prompt, r.max_tokens))
            }
            Shape::OpenAi(_) => return,
        };
        let (model, prompt, max_tokens) = match parsed {
            Ok(p) => p,
            Err(e) => return self.error(now, id, &e),
        };
        let request = InferenceRequest {
            api: Api::Chat,
            model: model.clone(),
            prompts: vec![prompt],
            max_tokens,
            ignore_eos: false,
            stream: false,
            include_usage: false,
            continuous_usage: false,
            kv_transfer: KvTransfer::None,
            priority: 0,
        };
        let lora = match model.as_deref() {
            None => None,
            Some(m) if self.aliases.iter().any(|a| a == m) => None,
            Some(m) if self.engine.has_lora(m) => Some(m.to_string()),
            Some(m) => return self.error(now, id, &ApiError::model_not_found(m)),
        };
        let ids = match self.submit(now, &request, lora) {
            Ok(ids) => ids,
            Err(e) => return self.error(now, id, &e),
        };
        for (choice, eid) in ids.iter().enumerate() {
            self.by_engine.insert(*eid, (id, choice));
        }
        let n = self.next_request;
        self.next_request += 1;
        let answer = Answer::Json {
            api: shape,
            id: format!("{:016x}{n:016x}", self.created),
            created: unix_secs(now),
            model: model.unwrap_or_else(|| self.model.clone()),
            choices: vec![Choice::default(); ids.len()],
            usage: Usage::default(),
            unfinished: ids.len(),
            remote_decode: false,
        };
        self.active.insert(
            id,
            Active {
                engine_ids: ids,
                answer,
            },
        );
    }

    /// One engine request per prompt; all or none (the server's `submit`).
    fn submit(
        &mut self,
        now: Nanos,
        request: &InferenceRequest,
        lora: Option<String>,
    ) -> Result<Vec<RequestId>, ApiError> {
        let at = engine_time(now);
        let mut ids = Vec::with_capacity(request.prompts.len());
        for prompt in &request.prompts {
            let engine_request = EngineRequest {
                prompt: prompt.clone(),
                max_tokens: request
                    .max_tokens
                    .map(|m| m.clamp(0, i64::from(u32::MAX)) as u32),
                ignore_eos: request.ignore_eos,
                lora: lora.clone(),
                kv_transfer: request.kv_transfer,
                priority: request.priority,
            };
            match self.engine.submit(engine_request, at) {
                Ok(eid) => ids.push(eid),
                Err(e) => {
                    for eid in ids {
                        self.engine.abort(eid, at);
                    }
                    self.stalled_at = None;
                    return Err(e.into());
                }
            }
        }
        self.stalled_at = None;
        Ok(ids)
    }

    fn models_json(&self) -> String {
        let created = self.created;
        let mut data: Vec<serde_json::Value> = self
            .aliases
            .iter()
            .map(|name| {
                serde_json::json!({"id": name, "object": "model", "created": created,
                    "owned_by": "vllm", "root": self.model, "parent": null,
                    "max_model_len": self.cfg.engine.max_model_len, "permission": []})
            })
            .collect();
        for (name, path) in self.engine.loras() {
            data.push(
                serde_json::json!({"id": name, "object": "model", "created": created,
                "owned_by": "vllm", "root": path, "parent": self.model,
                "max_model_len": null, "permission": []}),
            );
        }
        serde_json::json!({"object": "list", "data": data}).to_string()
    }
}

impl Upstream for VllmUpstream {
    fn start(&mut self, now: Nanos, id: u64, req: &UpstreamRequest) {
        self.advance(now);
        let path = req.path.split('?').next().unwrap_or("");
        match (req.method.as_str(), path) {
            ("POST", "/v1/completions") => self.inference(now, id, Api::Completions, req),
            ("POST", "/v1/chat/completions") => self.inference(now, id, Api::Chat, req),
            ("POST", "/v1/responses") => self.other(now, id, Shape::Responses, req),
            ("POST", "/v1/messages") => self.other(now, id, Shape::Messages, req),
            ("POST", "/inference/v1/generate") => self.other(now, id, Shape::Generate, req),
            ("GET", "/metrics") => {
                let text = self.metrics(now);
                self.respond(
                    now,
                    id,
                    200,
                    "text/plain; version=0.0.4; charset=utf-8",
                    text,
                );
            }
            ("GET", "/health" | "/health/ready") => {
                // An empty body: no content-type; hyper says `content-length: 0`.
                let mut headers = self.headers("")[1..].to_vec();
                headers.push(("content-length".into(), "0".into()));
                self.push(
                    now,
                    Emit::Head {
                        id,
                        status: 200,
                        headers,
                    },
                );
                self.push(now, Emit::End { id });
            }
            ("GET", "/v1/models") => {
                let body = self.models_json();
                self.respond(now, id, 200, "application/json", body);
            }
            (
                _,
                "/v1/completions"
                | "/v1/chat/completions"
                | "/v1/models"
                | "/health"
                | "/health/ready"
                | "/metrics",
            ) => self.respond(
                now,
                id,
                405,
                "application/json",
                r#"{"detail":"Method Not Allowed"}"#.into(),
            ),
            _ => self.respond(
                now,
                id,
                404,
                "application/json",
                r#"{"detail":"Not Found"}"#.into(),
            ),
        }
    }

    fn cancel(&mut self, now: Nanos, id: u64) {
        self.advance(now);
        if let Some(active) = self.active.remove(&id) {
            for eid in active.engine_ids {
                self.by_engine.remove(&eid);
                self.engine.abort(eid, engine_time(now));
            }
            self.stalled_at = None;
        }
        self.outbox.retain(|_, e| match e {
            Emit::Head { id: i, .. } | Emit::Data { id: i, .. } | Emit::End { id: i } => *i != id,
        });
    }

    fn next_wake(&self) -> Option<Nanos> {
        let emit = self.outbox.keys().next().map(|(t, _)| *t);
        let step = self.next_step().map(nanos);
        match (emit, step) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn poll(&mut self, now: Nanos, out: &mut Vec<Emit>) {
        self.advance(now);
        while let Some(entry) = self.outbox.first_entry() {
            if entry.key().0 > now {
                break;
            }
            out.push(entry.remove());
        }
    }

    fn metrics(&mut self, now: Nanos) -> String {
        self.advance(now);
        self.engine
            .render_metrics(&self.cfg.metrics, (EPOCH_NANOS + now) as f64 / SEC as f64)
    }

    fn set_condition(&mut self, now: Nanos, condition: Condition) {
        self.advance(now);
        match condition {
            Condition::Healthy => {
                self.failing = None;
                self.engine.set_latency(self.base_latency.clone());
            }
            Condition::Slowed(f) => {
                let mut latency = self.base_latency.clone();
                latency.scale *= f.max(0.0);
                self.engine.set_latency(latency);
            }
            Condition::Failing(status) => self.failing = Some(status),
        }
        self.stalled_at = None;
    }

    fn take_kv_events(&mut self) -> Option<KvPublished> {
        let batches = std::mem::take(self.kv_published.as_mut()?);
        Some(KvPublished {
            model: self.model.clone(),
            block_size: self.engine.config().block_size,
            batches,
        })
    }
}

/// A shared server ([`VllmUpstream::shared`]) is driven through any of its handles.
impl Upstream for Rc<RefCell<VllmUpstream>> {
    fn start(&mut self, now: Nanos, id: u64, req: &UpstreamRequest) {
        self.borrow_mut().start(now, id, req);
    }

    fn cancel(&mut self, now: Nanos, id: u64) {
        self.borrow_mut().cancel(now, id);
    }

    fn next_wake(&self) -> Option<Nanos> {
        self.borrow().next_wake()
    }

    fn poll(&mut self, now: Nanos, out: &mut Vec<Emit>) {
        self.borrow_mut().poll(now, out);
    }

    fn metrics(&mut self, now: Nanos) -> String {
        self.borrow_mut().metrics(now)
    }

    fn set_condition(&mut self, now: Nanos, condition: Condition) {
        self.borrow_mut().set_condition(now, condition);
    }

    fn take_kv_events(&mut self) -> Option<KvPublished> {
        self.borrow_mut().take_kv_events()
    }
}
