//! The OpenAI Responses API (`POST /v1/responses`) as vLLM serves it: request parsing
//! into a chat prompt, the response object, and the streamed events (`event: <type>`
//! then `data: <json>` frames, `response.created` … `response.completed`, no `[DONE]`).

use super::errors::ApiError;
use super::openai::{chat_template, json_error, ChatText};
use super::sse::{Routed, StreamEncoder};
use crate::engine::{EventKind, FinishReason, Usage};
use crate::tokenizer;
use serde_json::{json, Map, Value};
use std::fmt::Write;

/// A parsed `/v1/responses` request.
#[derive(Clone, Debug, PartialEq)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    /// The prompt: `instructions` as a system message, then `input`, rendered like chat.
    pub prompt: Vec<u32>,
    pub max_output_tokens: Option<i64>,
    pub stream: bool,
    pub instructions: Option<String>,
    pub metadata: Value,
    pub temperature: f64,
    pub top_p: f64,
    pub user: Option<String>,
}

/// One message of the input: a role and its text.
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

/// Parses a request body. Errors are vLLM's 400s.
pub fn parse(body: &[u8]) -> Result<ResponsesRequest, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(json_error)?;
    let Value::Object(obj) = value else {
        return Err(ApiError::bad_request("request body must be a JSON object"));
    };
    let string = |field: &str| -> Result<Option<String>, ApiError> {
        match obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => {
                Err(ApiError::bad_request(format!("{field} must be a string")).with_param(field))
            }
        }
    };
    let instructions = string("instructions")?;
    let mut messages = Vec::new();
    if let Some(i) = &instructions {
        messages.push(Message {
            role: "system".into(),
            text: i.clone(),
        });
    }
    input_messages(&obj, &mut messages)?;
    let max_output_tokens = match obj.get("max_output_tokens") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_i64() {
            Some(m) if m >= 1 => Some(m),
            _ => {
                return Err(ApiError::bad_request(format!(
                    "max_output_tokens must be at least 1, got {v}."
                ))
                .with_param("max_output_tokens"))
            }
        },
    };
    let number =
        |field: &str, default: f64| obj.get(field).and_then(Value::as_f64).unwrap_or(default);
    Ok(ResponsesRequest {
        model: string("model")?,
        prompt: tokenizer::encode(&chat_template(&messages)),
        max_output_tokens,
        stream: obj.get("stream").and_then(Value::as_bool).unwrap_or(false),
        instructions,
        metadata: obj.get("metadata").cloned().unwrap_or(Value::Null),
        temperature: number("temperature", 1.0),
        top_p: number("top_p", 1.0),
        user: string("user")?,
    })
}

/// `input`: a string (one user message) or a list of items with a role and a content
/// (a string, or parts with a `text`).
fn input_messages(obj: &Map<String, Value>, out: &mut Vec<Message>) -> Result<(), ApiError> {
    match obj.get("input") {
        Some(Value::String(s)) => out.push(Message {
            role: "user".into(),
            text: s.clone(),
        }),
        Some(Value::Array(items)) => {
            for item in items {
                let Value::Object(item) = item else {
                    return Err(ApiError::bad_request("each input item must be an object")
                        .with_param("input"));
                };
                let text = match item.get("content").or_else(|| item.get("output")) {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => parts
                        .iter()
                        .filter_map(|p| p.get("text").and_then(Value::as_str))
                        .collect(),
                    _ => String::new(),
                };
                let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
                out.push(Message {
                    role: role.to_string(),
                    text,
                });
            }
        }
        None | Some(Value::Null) => {
            return Err(ApiError::bad_request("Field required: `input`").with_param("input"))
        }
        Some(_) => {
            return Err(
                ApiError::bad_request("input must be a string or a list of items")
                    .with_param("input"),
            )
        }
    }
    Ok(())
}

/// What a response object says besides its output: from the request and the server.
#[derive(Clone, Debug, PartialEq)]
pub struct ResponseMeta {
    /// `resp_…`
    pub id: String,
    /// `msg_…`, the id of the output message.
    pub item_id: String,
    pub created_at: u64,
    pub model: String,
    /// The effective limit: `max_output_tokens`, or what the context window leaves.
    pub max_output_tokens: u64,
    pub instructions: Option<String>,
    pub metadata: Value,
    pub temperature: f64,
    pub top_p: f64,
    pub user: Option<String>,
}

/// The output message item.
fn message_item(meta: &ResponseMeta, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" {
        json!([])
    } else {
        json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}])
    };
    json!({"id": meta.item_id, "type": "message", "role": "assistant", "status": status,
           "content": content})
}

/// The response object. `finished` is `None` while the request runs (`in_progress`,
/// no output, no usage); `Length` makes it `incomplete` (`max_output_tokens`).
pub fn response_object(
    meta: &ResponseMeta,
    text: &str,
    finished: Option<(FinishReason, &Usage)>,
) -> Value {
    let (status, output, usage) = match finished {
        None => ("in_progress", json!([]), Value::Null),
        Some((reason, usage)) => {
            let status = if reason == FinishReason::Length {
                "incomplete"
            } else {
                "completed"
            };
            let usage = json!({
                "input_tokens": usage.prompt_tokens,
                "input_tokens_details": {"cached_tokens": usage.cached_tokens},
                "output_tokens": usage.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage.total_tokens(),
            });
            (
                status,
                json!([message_item(meta, text, "completed")]),
                usage,
            )
        }
    };
    let incomplete = if status == "incomplete" {
        json!({"reason": "max_output_tokens"})
    } else {
        Value::Null
    };
    json!({
        "id": meta.id,
        "created_at": meta.created_at,
        "incomplete_details": incomplete,
        "instructions": meta.instructions,
        "metadata": meta.metadata,
        "model": meta.model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": true,
        "temperature": meta.temperature,
        "tool_choice": "auto",
        "tools": [],
        "top_p": meta.top_p,
        "background": false,
        "max_output_tokens": meta.max_output_tokens,
        "max_tool_calls": null,
        "previous_response_id": null,
        "prompt": null,
        "reasoning": null,
        "service_tier": "auto",
        "status": status,
        "text": null,
        "top_logprobs": null,
        "truncation": "disabled",
        "usage": usage,
        "user": meta.user,
    })
}

/// The streamed events of one response, from the engine's events:
/// `response.created`, `response.in_progress`, then with the first token
/// `response.output_item.added` and `response.content_part.added`, one
/// `response.output_text.delta` per token, and at the end `response.output_text.done`,
/// `response.content_part.done`, `response.output_item.done` and `response.completed`.
#[derive(Clone, Debug)]
pub struct ResponsesEncoder {
    meta: ResponseMeta,
    sequence: u64,
    text: String,
    item_open: bool,
    done: bool,
}

impl ResponsesEncoder {
    pub fn new(meta: ResponseMeta) -> Self {
        ResponsesEncoder {
            meta,
            sequence: 0,
            text: String::new(),
            item_open: false,
            done: false,
        }
    }

    fn emit(&mut self, out: &mut String, kind: &str, mut event: Value) {
        if let Value::Object(o) = &mut event {
            o.insert("type".into(), json!(kind));
            o.insert("sequence_number".into(), json!(self.sequence));
        }
        self.sequence += 1;
        let _ = write!(out, "event: {kind}\ndata: {event}\n\n");
    }

    fn open_item(&mut self, out: &mut String) {
        if self.item_open {
            return;
        }
        self.item_open = true;
        let item = message_item(&self.meta, "", "in_progress");
        self.emit(
            out,
            "response.output_item.added",
            json!({"output_index": 0, "item": item}),
        );
        let part = json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
        self.emit(
            out,
            "response.content_part.added",
            json!({"output_index": 0, "item_id": self.meta.item_id, "content_index": 0,
                   "part": part}),
        );
    }
}

impl StreamEncoder for ResponsesEncoder {
    fn start(&mut self, out: &mut String) {
        let response = response_object(&self.meta, "", None);
        self.emit(out, "response.created", json!({"response": response}));
        self.emit(out, "response.in_progress", json!({"response": response}));
    }

    fn event(&mut self, out: &mut String, routed: Routed) {
        if self.done || routed.choice != 0 {
            return;
        }
        self.open_item(out);
        let item_id = self.meta.item_id.clone();
        match routed.kind {
            EventKind::Token { text, .. } => {
                self.text.push_str(text);
                self.emit(
                    out,
                    "response.output_text.delta",
                    json!({"item_id": item_id, "output_index": 0, "content_index": 0,
                           "delta": text, "logprobs": []}),
                );
            }
            EventKind::Finished(f) => {
                let text = std::mem::take(&mut self.text);
                self.emit(
                    out,
                    "response.output_text.done",
                    json!({"item_id": item_id, "output_index": 0, "content_index": 0,
                           "text": text, "logprobs": []}),
                );
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                self.emit(
                    out,
                    "response.content_part.done",
                    json!({"item_id": item_id, "output_index": 0, "content_index": 0,
                           "part": part}),
                );
                let item = message_item(&self.meta, &text, "completed");
                self.emit(
                    out,
                    "response.output_item.done",
                    json!({"output_index": 0, "item": item}),
                );
                let response = response_object(&self.meta, &text, Some((f.reason, &f.usage)));
                self.emit(out, "response.completed", json!({"response": response}));
                self.done = true;
            }
        }
    }

    fn aborted(&mut self, out: &mut String) {
        if self.done {
            return;
        }
        let error = ApiError::new(500, "request aborted");
        self.emit(
            out,
            "error",
            json!({"code": ApiError::error_type(error.status), "message": error.message,
                   "param": null}),
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

    fn meta() -> ResponseMeta {
        ResponseMeta {
            id: "resp_1".into(),
            item_id: "msg_1".into(),
            created_at: 7,
            model: "m".into(),
            max_output_tokens: 5,
            instructions: Some("Be brief.".into()),
            metadata: Value::Null,
            temperature: 1.0,
            top_p: 1.0,
            user: None,
        }
    }

    #[test]
    fn input_forms_render_like_chat_and_input_is_required() {
        let a = parse(br#"{"model":"m","input":"hello","instructions":"Be brief."}"#).unwrap();
        assert_eq!(
            a.prompt,
            tokenizer::encode("<|system|>\nBe brief.\n<|user|>\nhello\n<|assistant|>\n")
        );
        let b = parse(br#"{"input":[{"role":"user","content":[{"type":"input_text","text":"hello"}]}],"max_output_tokens":9,"stream":true}"#).unwrap();
        assert_eq!(
            b.prompt,
            tokenizer::encode("<|user|>\nhello\n<|assistant|>\n")
        );
        assert_eq!(b.max_output_tokens, Some(9));
        assert!(b.stream);
        let e = parse(br#"{"model":"m"}"#).unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (400, Some("input")));
        assert_eq!(parse(br#"{"input":3}"#).unwrap_err().status, 400);
        assert_eq!(
            parse(br#"{"input":"x","max_output_tokens":0}"#)
                .unwrap_err()
                .status,
            400
        );
    }

    #[test]
    fn the_response_object_is_completed_or_incomplete() {
        let usage = Usage {
            prompt_tokens: 4,
            completion_tokens: 2,
            cached_tokens: 0,
        };
        let v = response_object(&meta(), "hi there", Some((FinishReason::Stop, &usage)));
        assert_eq!(v["object"], "response");
        assert_eq!(v["status"], "completed");
        assert_eq!(v["output"][0]["type"], "message");
        assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
        assert_eq!(v["output"][0]["content"][0]["text"], "hi there");
        assert_eq!(v["usage"]["input_tokens"], 4);
        assert_eq!(v["usage"]["output_tokens"], 2);
        assert_eq!(v["usage"]["total_tokens"], 6);
        let v = response_object(&meta(), "x", Some((FinishReason::Length, &usage)));
        assert_eq!(v["status"], "incomplete");
        assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    }

    #[test]
    fn streamed_events_come_in_order_with_sequence_numbers() {
        let mut e = ResponsesEncoder::new(meta());
        let mut out = String::new();
        e.start(&mut out);
        for text in [" a", " b"] {
            let kind = EventKind::Token { index: 0, text };
            e.event(&mut out, Routed { choice: 0, kind });
        }
        let f = Finished {
            reason: FinishReason::Stop,
            usage: Usage {
                prompt_tokens: 3,
                completion_tokens: 2,
                cached_tokens: 0,
            },
            timings: Timings::default(),
        };
        e.event(
            &mut out,
            Routed {
                choice: 0,
                kind: EventKind::Finished(f),
            },
        );
        assert!(e.is_done());
        let frames: Vec<(&str, Value)> = out
            .split("\n\n")
            .filter(|f| !f.is_empty())
            .map(|f| {
                let (event, data) = f.split_once('\n').unwrap();
                let kind = event.strip_prefix("event: ").unwrap();
                let data: Value =
                    serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(data["type"], kind);
                (kind, data)
            })
            .collect();
        let kinds: Vec<&str> = frames.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, (_, d)) in frames.iter().enumerate() {
            assert_eq!(d["sequence_number"], i);
        }
        assert_eq!(frames[0].1["response"]["status"], "in_progress");
        assert_eq!(frames[5].1["delta"], " b");
        assert_eq!(frames[6].1["text"], " a b");
        let done = &frames[9].1["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(done["output"][0]["content"][0]["text"], " a b");
        assert_eq!(done["usage"]["output_tokens"], 2);
    }
}
