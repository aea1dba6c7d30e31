//! The token-in APIs: vLLM's `POST /inference/v1/generate` (`token_ids`,
//! `sampling_params`; the answer's choices carry `token_ids`, with OpenAI's `usage`),
//! SGLang's `POST /generate` (`input_ids` or `text`, `sampling_params.max_new_tokens`;
//! the answer's `text`, `output_ids` and `meta_info` with `prompt_tokens`,
//! `completion_tokens`, `cached_tokens`), and vLLM's render endpoints
//! (`/v1/chat/completions/render`, `/v1/completions/render`: the generate request a
//! chat or completion request becomes, token ids and sampling parameters, no engine).

use super::errors::ApiError;
use super::openai::{usage_json, InferenceRequest};
use super::sse::{Routed, StreamEncoder};
use crate::engine::{EventKind, FinishReason, Usage};
use crate::tokenizer;
use serde_json::{json, Value};
use std::fmt::Write;

/// A parsed token-in request.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateRequest {
    pub model: Option<String>,
    pub prompt: Vec<u32>,
    pub max_tokens: Option<i64>,
    pub stream: bool,
    pub include_usage: bool,
}

fn ids(v: &Value, field: &str) -> Result<Vec<u32>, ApiError> {
    let bad =
        || ApiError::bad_request(format!("{field} must be a list of token ids")).with_param(field);
    let Value::Array(items) = v else {
        return Err(bad());
    };
    items
        .iter()
        .map(|i| {
            i.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(bad)
        })
        .collect()
}

fn object(body: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::bad_request("request body must be a JSON object")),
        Err(e) => Err(super::openai::json_error(e)),
    }
}

/// Parses a vLLM `/inference/v1/generate` body: `token_ids` and `sampling_params` required.
pub fn parse_vllm(body: &[u8]) -> Result<GenerateRequest, ApiError> {
    let obj = object(body)?;
    let prompt = match obj.get("token_ids") {
        Some(v) => ids(v, "token_ids")?,
        None => {
            return Err(ApiError::bad_request("token_ids: Field required").with_param("token_ids"))
        }
    };
    let Some(sampling) = obj.get("sampling_params").filter(|v| v.is_object()) else {
        return Err(
            ApiError::bad_request("sampling_params: Field required").with_param("sampling_params")
        );
    };
    let stream = obj.get("stream").and_then(Value::as_bool).unwrap_or(false);
    Ok(GenerateRequest {
        model: obj.get("model").and_then(Value::as_str).map(str::to_string),
        prompt,
        max_tokens: sampling.get("max_tokens").and_then(Value::as_i64),
        stream,
        include_usage: stream
            && obj
                .get("stream_options")
                .and_then(|o| o.get("include_usage"))
                .and_then(Value::as_bool)
                .unwrap_or(false),
    })
}

/// Parses an SGLang `/generate` body: `input_ids` (one prompt) or `text`.
pub fn parse_sglang(body: &[u8]) -> Result<GenerateRequest, ApiError> {
    let obj = object(body)?;
    let prompt = match (obj.get("input_ids"), obj.get("text")) {
        (Some(v), _) => ids(v, "input_ids")?,
        (None, Some(Value::String(t))) => tokenizer::encode(t),
        _ => {
            return Err(ApiError::bad_request(
                "Either text or input_ids should be provided.",
            ))
        }
    };
    let sampling = obj.get("sampling_params");
    Ok(GenerateRequest {
        model: None,
        prompt,
        max_tokens: sampling
            .and_then(|s| s.get("max_new_tokens"))
            .and_then(Value::as_i64),
        stream: obj.get("stream").and_then(Value::as_bool).unwrap_or(false),
        include_usage: false,
    })
}

/// The output token ids of `n` tokens.
fn output_ids(n: usize) -> Vec<u32> {
    (0..n).map(tokenizer::output_token_id).collect()
}

/// vLLM's whole answer.
pub fn vllm_json(
    id: &str,
    created: u64,
    model: &str,
    reason: FinishReason,
    usage: &Usage,
) -> String {
    format!(
        "{{\"request_id\":{id},\"id\":{id},\"created\":{created},\"model\":{model},\"choices\":[{{\"index\":0,\"logprobs\":null,\"finish_reason\":\"{}\",\"token_ids\":{}}}],\"usage\":{},\"prompt_logprobs\":null,\"kv_transfer_params\":null}}",
        reason.as_str(),
        json!(output_ids(usage.completion_tokens)),
        usage_json(usage, false),
        id = json!(id),
        model = json!(model),
    )
}

/// SGLang's whole answer.
pub fn sglang_json(id: &str, text: &str, reason: FinishReason, usage: &Usage) -> String {
    json!({
        "text": text,
        "output_ids": output_ids(usage.completion_tokens),
        "meta_info": meta_info(id, Some(reason), usage),
    })
    .to_string()
}

fn meta_info(id: &str, reason: Option<FinishReason>, usage: &Usage) -> Value {
    let finish = reason.map(|r| match r {
        FinishReason::Length => json!({"type": "length", "length": usage.completion_tokens}),
        _ => json!({"type": "stop", "matched": null}),
    });
    json!({
        "id": id,
        "finish_reason": finish,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
    })
}

/// The answer of a render endpoint: the generate request `request` becomes.
pub fn render_json(request: &InferenceRequest, model: &str) -> String {
    let prompt = request.prompts.first().cloned().unwrap_or_default();
    json!({
        "request_id": null,
        "token_ids": prompt,
        "features": null,
        "sampling_params": {"max_tokens": request.max_tokens},
        "model": request.model.as_deref().unwrap_or(model),
        "stream": request.stream,
        "cache_salt": null,
        "priority": request.priority,
        "kv_transfer_params": null,
    })
    .to_string()
}

/// Which token-in API a stream is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    Vllm,
    Sglang,
}

/// The streamed chunks: vLLM's `data: {request_id, choices:[{index, token_ids, ...}]}`
/// (then the usage chunk with `include_usage`) and `data: [DONE]`; SGLang's cumulative
/// `data: {text, output_ids, meta_info}` chunks and `data: [DONE]`.
pub struct GenerateEncoder {
    flavor: Flavor,
    id: String,
    include_usage: bool,
    prompt_tokens: usize,
    text: String,
    tokens: usize,
    done: bool,
}

impl GenerateEncoder {
    pub fn new(flavor: Flavor, id: &str, prompt_tokens: usize, include_usage: bool) -> Self {
        GenerateEncoder {
            flavor,
            id: id.to_string(),
            include_usage,
            prompt_tokens,
            text: String::new(),
            tokens: 0,
            done: false,
        }
    }
}

impl StreamEncoder for GenerateEncoder {
    fn event(&mut self, out: &mut String, routed: Routed) {
        if self.done || routed.choice != 0 {
            return;
        }
        let (reason, usage) = match routed.kind {
            EventKind::Token { index, text } => {
                self.tokens += 1;
                self.text.push_str(text);
                let usage = Usage {
                    prompt_tokens: self.prompt_tokens,
                    completion_tokens: self.tokens,
                    cached_tokens: 0,
                };
                match self.flavor {
                    Flavor::Vllm => {
                        let chunk = json!({"request_id": self.id, "choices": [{"index": 0,
                            "logprobs": null, "finish_reason": null,
                            "token_ids": [tokenizer::output_token_id(index)]}]});
                        let _ = write!(out, "data: {chunk}\n\n");
                    }
                    Flavor::Sglang => {
                        let chunk = json!({"text": self.text, "output_ids": output_ids(self.tokens),
                            "meta_info": meta_info(&self.id, None, &usage)});
                        let _ = write!(out, "data: {chunk}\n\n");
                    }
                }
                return;
            }
            EventKind::Finished(f) => (f.reason, f.usage),
        };
        match self.flavor {
            Flavor::Vllm => {
                let chunk = json!({"request_id": self.id, "choices": [{"index": 0,
                    "logprobs": null, "finish_reason": reason.as_str(), "token_ids": []}]});
                let _ = write!(out, "data: {chunk}\n\n");
                if self.include_usage {
                    let _ = write!(
                        out,
                        "data: {{\"request_id\":{},\"choices\":[],\"usage\":{}}}\n\n",
                        json!(self.id),
                        usage_json(&usage, true)
                    );
                }
            }
            Flavor::Sglang => {
                let chunk = json!({"text": self.text, "output_ids": output_ids(self.tokens),
                    "meta_info": meta_info(&self.id, Some(reason), &usage)});
                let _ = write!(out, "data: {chunk}\n\n");
            }
        }
        out.push_str("data: [DONE]\n\n");
        self.done = true;
    }

    fn aborted(&mut self, out: &mut String) {
        if self.done {
            return;
        }
        let _ = write!(
            out,
            "data: {}\n\n",
            ApiError::new(500, "request aborted").to_json()
        );
        out.push_str("data: [DONE]\n\n");
        self.done = true;
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generate_requests_take_their_token_ids() {
        let r = parse_vllm(br#"{"token_ids":[5,6,7],"sampling_params":{"max_tokens":3},"stream":true,"stream_options":{"include_usage":true}}"#).unwrap();
        assert_eq!(r.prompt, vec![5, 6, 7]);
        assert_eq!(r.max_tokens, Some(3));
        assert!(r.stream && r.include_usage);
        assert_eq!(
            parse_vllm(br#"{"sampling_params":{}}"#).unwrap_err().status,
            400
        );
        assert_eq!(parse_vllm(br#"{"token_ids":[1]}"#).unwrap_err().status, 400);
        let s =
            parse_sglang(br#"{"input_ids":[1,2],"sampling_params":{"max_new_tokens":4}}"#).unwrap();
        assert_eq!((s.prompt, s.max_tokens), (vec![1, 2], Some(4)));
        assert_eq!(parse_sglang(b"{}").unwrap_err().status, 400);
    }

    #[test]
    fn answers_carry_the_servers_usage_fields() {
        let u = Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
            cached_tokens: 1,
        };
        let v: Value =
            serde_json::from_str(&vllm_json("g1", 7, "m", FinishReason::Length, &u)).unwrap();
        assert_eq!(v["choices"][0]["token_ids"].as_array().unwrap().len(), 2);
        assert_eq!(v["usage"]["prompt_tokens"], 3);
        let s: Value =
            serde_json::from_str(&sglang_json("g1", "ab", FinishReason::Stop, &u)).unwrap();
        assert_eq!(s["meta_info"]["cached_tokens"], 1);
        assert_eq!(s["meta_info"]["finish_reason"]["type"], "stop");
    }
}
