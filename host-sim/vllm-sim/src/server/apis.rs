//! Handlers of the APIs beyond completions and chat. Each parses its body with its
//! [`crate::api`] module, runs the engine where vLLM does (responses and audio
//! generate, the pooling APIs prefill only; tokenize and conversations do not touch
//! it), and renders vLLM's body. Errors are OpenAI-style, like the other routes'.

use super::routes::{
    collect, json_response, method_not_allowed, new_id, not_found, preflight, read_body,
    resolve_lora, sse_response, submit, Resp, Submission,
};
use super::{lock, unix_time, Rank};
use crate::api::anthropic;
use crate::api::audio::{self, AudioApi};
use crate::api::conversations;
use crate::api::errors::ApiError;
use crate::api::generate::{self, Flavor, GenerateEncoder};
use crate::api::pooling::{self, PoolingApi};
use crate::api::responses::{self, ResponseMeta, ResponsesEncoder};
use crate::api::sse::SseStream;
use crate::api::tokenize;
use crate::engine::{FinishReason, KvTransfer};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request};
use std::sync::Arc;
use tokio::sync::mpsc::unbounded_channel;

/// `POST /v1/responses`: one generation, like chat; streamed as Responses events.
pub(super) async fn responses(rank: &Arc<Rank>, req: Request<Incoming>) -> Result<Resp, ApiError> {
    preflight(rank, &req)?;
    let body = read_body(rank, req).await?;
    let request = responses::parse(&body)?;
    let lora = resolve_lora(rank, request.model.as_deref())?;
    // As vLLM: `max_output_tokens` is capped by what the context window leaves.
    let limit = rank
        .max_model_len
        .saturating_sub(request.prompt.len())
        .max(1) as i64;
    let max_tokens = request.max_output_tokens.map(|m| m.min(limit));
    let rx = generate(
        rank,
        std::slice::from_ref(&request.prompt),
        max_tokens,
        lora,
    )?;

    let meta = ResponseMeta {
        id: new_id(rank, "resp", '_'),
        item_id: new_id(rank, "msg", '_'),
        created_at: unix_time().as_secs(),
        model: request.model.unwrap_or_else(|| rank.model.clone()),
        max_output_tokens: max_tokens.unwrap_or(limit) as u64,
        instructions: request.instructions,
        metadata: request.metadata,
        temperature: request.temperature,
        top_p: request.top_p,
        user: request.user,
    };
    if request.stream {
        let encoder = Box::new(ResponsesEncoder::new(meta));
        return Ok(sse_response(SseStream::with_encoder(rx, encoder)));
    }
    let (choices, usage) = collect(rx, 1).await?;
    let reason = choices[0].finish_reason.unwrap_or(FinishReason::Stop);
    let body = responses::response_object(&meta, &choices[0].text, Some((reason, &usage)));
    Ok(json_response(200, body.to_string()))
}

/// `/v1/embeddings`, `/pooling`, `/classify`, `/score`, `/rerank`: one prefill-only
/// Submits the generation of `prompts` (one here) to the engine and wakes it; the
/// receiver gets their tokens.
fn generate(
    rank: &Rank,
    prompts: &[Vec<u32>],
    max_tokens: Option<i64>,
    lora: Option<String>,
) -> Result<tokio::sync::mpsc::UnboundedReceiver<crate::server::Routed>, ApiError> {
    let (tx, rx) = unbounded_channel();
    let submission = Submission::Generate {
        max_tokens,
        ignore_eos: false,
        kv_transfer: KvTransfer::None,
        priority: 0,
    };
    submit(rank, prompts, &submission, lora, tx)?;
    rank.wake.notify_one();
    Ok(rx)
}

/// engine request per output item.
pub(super) async fn pooling(
    rank: &Arc<Rank>,
    api: PoolingApi,
    req: Request<Incoming>,
) -> Result<Resp, ApiError> {
    preflight(rank, &req)?;
    let body = read_body(rank, req).await?;
    let request = pooling::parse(api, &body)?;
    let lora = resolve_lora(rank, request.model.as_deref())?;
    let (tx, rx) = unbounded_channel();
    let ids = submit(rank, &request.prompts, &Submission::Pool, lora, tx)?;
    rank.wake.notify_one();
    let (_, usage) = collect(rx, ids.len()).await?;
    let id = new_id(rank, api.id_prefix(), '-');
    let model = request.model.as_deref().unwrap_or(&rank.model);
    let body = pooling::response_json(&request, &id, unix_time().as_secs(), model, &usage);
    Ok(json_response(200, body))
}

/// `POST /tokenize`.
pub(super) async fn tokenize(rank: &Arc<Rank>, req: Request<Incoming>) -> Result<Resp, ApiError> {
    let body = read_body(rank, req).await?;
    let request = tokenize::parse_tokenize(&body)?;
    resolve_lora(rank, request.model.as_deref())?;
    let count = crate::tokenizer::count(&request.text);
    if count > rank.max_model_len {
        return Err(ApiError::bad_request(format!(
            "This model's maximum context length is {} tokens. However, your request has {count} input tokens. Please reduce the length of the input messages.",
            rank.max_model_len
        )));
    }
    lock(&rank.vocabulary).learn(&request.text);
    Ok(json_response(
        200,
        tokenize::tokenize_json(&request, rank.max_model_len),
    ))
}

/// `POST /detokenize`.
pub(super) async fn detokenize(rank: &Arc<Rank>, req: Request<Incoming>) -> Result<Resp, ApiError> {
    let body = read_body(rank, req).await?;
    let request = tokenize::parse_detokenize(&body)?;
    resolve_lora(rank, request.model.as_deref())?;
    let text = lock(&rank.vocabulary).decode(&request.tokens);
    Ok(json_response(200, tokenize::detokenize_json(&text)))
}

/// `/v1/conversations{rest}`: `rest` is empty, `/{id}` or `/{id}/items`.
pub(super) async fn conversations(
    rank: &Arc<Rank>,
    req: Request<Incoming>,
    rest: &str,
) -> Result<Resp, ApiError> {
    let segments: Vec<&str> = match rest.strip_prefix('/') {
        None if rest.is_empty() => Vec::new(),
        None => return Ok(not_found()),
        Some(r) => r.split('/').collect(),
    };
    let method = req.method().clone();
    let now = unix_time().as_secs();
    match (&method, segments.as_slice()) {
        (&Method::POST, [] | [""]) => {
            let body = conversations::parse(&read_body(rank, req).await?)?;
            let json = lock(&rank.conversations).create(body, now).to_json();
            Ok(json_response(200, json))
        }
        (_, [] | [""]) => Ok(method_not_allowed()),
        (_, [id]) => {
            let id = id.to_string();
            let body = match method {
                Method::POST => conversations::parse(&read_body(rank, req).await?)?,
                _ => conversations::ConversationBody::default(),
            };
            let mut store = lock(&rank.conversations);
            let json = match method {
                Method::GET => store.get(&id).map(|c| c.to_json()),
                Method::POST => {
                    let metadata = body.metadata.unwrap_or_else(|| serde_json::json!({}));
                    store.update(&id, metadata).map(|c| c.to_json())
                }
                Method::DELETE => store.delete(&id),
                _ => return Ok(method_not_allowed()),
            };
            json.map(|j| json_response(200, j))
                .ok_or_else(|| conversations::not_found(&id))
        }
        (_, [id, "items"]) => {
            let id = id.to_string();
            let items = match method {
                Method::POST => conversations::parse(&read_body(rank, req).await?)?.items,
                Method::GET => Vec::new(),
                _ => return Ok(method_not_allowed()),
            };
            let mut store = lock(&rank.conversations);
            let json = match method {
                Method::POST => store
                    .add_items(&id, items)
                    .map(|added| conversations::items_json(&added)),
                _ => store.get(&id).map(|c| conversations::items_json(&c.items)),
            };
            json.map(|j| json_response(200, j))
                .ok_or_else(|| conversations::not_found(&id))
        }
        _ => Ok(not_found()),
    }
}

/// `/v1/audio/transcriptions` and `/v1/audio/translations`: one generation whose
/// prompt is the audio.
pub(super) async fn audio(
    rank: &Arc<Rank>,
    api: AudioApi,
    req: Request<Incoming>,
) -> Result<Resp, ApiError> {
    preflight(rank, &req)?;
    let content_type = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = read_body(rank, req).await?;
    let request = audio::parse(api, content_type.as_deref(), &body)?;
    let lora = resolve_lora(rank, request.model.as_deref())?;
    let rx = generate(rank, std::slice::from_ref(&request.prompt), None, lora)?;
    let (choices, _) = collect(rx, 1).await?;
    let text = choices[0].text.trim_start();
    if request.text_format {
        let mut resp = json_response(200, text.to_string());
        resp.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        return Ok(resp);
    }
    Ok(json_response(200, audio::response_json(&request, text)))
}

/// `POST /v1/messages` and `/v1/messages/count_tokens`: errors in Anthropic's shape.
pub(super) async fn messages(
    rank: &Arc<Rank>,
    req: Request<Incoming>,
    count_tokens: bool,
) -> Result<Resp, ApiError> {
    let result = if count_tokens {
        count(rank, req).await
    } else {
        message(rank, req).await
    };
    Ok(result.unwrap_or_else(|e| json_response(e.status, anthropic::error_json(&e))))
}

async fn count(rank: &Arc<Rank>, req: Request<Incoming>) -> Result<Resp, ApiError> {
    let body = read_body(rank, req).await?;
    let request = anthropic::parse(&body, true)?;
    resolve_lora(rank, Some(&request.model))?;
    Ok(json_response(
        200,
        anthropic::count_json(request.prompt.len()),
    ))
}

async fn message(rank: &Arc<Rank>, req: Request<Incoming>) -> Result<Resp, ApiError> {
    preflight(rank, &req)?;
    let body = read_body(rank, req).await?;
    let request = anthropic::parse(&body, false)?;
    let lora = resolve_lora(rank, Some(&request.model))?;
    let rx = generate(
        rank,
        std::slice::from_ref(&request.prompt),
        Some(request.max_tokens),
        lora,
    )?;
    let id = new_id(rank, "msg", '_');
    if request.stream {
        let encoder = Box::new(anthropic::MessagesEncoder::new(
            &id,
            &request.model,
            request.prompt.len(),
        ));
        return Ok(sse_response(SseStream::with_encoder(rx, encoder)));
    }
    let (choices, usage) = collect(rx, 1).await?;
    let reason = choices[0].finish_reason.unwrap_or(FinishReason::Stop);
    let body = anthropic::response_json(&id, &request.model, &choices[0].text, reason, &usage);
    Ok(json_response(200, body))
}

/// `POST /inference/v1/generate` (vLLM) and `/generate` (SGLang).
pub(super) async fn token_generate(
    rank: &Arc<Rank>,
    req: Request<Incoming>,
    flavor: Flavor,
) -> Result<Resp, ApiError> {
    preflight(rank, &req)?;
    let body = read_body(rank, req).await?;
    let request = match flavor {
        Flavor::Vllm => generate::parse_vllm(&body)?,
        Flavor::Sglang => generate::parse_sglang(&body)?,
    };
    let lora = resolve_lora(rank, request.model.as_deref())?;
    let model = request.model.clone().unwrap_or_else(|| rank.model.clone());
    let rx = generate(
        rank,
        std::slice::from_ref(&request.prompt),
        request.max_tokens,
        lora,
    )?;
    let id = new_id(rank, "generate-tokens", '-');
    if request.stream {
        let encoder = Box::new(GenerateEncoder::new(
            flavor,
            &id,
            request.prompt.len(),
            request.include_usage,
        ));
        return Ok(sse_response(SseStream::with_encoder(rx, encoder)));
    }
    let (choices, usage) = collect(rx, 1).await?;
    let reason = choices[0].finish_reason.unwrap_or(FinishReason::Stop);
    let body = match flavor {
        Flavor::Vllm => generate::vllm_json(&id, unix_time().as_secs(), &model, reason, &usage),
        Flavor::Sglang => generate::sglang_json(&id, &choices[0].text, reason, &usage),
    };
    Ok(json_response(200, body))
}

/// `POST /v1/chat/completions/render` and `/v1/completions/render`: no engine.
pub(super) async fn render(
    rank: &Arc<Rank>,
    req: Request<Incoming>,
    api: crate::api::openai::Api,
) -> Result<Resp, ApiError> {
    let body = read_body(rank, req).await?;
    let request = crate::api::openai::parse_with(api, &body, rank.tokenizer.as_deref())?;
    resolve_lora(rank, request.model.as_deref())?;
    Ok(json_response(
        200,
        generate::render_json(&request, &rank.model),
    ))
}
