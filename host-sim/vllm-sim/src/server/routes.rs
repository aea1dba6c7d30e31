//! HTTP routes: OpenAI inference endpoints, models, health, metrics, LoRA and
//! the admin endpoint.

use super::{lock, unix_time, Rank, Sink};
use crate::api::errors::ApiError;
use crate::api::openai::{self, Api, Choice, ChunkWriter, InferenceRequest};
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
use tokio::sync::mpsc::unbounded_channel;

type Resp = Response<ResponseBody>;

pub(crate) async fn handle(rank: Arc<Rank>, req: Request<Incoming>) -> Result<Resp, Infallible> {
    let mut resp = route(&rank, req)
        .await
        .unwrap_or_else(|e| error_response(&e));
    let headers = resp.headers_mut();
    headers.insert("x-sim-server", rank.name.clone());
    headers.insert("x-inference-port", rank.port.clone());
    Ok(resp)
}

async fn route(rank: &Arc<Rank>, req: Request<Incoming>) -> Result<Resp, ApiError> {
    let path = req.uri().path();
    match (req.method(), path) {
        (&Method::POST, "/v1/completions") => inference(rank, Api::Completions, req).await,
        (&Method::POST, "/v1/chat/completions") => inference(rank, Api::Chat, req).await,
        (&Method::GET, "/v1/models") => Ok(json_response(200, models(rank).to_string())),
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
            | "/v1/models"
            | "/health"
            | "/health/ready"
            | "/metrics"
            | "/v1/load_lora_adapter"
            | "/v1/unload_lora_adapter"
            | "/admin/config",
        ) => Ok(json_response(
            405,
            r#"{"detail":"Method Not Allowed"}"#.into(),
        )),
        _ => Ok(json_response(404, r#"{"detail":"Not Found"}"#.into())),
    }
}

async fn inference(rank: &Arc<Rank>, api: Api, req: Request<Incoming>) -> Result<Resp, ApiError> {
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
    let body = read_body(rank, req).await?;
    let request = openai::parse(api, &body)?;
    let lora = match request.model.as_deref() {
        None => None,
        Some(m) if rank.aliases.iter().any(|a| a == m) => None,
        Some(m) if lock(&rank.core).engine.has_lora(m) => Some(m.to_string()),
        Some(m) => return Err(ApiError::model_not_found(m)),
    };
    let display_model = request.model.clone().unwrap_or_else(|| rank.model.clone());

    let (tx, rx) = unbounded_channel();
    let ids = submit(rank, &request, lora, tx)?;
    rank.wake.notify_one();

    let n = rank.next_request.fetch_add(1, Ordering::Relaxed);
    let id = match api {
        Api::Completions => format!("cmpl-{:016x}{n:016x}", rank.created),
        Api::Chat => format!("chatcmpl-{:016x}{n:016x}", rank.created),
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
        let mut resp = Response::new(ResponseBody::Sse(Box::new(stream)));
        let headers = resp.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream; charset=utf-8"),
        );
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return Ok(resp);
    }
    let mut rx = rx;
    let mut choices = vec![Choice::default(); ids.len()];
    let mut usage = Usage::default();
    let mut unfinished = ids.len();
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

/// Submits one engine request per prompt; all or none.
fn submit(
    rank: &Rank,
    request: &InferenceRequest,
    lora: Option<String>,
    tx: tokio::sync::mpsc::UnboundedSender<Routed>,
) -> Result<Vec<RequestId>, ApiError> {
    let now = rank.clock.now();
    let mut core = lock(&rank.core);
    let mut ids = Vec::with_capacity(request.prompts.len());
    for (choice, prompt) in request.prompts.iter().enumerate() {
        let engine_request = EngineRequest {
            prompt: prompt.clone(),
            max_tokens: request
                .max_tokens
                .map(|m| m.clamp(0, u32::MAX as i64) as u32),
            ignore_eos: request.ignore_eos,
            lora: lora.clone(),
            kv_transfer: request.kv_transfer,
        };
        match core.engine.submit(engine_request, now) {
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

async fn read_body(rank: &Rank, req: Request<Incoming>) -> Result<Bytes, ApiError> {
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

fn json_response(status: u16, body: String) -> Resp {
    let mut resp = Response::new(ResponseBody::full(body));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn plain(status: u16, body: &str) -> Resp {
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
