//! OpenAI request parsing and response bodies (completions and chat), in the
//! shapes vLLM produces.

use super::errors::ApiError;
use crate::engine::{FinishReason, KvTransfer, Usage};
use crate::model_tokenizer::ModelTokenizer;
use crate::tokenizer;
use serde::Deserialize;
use serde_json::Value;
use std::fmt::Write;

/// Which endpoint a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Completions,
    Chat,
}

/// A parsed inference request, endpoint-neutral.
#[derive(Clone, Debug, PartialEq)]
pub struct InferenceRequest {
    pub api: Api,
    pub model: Option<String>,
    /// One token list per prompt (completions accept several; chat has one).
    pub prompts: Vec<Vec<u32>>,
    pub max_tokens: Option<i64>,
    pub ignore_eos: bool,
    pub stream: bool,
    pub include_usage: bool,
    pub continuous_usage: bool,
    pub kv_transfer: KvTransfer,
    /// `priority` (vLLM's extra field; lower is served earlier; default 0).
    pub priority: i64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StreamOptions {
    include_usage: Option<bool>,
    continuous_usage_stats: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct KvTransferParams {
    do_remote_decode: Option<bool>,
    do_remote_prefill: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Common {
    model: Option<String>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    ignore_eos: Option<bool>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    kv_transfer_params: Option<KvTransferParams>,
    priority: Option<i64>,
}

#[derive(Deserialize)]
struct CompletionBody {
    #[serde(flatten)]
    common: Common,
    #[serde(default)]
    prompt: Value,
}

#[derive(Deserialize)]
struct ChatBody {
    #[serde(flatten)]
    common: Common,
    #[serde(default)]
    messages: Vec<ChatMessage>,
}

#[derive(Deserialize)]
struct ChatMessage {
    #[serde(default)]
    role: String,
    #[serde(default)]
    content: Value,
}

/// Parses a request body for `api` (the stand-in tokenizer).
pub fn parse(api: Api, body: &[u8]) -> Result<InferenceRequest, ApiError> {
    parse_with(api, body, None)
}

/// Parses a request body for `api`, tokenized by `model` when given (`--tokenizer`).
pub fn parse_with(
    api: Api,
    body: &[u8],
    model: Option<&ModelTokenizer>,
) -> Result<InferenceRequest, ApiError> {
    let (common, prompts) = match api {
        Api::Completions => {
            let b: CompletionBody = serde_json::from_slice(body).map_err(json_error)?;
            let prompts = match (model, &b.prompt) {
                (Some(m), Value::String(s)) => {
                    vec![m.encode(s).map_err(ApiError::bad_request)?]
                }
                _ => completion_prompts(&b.prompt)?,
            };
            (b.common, prompts)
        }
        Api::Chat => {
            let b: ChatBody = serde_json::from_slice(body).map_err(json_error)?;
            if b.messages.is_empty() {
                return Err(
                    ApiError::bad_request("messages must not be empty").with_param("messages")
                );
            }
            let tokens = match model {
                Some(m) => {
                    let messages: Vec<(&str, String)> =
                        b.messages.iter().map(|x| (x.role(), x.text())).collect();
                    m.encode_chat(&messages).map_err(ApiError::bad_request)?
                }
                None => tokenizer::encode(&chat_template(&b.messages)),
            };
            (b.common, vec![tokens])
        }
    };
    let kv = common.kv_transfer_params.unwrap_or_default();
    let kv_transfer = if kv.do_remote_decode == Some(true) {
        KvTransfer::RemoteDecode
    } else if kv.do_remote_prefill == Some(true) {
        KvTransfer::RemotePrefill
    } else {
        KvTransfer::None
    };
    let stream = common.stream.unwrap_or(false);
    if stream && kv_transfer == KvTransfer::RemoteDecode {
        return Err(ApiError::bad_request(
            "Streaming is not supported with do_remote_decode",
        ));
    }
    let max_tokens = common.max_completion_tokens.or(common.max_tokens);
    if let Some(m) = max_tokens {
        if m < 1 {
            return Err(
                ApiError::bad_request(format!("max_tokens must be at least 1, got {m}."))
                    .with_param("max_tokens"),
            );
        }
    }
    let options = common.stream_options.unwrap_or_default();
    Ok(InferenceRequest {
        api,
        model: common.model,
        prompts,
        max_tokens,
        ignore_eos: common.ignore_eos.unwrap_or(false),
        stream,
        include_usage: stream && options.include_usage.unwrap_or(false),
        continuous_usage: stream && options.continuous_usage_stats.unwrap_or(false),
        kv_transfer,
        priority: common.priority.unwrap_or(0),
    })
}

/// The 400 of a body that is not the JSON expected.
pub fn json_error(e: serde_json::Error) -> ApiError {
    ApiError::bad_request(format!("JSON decode error: {e}"))
}

/// `prompt` may be a string, a list of strings, a list of token ids or a list of those.
fn completion_prompts(prompt: &Value) -> Result<Vec<Vec<u32>>, ApiError> {
    token_prompts(prompt, "prompt")
}

/// The prompts of a field that may be a string, a list of strings, a list of token
/// ids or a list of those (`prompt` of completions, `input` of the pooling APIs).
pub fn token_prompts(value: &Value, param: &str) -> Result<Vec<Vec<u32>>, ApiError> {
    let invalid = || {
        ApiError::bad_request(format!(
            "{param} must be a string, an array of strings, or token ids"
        ))
        .with_param(param)
    };
    let token_ids = |items: &Vec<Value>| -> Option<Vec<u32>> {
        items
            .iter()
            .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect()
    };
    match value {
        Value::String(s) => Ok(vec![tokenizer::encode(s)]),
        Value::Array(items) if items.is_empty() => Err(invalid()),
        Value::Array(items) if items[0].is_number() => {
            Ok(vec![token_ids(items).ok_or_else(invalid)?])
        }
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(tokenizer::encode(s)),
                Value::Array(ids) => token_ids(ids).ok_or_else(invalid),
                _ => Err(invalid()),
            })
            .collect(),
        _ => Err(invalid()),
    }
}

/// The prompt text of a `messages` field (chat messages with string or text-part
/// content), rendered by [`chat_template`]; without `add_generation_prompt` the
/// assistant's turn is left out (the pooling APIs' default).
pub fn messages_text(messages: &Value, add_generation_prompt: bool) -> Result<String, ApiError> {
    let messages: Vec<ChatMessage> = serde_json::from_value(messages.clone())
        .map_err(|e| ApiError::bad_request(format!("messages: {e}")).with_param("messages"))?;
    if messages.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty").with_param("messages"));
    }
    let mut text = chat_template(&messages);
    if !add_generation_prompt {
        text.truncate(text.len() - GENERATION_PROMPT.len());
    }
    Ok(text)
}

/// What [`chat_template`] ends with: the assistant's turn.
const GENERATION_PROMPT: &str = "<|assistant|>\n";

/// The prompt text of a conversation: one `<|role|>` section per message,
/// then the assistant's turn. A shared conversation start is a shared prefix.
pub fn chat_template(messages: &[impl ChatText]) -> String {
    let mut out = String::new();
    for m in messages {
        let _ = write!(out, "<|{}|>\n{}\n", m.role(), m.text());
    }
    out.push_str(GENERATION_PROMPT);
    out
}

/// Role and flattened text content of a chat message.
pub trait ChatText {
    fn role(&self) -> &str;
    fn text(&self) -> String;
}

impl ChatText for ChatMessage {
    fn role(&self) -> &str {
        &self.role
    }

    fn text(&self) -> String {
        match &self.content {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
            _ => String::new(),
        }
    }
}

/// A JSON string literal.
pub fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
}

/// The `usage` object, as vLLM started with `--enable-prompt-tokens-details` writes it:
/// `prompt_tokens_details.cached_tokens` when some prompt tokens were cached; with none,
/// `"prompt_tokens_details":null` in a whole body and no key at all in a streamed chunk
/// (vLLM tests the count for truth, and serializes stream chunks without `None`s).
pub fn usage_json(u: &Usage, streamed: bool) -> String {
    let details = match (u.cached_tokens, streamed) {
        (0, true) => String::new(),
        (0, false) => ",\"prompt_tokens_details\":null".to_string(),
        (n, _) => format!(",\"prompt_tokens_details\":{{\"cached_tokens\":{n}}}"),
    };
    format!(
        "{{\"prompt_tokens\":{},\"total_tokens\":{},\"completion_tokens\":{}{details}}}",
        u.prompt_tokens,
        u.total_tokens(),
        u.completion_tokens,
    )
}

/// `kv_transfer_params` returned by the prefill side (llm-d-inference-sim's dummy values).
pub const REMOTE_DECODE_PARAMS: &str = "{\"do_remote_decode\":false,\"do_remote_prefill\":true,\"remote_block_ids\":[\"DUMMY_ID\"],\"remote_engine_id\":\"DUMMY_ID\",\"remote_host\":\"DUMMY\",\"remote_port\":1234,\"tp_size\":1}";

/// One finished choice of a non-streaming response.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Choice {
    pub text: String,
    pub finish_reason: Option<FinishReason>,
}

/// The body of a non-streaming response.
pub fn response_json(
    api: Api,
    id: &str,
    created: u64,
    model: &str,
    choices: &[Choice],
    usage: &Usage,
    remote_decode: bool,
) -> String {
    let mut out = String::with_capacity(256 + choices.iter().map(|c| c.text.len()).sum::<usize>());
    let object = match api {
        Api::Completions => "text_completion",
        Api::Chat => "chat.completion",
    };
    let _ = write!(
        out,
        "{{\"id\":{},\"object\":\"{object}\",\"created\":{created},\"model\":{},\"choices\":[",
        json_string(id),
        json_string(model)
    );
    for (i, c) in choices.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let reason = c
            .finish_reason
            .map_or("null".to_string(), |r| json_string(r.as_str()));
        match api {
            Api::Completions => {
                let _ = write!(
                    out,
                    "{{\"index\":{i},\"text\":{},\"logprobs\":null,\"finish_reason\":{reason},\"stop_reason\":null}}",
                    json_string(&c.text)
                );
            }
            Api::Chat => {
                let _ = write!(
                    out,
                    "{{\"index\":{i},\"message\":{{\"role\":\"assistant\",\"content\":{},\"tool_calls\":[]}},\"logprobs\":null,\"finish_reason\":{reason},\"stop_reason\":null}}",
                    json_string(&c.text)
                );
            }
        }
    }
    let _ = write!(out, "],\"usage\":{}", usage_json(usage, false));
    if remote_decode {
        let _ = write!(out, ",\"kv_transfer_params\":{REMOTE_DECODE_PARAMS}");
    }
    out.push('}');
    out
}

/// Writes SSE chunks for one streaming response.
#[derive(Clone, Debug)]
pub struct ChunkWriter {
    api: Api,
    /// `data: {"id":..,"object":..,"created":..,"model":..,"choices":[`
    prefix: String,
}

impl ChunkWriter {
    pub fn new(api: Api, id: &str, created: u64, model: &str) -> Self {
        let object = match api {
            Api::Completions => "text_completion",
            Api::Chat => "chat.completion.chunk",
        };
        ChunkWriter {
            api,
            prefix: format!(
                "data: {{\"id\":{},\"object\":\"{object}\",\"created\":{created},\"model\":{},\"choices\":[",
                json_string(id),
                json_string(model)
            ),
        }
    }

    /// Chat only: the first chunk of a choice, `delta.role`.
    pub fn role(&self, out: &mut String, index: usize) {
        out.push_str(&self.prefix);
        let _ = write!(
            out,
            "{{\"index\":{index},\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n"
        );
    }

    /// One token. `usage` is for `continuous_usage_stats`.
    pub fn token(&self, out: &mut String, index: usize, text: &str, usage: Option<&Usage>) {
        out.push_str(&self.prefix);
        let text = json_string(text);
        match self.api {
            Api::Completions => {
                let _ = write!(out, "{{\"index\":{index},\"text\":{text},\"logprobs\":null,\"finish_reason\":null,\"stop_reason\":null}}]");
            }
            Api::Chat => {
                let _ = write!(out, "{{\"index\":{index},\"delta\":{{\"content\":{text}}},\"logprobs\":null,\"finish_reason\":null}}]");
            }
        }
        self.close(out, usage);
    }

    /// The final chunk of a choice: empty delta and `finish_reason`.
    pub fn finish(
        &self,
        out: &mut String,
        index: usize,
        reason: FinishReason,
        usage: Option<&Usage>,
    ) {
        out.push_str(&self.prefix);
        let reason = reason.as_str();
        match self.api {
            Api::Completions => {
                let _ = write!(out, "{{\"index\":{index},\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"{reason}\",\"stop_reason\":null}}]");
            }
            Api::Chat => {
                let _ = write!(out, "{{\"index\":{index},\"delta\":{{}},\"logprobs\":null,\"finish_reason\":\"{reason}\"}}]");
            }
        }
        self.close(out, usage);
    }

    /// The usage chunk (`stream_options.include_usage`): no choices.
    pub fn usage(&self, out: &mut String, usage: &Usage) {
        out.push_str(&self.prefix);
        out.push(']');
        self.close(out, Some(usage));
    }

    /// An error frame for a failure after streaming started.
    pub fn error(&self, out: &mut String, error: &ApiError) {
        let _ = write!(out, "data: {}\n\n", error.to_json());
    }

    pub fn done(&self, out: &mut String) {
        out.push_str("data: [DONE]\n\n");
    }

    fn close(&self, out: &mut String, usage: Option<&Usage>) {
        match usage {
            Some(u) => {
                let _ = write!(out, ",\"usage\":{}}}\n\n", usage_json(u, true));
            }
            None => out.push_str(",\"usage\":null}\n\n"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_prompt_forms_and_fields() {
        let r = parse(
            Api::Completions,
            br#"{"model":"m","prompt":["abcd","abcdefgh"],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        assert_eq!(r.prompts.len(), 2);
        assert_eq!(r.prompts[1].len(), 2);
        assert_eq!(r.max_tokens, Some(5));
        assert!(r.stream && r.include_usage);
        let r = parse(Api::Completions, br#"{"prompt":[1,2,3]}"#).unwrap();
        assert_eq!(r.prompts, vec![vec![1, 2, 3]]);
        assert_eq!(r.model, None);
        let r = parse(Api::Completions, br#"{"prompt":[[1],[2,3]]}"#).unwrap();
        assert_eq!(r.prompts, vec![vec![1], vec![2, 3]]);
        assert!(parse(Api::Completions, br#"{"prompt":{}}"#).is_err());
        assert!(parse(Api::Completions, br#"{"prompt":"x","max_tokens":0}"#).is_err());
        assert_eq!(
            parse(Api::Completions, b"not json").unwrap_err().status,
            400
        );
    }

    #[test]
    fn chat_messages_share_prefixes_and_pd_flags_parse() {
        let a = parse(Api::Chat, br#"{"messages":[{"role":"system","content":"You are a helpful bot for tests."},{"role":"user","content":"hi"}],"max_completion_tokens":3}"#).unwrap();
        let b = parse(Api::Chat, br#"{"messages":[{"role":"system","content":"You are a helpful bot for tests."},{"role":"user","content":[{"type":"text","text":"something else"}]}]}"#).unwrap();
        assert_eq!(a.max_tokens, Some(3));
        assert_eq!(a.prompts[0][..8], b.prompts[0][..8]);
        assert_ne!(a.prompts[0], b.prompts[0]);
        let p = parse(Api::Chat, br#"{"messages":[{"role":"user","content":"x"}],"kv_transfer_params":{"do_remote_decode":true}}"#).unwrap();
        assert_eq!(p.kv_transfer, KvTransfer::RemoteDecode);
        assert!(parse(Api::Chat, br#"{"messages":[{"role":"user","content":"x"}],"stream":true,"kv_transfer_params":{"do_remote_decode":true}}"#).is_err());
        assert!(parse(Api::Chat, br#"{"messages":[]}"#).is_err());
    }

    #[test]
    fn chunks_are_valid_json_with_null_usage() {
        let w = ChunkWriter::new(Api::Chat, "chatcmpl-1", 7, "m");
        let mut out = String::new();
        w.role(&mut out, 0);
        w.token(&mut out, 0, " hi\"", None);
        w.finish(&mut out, 0, FinishReason::Length, None);
        w.usage(
            &mut out,
            &Usage {
                prompt_tokens: 3,
                completion_tokens: 1,
                cached_tokens: 0,
            },
        );
        w.done(&mut out);
        let frames: Vec<&str> = out.split("\n\n").filter(|f| !f.is_empty()).collect();
        assert_eq!(frames.len(), 5);
        let json: Vec<serde_json::Value> = frames[..4]
            .iter()
            .map(|f| serde_json::from_str(f.strip_prefix("data: ").unwrap()).unwrap())
            .collect();
        assert_eq!(json[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(json[1]["choices"][0]["delta"]["content"], " hi\"");
        assert!(json[1]["usage"].is_null() && json[1].get("usage").is_some());
        assert_eq!(json[2]["choices"][0]["finish_reason"], "length");
        assert_eq!(json[3]["choices"].as_array().unwrap().len(), 0);
        assert_eq!(json[3]["usage"]["total_tokens"], 4);
        assert_eq!(frames[4], "data: [DONE]");
    }

    #[test]
    fn cached_tokens_are_written_as_vllm_writes_them() {
        let u = |cached_tokens| Usage {
            prompt_tokens: 40,
            completion_tokens: 2,
            cached_tokens,
        };
        let v = |s: String| serde_json::from_str::<serde_json::Value>(&s).unwrap();
        let hit = v(usage_json(&u(32), false));
        assert_eq!(hit["prompt_tokens_details"]["cached_tokens"], 32);
        assert_eq!(v(usage_json(&u(32), true)), hit);
        let body = v(usage_json(&u(0), false));
        assert!(body["prompt_tokens_details"].is_null());
        assert!(body.get("prompt_tokens_details").is_some());
        let chunk = v(usage_json(&u(0), true));
        assert!(chunk.get("prompt_tokens_details").is_none());
        assert_eq!(chunk["prompt_tokens"], 40);
    }
}
