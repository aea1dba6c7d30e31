//! Anthropic's Messages API as vLLM serves it (`POST /v1/messages`,
//! `/v1/messages/count_tokens`): the request turned into a chat conversation (the system
//! text, from `system` and any `system` message, first; content blocks' text, tool uses and
//! tool results in order), the message object, the streamed events (`message_start`,
//! `content_block_start`, `ping`-less `content_block_delta`s, `content_block_stop`,
//! `message_delta` with `stop_reason` and `usage`, `message_stop`; each frame
//! `event: <type>` then `data: <json>`), and errors in Anthropic's shape.
//!
//! `usage` is `input_tokens` (every prompt token, as vLLM counts them), `output_tokens`,
//! and `cache_read_input_tokens` when prompt tokens were served from the prefix cache.
//! Streamed, `message_start` carries `input_tokens` (the cache is not known before the
//! prefill), `message_delta` the whole usage.

use super::errors::ApiError;
use super::openai::{chat_template, ChatText};
use super::sse::{Routed, StreamEncoder};
use crate::engine::{EventKind, FinishReason, Usage};
use crate::tokenizer;
use serde_json::{json, Value};
use std::fmt::Write;

/// A parsed `/v1/messages` or `/v1/messages/count_tokens` request.
#[derive(Clone, Debug, PartialEq)]
pub struct MessagesRequest {
    pub model: String,
    /// The conversation rendered by the chat template, tokenized.
    pub prompt: Vec<u32>,
    pub max_tokens: i64,
    pub stream: bool,
}

struct Message {
    role: String,
    text: String,
}

impl ChatText for Message {
    fn role(&self) -> &str {
        &self.role
    }

    fn text(&self) -> String {
        self.text.clone()
    }
}

/// An Anthropic-shaped error body: `{"type":"error","error":{"type","message"}}`.
pub fn error_json(e: &ApiError) -> String {
    let kind = match e.status {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": e.message}}).to_string()
}

/// Parses a request; `count_tokens` needs no `max_tokens`. Errors are the 400s vLLM
/// answers (its request model's validation).
pub fn parse(body: &[u8], count_tokens: bool) -> Result<MessagesRequest, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))?;
    let Value::Object(obj) = value else {
        return Err(ApiError::bad_request("request body must be a JSON object"));
    };
    let model = match obj.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => return Err(ApiError::bad_request("model: Field required").with_param("model")),
    };
    let max_tokens = match obj.get("max_tokens") {
        Some(v) => match v.as_i64() {
            Some(m) if m > 0 => m,
            _ => {
                return Err(
                    ApiError::bad_request("max_tokens must be positive").with_param("max_tokens")
                )
            }
        },
        None if count_tokens => 0,
        None => {
            return Err(ApiError::bad_request("max_tokens: Field required").with_param("max_tokens"))
        }
    };
    let Some(Value::Array(messages)) = obj.get("messages") else {
        return Err(ApiError::bad_request("messages: Field required").with_param("messages"));
    };
    let mut system = String::new();
    if let Some(s) = obj.get("system") {
        blocks_text(s, &mut system);
    }
    let mut conversation = Vec::new();
    for m in messages {
        let Value::Object(m) = m else {
            return Err(
                ApiError::bad_request("each message must be an object").with_param("messages")
            );
        };
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if !matches!(role, "user" | "assistant" | "system") {
            return Err(ApiError::bad_request(format!(
                "messages: role must be 'user', 'assistant' or 'system', got '{role}'"
            ))
            .with_param("messages"));
        }
        let mut text = String::new();
        if let Some(c) = m.get("content") {
            blocks_text(c, &mut text);
        }
        if role == "system" {
            system.push_str(&text);
        } else {
            conversation.push(Message {
                role: role.to_string(),
                text,
            });
        }
    }
    if !system.is_empty() {
        conversation.insert(
            0,
            Message {
                role: "system".into(),
                text: system,
            },
        );
    }
    Ok(MessagesRequest {
        model,
        prompt: tokenizer::encode(&chat_template(&conversation)),
        max_tokens,
        stream: !count_tokens && obj.get("stream").and_then(Value::as_bool).unwrap_or(false),
    })
}

/// A content value's text: a string, or blocks whose text (text blocks, tool results'
/// content, tool uses' input as JSON) is joined in order.
fn blocks_text(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => out.push_str(s),
        Value::Array(blocks) => {
            for b in blocks {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        if let Some(t) = b.get("text").and_then(Value::as_str) {
                            out.push_str(t);
                        }
                    }
                    Some("tool_use") => {
                        if let Some(i) = b.get("input") {
                            out.push_str(&i.to_string());
                        }
                    }
                    Some("tool_result") => {
                        if let Some(c) = b.get("content") {
                            blocks_text(c, out);
                        }
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

/// vLLM's `stop_reason` for an engine finish reason.
pub fn stop_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "max_tokens",
        _ => "end_turn",
    }
}

/// The `usage` object.
pub fn usage_json(u: &Usage) -> Value {
    let mut v = json!({"input_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens});
    if u.cached_tokens > 0 {
        v["cache_read_input_tokens"] = json!(u.cached_tokens);
    }
    v
}

/// A whole (non-streamed) response.
pub fn response_json(
    id: &str,
    model: &str,
    text: &str,
    reason: FinishReason,
    usage: &Usage,
) -> String {
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "model": model,
        "stop_reason": stop_reason(reason),
        "stop_sequence": null,
        "usage": usage_json(usage),
    })
    .to_string()
}

/// `count_tokens`' answer.
pub fn count_json(input_tokens: usize) -> String {
    json!({"input_tokens": input_tokens,
           "context_management": {"original_input_tokens": input_tokens}})
    .to_string()
}

/// The streamed events of one message.
pub struct MessagesEncoder {
    id: String,
    model: String,
    prompt_tokens: usize,
    started: bool,
    block_open: bool,
    done: bool,
}

impl MessagesEncoder {
    pub fn new(id: &str, model: &str, prompt_tokens: usize) -> Self {
        MessagesEncoder {
            id: id.to_string(),
            model: model.to_string(),
            prompt_tokens,
            started: false,
            block_open: false,
            done: false,
        }
    }

    fn emit(out: &mut String, event: &str, data: Value) {
        let _ = write!(out, "event: {event}\ndata: {data}\n\n");
    }

    fn message_start(&mut self, out: &mut String) {
        if self.started {
            return;
        }
        self.started = true;
        let usage = Usage {
            prompt_tokens: self.prompt_tokens,
            ..Usage::default()
        };
        Self::emit(
            out,
            "message_start",
            json!({"type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "content": [],
                "model": self.model, "stop_reason": null, "stop_sequence": null,
                "usage": usage_json(&usage)}}),
        );
    }
}

impl StreamEncoder for MessagesEncoder {
    fn event(&mut self, out: &mut String, routed: Routed) {
        if self.done || routed.choice != 0 {
            return;
        }
        self.message_start(out);
        match routed.kind {
            EventKind::Token { text, .. } => {
                if !self.block_open {
                    self.block_open = true;
                    Self::emit(
                        out,
                        "content_block_start",
                        json!({"type": "content_block_start", "index": 0,
                               "content_block": {"type": "text", "text": ""}}),
                    );
                }
                Self::emit(
                    out,
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "text_delta", "text": text}}),
                );
            }
            EventKind::Finished(f) => {
                if self.block_open {
                    Self::emit(
                        out,
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": 0}),
                    );
                }
                Self::emit(
                    out,
                    "message_delta",
                    json!({"type": "message_delta",
                           "delta": {"stop_reason": stop_reason(f.reason)},
                           "usage": usage_json(&f.usage)}),
                );
                Self::emit(out, "message_stop", json!({"type": "message_stop"}));
                self.done = true;
            }
        }
    }

    fn aborted(&mut self, out: &mut String) {
        if self.done {
            return;
        }
        Self::emit(
            out,
            "error",
            json!({"type": "error", "error": {"type": "api_error", "message": "request aborted"}}),
        );
        self.done = true;
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Finished, Timings};

    #[test]
    fn a_request_becomes_a_chat_conversation_with_the_system_text_first() {
        let r = parse(
            br#"{"model":"m","max_tokens":5,"system":[{"type":"text","text":"be brief"}],
                "messages":[{"role":"user","content":"hi"},
                {"role":"assistant","content":[{"type":"text","text":"hello"}]},
                {"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"ok"}]}]}"#,
            false,
        )
        .unwrap();
        let want = chat_template(&[
            Message {
                role: "system".into(),
                text: "be brief".into(),
            },
            Message {
                role: "user".into(),
                text: "hi".into(),
            },
            Message {
                role: "assistant".into(),
                text: "hello".into(),
            },
            Message {
                role: "user".into(),
                text: "ok".into(),
            },
        ]);
        assert_eq!(r.prompt, tokenizer::encode(&want));
        assert_eq!(
            parse(br#"{"model":"m","messages":[]}"#, false)
                .unwrap_err()
                .status,
            400
        );
        assert!(parse(br#"{"model":"m","messages":[]}"#, true).is_ok());
        let e: Value = serde_json::from_str(&error_json(&ApiError::bad_request("x"))).unwrap();
        assert_eq!(e["type"], "error");
        assert_eq!(e["error"]["type"], "invalid_request_error");
    }

    #[test]
    fn a_stream_is_the_event_sequence_with_usage_at_both_ends() {
        let mut enc = MessagesEncoder::new("msg_1", "m", 12);
        let mut out = String::new();
        let token = |i| Routed {
            choice: 0,
            kind: EventKind::Token {
                index: i,
                text: "a",
            },
        };
        enc.event(&mut out, token(0));
        enc.event(&mut out, token(1));
        let usage = Usage {
            prompt_tokens: 12,
            completion_tokens: 2,
            cached_tokens: 8,
        };
        enc.event(
            &mut out,
            Routed {
                choice: 0,
                kind: EventKind::Finished(Finished {
                    reason: FinishReason::Length,
                    usage,
                    timings: Timings::default(),
                }),
            },
        );
        let events: Vec<&str> = out
            .lines()
            .filter_map(|l| l.strip_prefix("event: "))
            .collect();
        assert_eq!(
            events,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        let data: Vec<Value> = out
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert_eq!(data[0]["message"]["usage"]["input_tokens"], 12);
        assert_eq!(data[5]["usage"]["output_tokens"], 2);
        assert_eq!(data[5]["usage"]["cache_read_input_tokens"], 8);
        assert_eq!(data[5]["delta"]["stop_reason"], "max_tokens");
        assert!(enc.is_done());
    }
}
