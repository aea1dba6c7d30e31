//! HTTP routes: the dispatch of every path, the completions and chat endpoints, models,
//! health, metrics, LoRA and the admin endpoint, and what the other APIs' handlers
//! ([`super::apis`]) share with them: the checks before an engine request, submitting
//! prompts, collecting their outputs, bodies.

use super::apis;
use super::{lock, unix_time, Rank, Sink};
use crate::api::audio::AudioApi;
use crate::api::errors::ApiError;
use crate::api::openai::{self, Api, Choice, ChunkWriter};
use crate::api::pooling::PoolingApi;
use crate::api::sse::{ResponseBody, Routed, SseStream};
use crate::engine::{EngineRequest, EventKind, KvTransfer, RequestId, Usage};
use crate::failures;
use crate::settings;
use crate::time::Clock;
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

pub(super) type Resp = Response<ResponseBody>;

pub(crate) async fn handle(rank: Arc<Rank>, req: Request<Incoming>) -> Result<Resp, Infallible> {
    let received = received_headers(&req);
    let mut resp = route(&rank, req)
        .await
        .unwrap_or_else(|e| error_response(&e));
    let headers = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&received) {
        headers.insert("x-sim-request-headers", v);
    }
    headers.insert("x-sim-server", rank.name.clone());
    headers.insert("x-inference-port", rank.port.clone());
    Ok(resp)
}

/// The names of the request's `x-` headers, sorted and comma-separated: what a gateway in
/// front passed on (answered in `x-sim-request-headers`, for tests).
fn received_headers(req: &Request<Incoming>) -> String {
    let mut names: Vec<&str> = req
        .headers()
        .keys()
        .map(|k| k.as_str())
        .filter(|k| k.starts_with("x-") && *k != "x-request-id")
        .collect();
    names.sort_unstable();
    names.dedup();
    names.join(",")
}

async fn route(rank: &Arc<Rank>, req: Request<Incoming>) -> Result<Resp, ApiError> {
    let path = req.uri().path();
    if let Some(rest) = path.strip_prefix("/v1/conversations") {
        let rest = rest.to_string();
        return apis::conversations(rank, req, &rest).await;
    }
    match (req.method(), path) {
        (&Method::POST, "/v1/completions") => inference(rank, Api::Completions, req).await,
        (&Method::POST, "/v1/chat/completions") => inference(rank, Api::Chat, req).await,
        (&Method::POST, "/v1/responses") => apis::responses(rank, req).await,
        (&Method::POST, "/v1/messages") => apis::messages(rank, req, false).await,
        (&Method::POST, "/v1/messages/count_tokens") => apis::messages(rank, req, true).await,
        (&Method::POST, "/inference/v1/generate") => {
            apis::token_generate(rank, req, crate::api::generate::Flavor::Vllm).await
        }
        (&Method::POST, "/generate") => {
            apis::token_generate(rank, req, crate::api::generate::Flavor::Sglang).await
        }
        (&Method::POST, "/v1/chat/completions/render") => apis::render(rank, req, Api::Chat).await,
        (&Method::POST, "/v1/completions/render") => {
            apis::render(rank, req, Api::Completions).await
        }
        (&Method::POST, "/v1/embeddings") => apis::pooling(rank, PoolingApi::Embeddings, req).await,
        (&Method::POST, "/pooling") => apis::pooling(rank, PoolingApi::Pooling, req).await,
        (&Method::POST, "/classify") => apis::pooling(rank, PoolingApi::Classify, req).await,
        (&Method::POST, "/score" | "/v1/score") => {
            apis::pooling(rank, PoolingApi::Score, req).await
        }
        (&Method::POST, "/rerank" | "/v1/rerank" | "/v2/rerank") => {
            apis::pooling(rank, PoolingApi::Rerank, req).await
        }
        (&Method::POST, "/tokenize") => apis::tokenize(rank, req).await,
        (&Method::POST, "/detokenize") => apis::detokenize(rank, req).await,
        (&Method::POST, "/v1/audio/transcriptions") => {
            apis::audio(rank, AudioApi::Transcription, req).await
        }
        (&Method::POST, "/v1/audio/translations") => {
            apis::audio(rank, AudioApi::Translation, req).await
        }
        (&Method::GET, "/v1/models") => Ok(json_response(200, models(rank).to_string())),
        (&Method::POST, "/reset_prefix_cache") => {
            rank.reset_prefix_cache();
            Ok(plain(200, ""))
        }
        (&Method::GET, "/health") => Ok(plain(200, "")),
        (&Method::GET, "/health/ready") if rank.is_ready() => Ok(plain(200, "")),
        (&Method::GET, "/health/ready") => Err(ApiError::not_ready()),
        (&Method::GET, "/metrics") => Ok(metrics(rank)),
        (&Method::POST, "/v1/load_lora_adapter") => lora(rank, req, true).await,
        (&Method::POST, "/v1/unload_lora_adapter") => lora(rank, req, false).await,
        (&Method::GET, "/admin/config") => Ok(json_response(200, admin_config(rank).to_string())),
        (&Method::POST, "/admin/config") => admin_update(rank, req).await,
        (
            _,
            "/v1/completions"
            | "/v1/chat/completions"
            | "/v1/responses"
            | "/v1/messages"
            | "/v1/messages/count_tokens"
            | "/inference/v1/generate"
            | "/generate"
            | "/v1/chat/completions/render"
            | "/v1/completions/render"
            | "/v1/embeddings"
            | "/pooling"
            | "/classify"
            | "/score"
            | "/v1/score"
            | "/rerank"
            | "/v1/rerank"
            | "/v2/rerank"
            | "/tokenize"
            | "/detokenize"
            | "/v1/audio/transcriptions"
            | "/v1/audio/translations"
            | "/v1/models"
            | "/reset_prefix_cache"
            | "/health"
            | "/health/ready"
            | "/metrics"
            | "/v1/load_lora_adapter"
            | "/v1/unload_lora_adapter"
            | "/admin/config",
        ) => Ok(method_not_allowed()),
        _ => Ok(not_found()),
    }
}

pub(super) fn method_not_allowed() -> Resp {
    json_response(405, r#"{"detail":"Method Not Allowed"}"#.into())
}

pub(super) fn not_found() -> Resp {
    json_response(404, r#"{"detail":"Not Found"}"#.into())
}

/// What an engine-backed request goes through before its body is read: the
/// `X-Return-Error` header, injected failures, readiness.
pub(super) fn preflight(rank: &Rank, req: &Request<Incoming>) -> Result<(), ApiError> {
    if let Some(value) = req.headers().get("x-return-error") {
        return Err(failures::error_for_header(
            value.to_str().unwrap_or(""),
            &rank.model,
        ));
    }
    let injected = {
        let mut control = lock(&rank.control);
        let control = &mut *control;
        control.failures.pick(&mut control.rng)
    };
    if let Some(failure) = injected {
        return Err(failure.error(&rank.model));
    }
    if !rank.is_ready() {
        return Err(ApiError::not_ready());
    }
    Ok(())
}

/// The LoRA adapter a request's `model` names (`None` for the base model), or 404.
pub(super) fn resolve_lora(rank: &Rank, model: Option<&str>) -> Result<Option<String>, ApiError> {
    match model {
        None => Ok(None),
        Some(m) if rank.aliases.iter().any(|a| a == m) => Ok(None),
        Some(m) if lock(&rank.core).engine.has_lora(m) => Ok(Some(m.to_string())),
        Some(m) => Err(ApiError::model_not_found(m)),
    }
}

/// A new response id: `<prefix>-<server start><request number>` (`prefix_…` with `sep` `_`).
pub(super) fn new_id(rank: &Rank, prefix: &str, sep: char) -> String {
    let n = rank.next_request.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{sep}{:016x}{n:016x}", rank.created)
}

async fn inference(rank: &Arc<Rank>, api: Api, req: Request<Incoming>) -> Result<Resp, ApiError> {
    preflight(rank, &req)?;
    let body = read_body(rank, req).await?;
    let request = openai::parse_with(api, &body, rank.tokenizer.as_deref())?;
    let lora = resolve_lora(rank, request.model.as_deref())?;
    let display_model = request.model.clone().unwrap_or_else(|| rank.model.clone());

    let (tx, rx) = unbounded_channel();
    let submission = Submission::Generate {
        max_tokens: request.max_tokens,
        ignore_eos: request.ignore_eos,
        kv_transfer: request.kv_transfer,
        priority: request.priority,
    };
    let ids = submit(rank, &request.prompts, &submission, lora, tx)?;
    rank.wake.notify_one();

    let id = match api {
        Api::Completions => new_id(rank, "cmpl", '-'),
        Api::Chat => new_id(rank, "chatcmpl", '-'),
    };
    let created = unix_time().as_secs();
    let prompt_tokens: Vec<usize> = request.prompts.iter().map(Vec::len).collect();
    if request.stream {
        let writer = ChunkWriter::new(api, &id, created, &display_model);
        let stream = SseStream::new(
            rx,
            writer,
            api == Api::Chat,
            request.include_usage,
            request.continuous_usage,
            &prompt_tokens,
        );
        return Ok(sse_response(stream));
    }
    let (choices, usage) = collect(rx, ids.len()).await?;
    let body = openai::response_json(
        api,
        &id,
        created,
        &display_model,
        &choices,
        &usage,
        request.kv_transfer == KvTransfer::RemoteDecode,
    );
    Ok(json_response(200, body))
}

/// Waits until the `n` engine requests of a response finished: each one's text and
/// finish reason, and their usage summed.
pub(super) async fn collect(
    mut rx: UnboundedReceiver<Routed>,
    n: usize,
) -> Result<(Vec<Choice>, Usage), ApiError> {
    let mut choices = vec![Choice::default(); n];
    let mut usage = Usage::default();
    let mut unfinished = n;
    while unfinished > 0 {
        let Some(Routed { choice, kind }) = rx.recv().await else {
            return Err(ApiError::new(500, "request aborted"));
        };
        let Some(c) = choices.get_mut(choice) else {
            continue;
        };
        match kind {
            EventKind::Token { text, .. } => c.text.push_str(text),
            EventKind::Finished(f) => {
                c.finish_reason = Some(f.reason);
                usage.prompt_tokens += f.usage.prompt_tokens;
                usage.completion_tokens += f.usage.completion_tokens;
                usage.cached_tokens += f.usage.cached_tokens;
                unfinished -= 1;
            }
        }
    }
    Ok((choices, usage))
}

/// What the engine does with the prompts of a response.
pub(super) enum Submission {
    /// Generates tokens (completions, chat, responses, audio).
    Generate {
        max_tokens: Option<i64>,
        ignore_eos: bool,
        kv_transfer: KvTransfer,
        priority: i64,
    },
    /// Prefills only (the pooling APIs).
    Pool,
}

/// Submits one engine request per prompt (choice `i` for prompt `i`); all or none.
pub(super) fn submit(
    rank: &Rank,
    prompts: &[Vec<u32>],
    submission: &Submission,
    lora: Option<String>,
    tx: UnboundedSender<Routed>,
) -> Result<Vec<RequestId>, ApiError> {
    let now = rank.clock.now();
    let mut core = lock(&rank.core);
    let mut ids = Vec::with_capacity(prompts.len());
    for (choice, prompt) in prompts.iter().enumerate() {
        let submitted = match submission {
            Submission::Generate {
                max_tokens,
                ignore_eos,
                kv_transfer,
                priority,
            } => {
                let engine_request = EngineRequest {
                    prompt: prompt.clone(),
                    max_tokens: max_tokens.map(|m| m.clamp(0, u32::MAX as i64) as u32),
                    ignore_eos: *ignore_eos,
                    lora: lora.clone(),
                    kv_transfer: *kv_transfer,
                    priority: *priority,
                };
                core.engine.submit(engine_request, now)
            }
            Submission::Pool => core
                .engine
                .submit_pooling(prompt.clone(), lora.clone(), now),
        };
        match submitted {
            Ok(id) => {
                core.sinks.insert(
                    id,
                    Sink {
                        tx: tx.clone(),
                        choice,
                    },
                );
                ids.push(id);
            }
            Err(e) => {
                for id in ids {
                    core.sinks.remove(&id);
                    core.engine.abort(id, now);
                }
                return Err(e.into());
            }
        }
    }
    Ok(ids)
}

pub(super) async fn read_body(rank: &Rank, req: Request<Incoming>) -> Result<Bytes, ApiError> {
    match Limited::new(req.into_body(), rank.max_body).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(_) => Err(ApiError::new(
            413,
            format!("Request body exceeds {} bytes", rank.max_body),
        )),
    }
}

fn models(rank: &Rank) -> Value {
    let created = rank.created;
    let mut data: Vec<Value> = rank
        .aliases
        .iter()
        .map(|name| {
            json!({"id": name, "object": "model", "created": created, "owned_by": "vllm",
                   "root": rank.model, "parent": null, "max_model_len": rank.max_model_len,
                   "permission": []})
        })
        .collect();
    let core = lock(&rank.core);
    for (name, path) in core.engine.loras() {
        data.push(
            json!({"id": name, "object": "model", "created": created, "owned_by": "vllm",
                         "root": path, "parent": rank.model, "max_model_len": null,
                         "permission": []}),
        );
    }
    json!({"object": "list", "data": data})
}

fn metrics(rank: &Rank) -> Resp {
    let text = lock(&rank.core)
        .engine
        .render_metrics(&rank.metrics, unix_time().as_secs_f64());
    let mut resp = Response::new(ResponseBody::full(text));
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

async fn lora(rank: &Arc<Rank>, req: Request<Incoming>, load: bool) -> Result<Resp, ApiError> {
    let body = read_body(rank, req).await?;
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("JSON decode error: {e}")))?;
    let name = v["lora_name"]
        .as_str()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ApiError::bad_request("lora_name is required").with_param("lora_name"))?;
    if rank.aliases.iter().any(|a| a == name) {
        return Err(ApiError::bad_request(format!(
            "The lora adapter '{name}' has already been loaded."
        )));
    }
    let mut core = lock(&rank.core);
    if load {
        let path = v["lora_path"].as_str().unwrap_or(name);
        core.engine
            .load_lora(name, path)
            .map_err(ApiError::bad_request)?;
        Ok(plain(
            200,
            &format!("Success: LoRA adapter '{name}' added successfully."),
        ))
    } else {
        core.engine
            .unload_lora(name)
            .map_err(|e| ApiError::new(404, e))?;
        Ok(plain(
            200,
            &format!("Success: LoRA adapter '{name}' removed successfully."),
        ))
    }
}

fn admin_config(rank: &Rank) -> Value {
    let latency = lock(&rank.core).engine.config().latency.clone();
    let failures = lock(&rank.control).failures.clone();
    settings::to_json(&latency, &failures)
}

async fn admin_update(rank: &Arc<Rank>, req: Request<Incoming>) -> Result<Resp, ApiError> {
    let body = read_body(rank, req).await?;
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("JSON decode error: {e}")))?;
    {
        let mut core = lock(&rank.core);
        let mut control = lock(&rank.control);
        let mut latency = core.engine.config().latency.clone();
        settings::apply_json(&v, &mut latency, &mut control.failures, rank.max_num_seqs)
            .map_err(ApiError::bad_request)?;
        core.engine.set_latency(latency);
    }
    Ok(json_response(200, admin_config(rank).to_string()))
}

/// A `text/event-stream` response.
pub(super) fn sse_response(stream: SseStream) -> Resp {
    let mut resp = Response::new(ResponseBody::Sse(Box::new(stream)));
    let headers = resp.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

pub(super) fn json_response(status: u16, body: String) -> Resp {
    let mut resp = Response::new(ResponseBody::full(body));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

pub(super) fn plain(status: u16, body: &str) -> Resp {
    let mut resp = if body.is_empty() {
        Response::new(ResponseBody::empty())
    } else {
        Response::new(ResponseBody::full(body.to_string()))
    };
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    resp
}

fn error_response(e: &ApiError) -> Resp {
    json_response(e.status, e.to_json())
}
