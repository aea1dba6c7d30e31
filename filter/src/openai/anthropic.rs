//! Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`), which vLLM
//! serves by turning it into a chat request.
//!
//! A message request is validated like a chat request (`model` and at least one message
//! required); its prompt is what the server's chat template renders first: the system
//! text (`system`, a string or text blocks, then any `system` message, joined as vLLM
//! joins them), the tools (name, description and input schema, which vLLM's templates put
//! with the system text), then every message's text (a string or content blocks: text,
//! tool results, tool uses), as chat `role: content` lines. `count_tokens` is routed by
//! load: it computes nothing the prefix cache keeps.
//!
//! The response's `usage` is `input_tokens` and `cache_read_input_tokens` (streamed: in the
//! `message_start` event; `message_delta` at the end repeats `input_tokens`), read by the
//! same window scan as OpenAI's `prompt_tokens` and `cached_tokens`.

use super::json::Json;
use super::{max_tokens, message_list, required_model, stream_flag, InferenceRequest};
use crate::errors::ApiError;
use std::borrow::Cow;

/// The top-level fields a Messages request is parsed for.
pub fn routed(key: &str) -> bool {
    matches!(
        key,
        "model" | "stream" | "max_tokens" | "messages" | "system" | "tools"
    )
}

/// Parses a `/v1/messages` body.
pub fn parse_messages<'a>(obj: &Json<'a>, r: &mut InferenceRequest<'a>) -> Result<(), ApiError> {
    r.model = required_model(obj)?;
    r.stream = stream_flag(obj)?;
    r.max_tokens = max_tokens(obj.get("max_tokens"))?;
    let messages = message_list(obj.get("messages"))?;
    r.prompt = Cow::Owned(render(obj, messages, &mut r.chat));
    // Not streamed: the body ends with `usage`; streamed: `message_start` carries it.
    r.usage_expected = true;
    Ok(())
}

/// The conversation as chat `role: content` lines, with `spans` for each message (see
/// [`InferenceRequest::messages`]).
fn render(obj: &Json, messages: &[Json], spans: &mut Vec<(u32, u32)>) -> String {
    let mut system = String::new();
    if let Some(s) = obj.get("system") {
        blocks_text(s, &mut system);
    }
    for m in messages {
        if m.get("role").and_then(Json::as_str) == Some("system") {
            if let Some(c) = m.get("content") {
                blocks_text(c, &mut system);
            }
        }
    }
    if let Some(Json::Array(tools)) = obj.get("tools") {
        for t in tools {
            for field in ["name", "description"] {
                if let Some(Json::Str(s)) = t.get(field) {
                    system.push_str(s);
                    system.push('\n');
                }
            }
            if let Some(schema) = t.get("input_schema") {
                value_text(schema, &mut system);
                system.push('\n');
            }
        }
    }
    let mut out = String::new();
    let mut push = |role: &str, content: &str, out: &mut String| {
        let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        out.push_str(role);
        out.push_str(": ");
        out.push_str(content);
        out.push('\n');
        spans.push((len(role.len()), len(content.len())));
    };
    if !system.is_empty() {
        push("system", &system, &mut out);
    }
    let mut content = String::new();
    for m in messages {
        let role = m.get("role").and_then(Json::as_str).unwrap_or("");
        if role == "system" {
            continue;
        }
        content.clear();
        if let Some(c) = m.get("content") {
            blocks_text(c, &mut content);
        }
        push(role, &content, &mut out);
    }
    out
}

/// The text of a content value: a string, or blocks whose `text` (text), `content`
/// (tool results), `thinking`, or `name` and `input` (tool uses) are kept in order.
fn blocks_text(v: &Json, out: &mut String) {
    match v {
        Json::Str(s) => out.push_str(s),
        Json::Array(blocks) => {
            for b in blocks {
                match b {
                    Json::Str(s) => out.push_str(s),
                    Json::Object(_) => {
                        for field in ["text", "thinking", "name"] {
                            if let Some(Json::Str(s)) = b.get(field) {
                                out.push_str(s);
                            }
                        }
                        if let Some(c) = b.get("content") {
                            blocks_text(c, out);
                        }
                        if let Some(i) = b.get("input") {
                            value_text(i, out);
                        }
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

/// Every string and number of a value, keys included, in body order (so equal schemas and
/// tool inputs give equal text).
fn value_text(v: &Json, out: &mut String) {
    match v {
        Json::Str(s) => out.push_str(s),
        Json::Number(n) => out.push_str(&n.to_string()),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Null => {}
        Json::Array(items) => items.iter().for_each(|i| {
            value_text(i, out);
            out.push(' ');
        }),
        Json::Object(pairs) => pairs.iter().for_each(|(k, v)| {
            out.push_str(k);
            out.push(':');
            value_text(v, out);
            out.push(' ');
        }),
    }
}

/// The Anthropic error type of an HTTP status the gateway answers with.
pub fn error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

#[cfg(test)]
mod tests {
    use super::super::{parse_request, Api};
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn a_message_request_gives_system_tools_and_messages_in_order() {
        let r = parse_request(
            Api::Messages,
            br#"{"model":"claude","max_tokens":64,"stream":true,
                "system":[{"type":"text","text":"be brief"}],
                "tools":[{"name":"get_weather","description":"weather",
                          "input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],
                "metadata":{"user_id":"u"},
                "messages":[{"role":"user","content":"hi"},
                    {"role":"assistant","content":[{"type":"text","text":"hello"},
                        {"type":"tool_use","id":"t1","name":"get_weather","input":{"city":"Paris"}}]},
                    {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"sunny"}]}]}"#,
        )
        .unwrap();
        assert_eq!(r.model, "claude");
        assert!(r.stream);
        assert_eq!(r.max_tokens, Some(64));
        assert!(r.usage_expected);
        let m: Vec<_> = r.messages().collect();
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].0, "system");
        assert!(m[0].1.starts_with("be brief"));
        assert!(m[0].1.contains("get_weather\nweather\n"), "{}", m[0].1);
        assert!(m[0].1.contains("city"));
        assert_eq!(m[1], ("user", "hi"));
        assert_eq!(m[2], ("assistant", "helloget_weathercity:Paris "));
        assert_eq!(m[3], ("user", "sunny"));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_longer_conversation_extends_the_shorter_ones_prompt() {
        let one = parse_request(
            Api::Messages,
            br#"{"model":"m","system":"sys","messages":[{"role":"user","content":"q1"}]}"#,
        )
        .unwrap();
        let two = parse_request(
            Api::Messages,
            br#"{"model":"m","system":"sys","messages":[{"role":"user","content":"q1"},
                {"role":"assistant","content":"a1"},{"role":"user","content":"q2"}]}"#,
        )
        .unwrap();
        assert!(two.prompt.starts_with(one.prompt.as_ref()));
        assert_eq!(one.prompt, "system: sys\nuser: q1\n");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn malformed_message_requests_are_400_naming_the_field() {
        let cases: [(&[u8], Option<&str>); 6] = [
            (b"{not json", None),
            (
                br#"{"messages":[{"role":"user","content":"x"}]}"#,
                Some("model"),
            ),
            (br#"{"model":"m","messages":[]}"#, Some("messages")),
            (br#"{"model":"m","messages":"x"}"#, Some("messages")),
            (br#"{"model":"m","messages":[1]}"#, Some("messages")),
            (
                br#"{"model":"m","stream":1,"messages":[{"role":"user","content":"x"}]}"#,
                Some("stream"),
            ),
        ];
        for (body, param) in cases {
            let e = parse_request(Api::Messages, body).unwrap_err();
            assert_eq!(
                (e.status, e.param),
                (400, param),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn count_tokens_is_routed_by_load_and_never_refused() {
        let r = parse_request(
            Api::CountTokens,
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        )
        .unwrap();
        assert_eq!((r.model.as_str(), r.prompt.as_ref()), ("m", ""));
        assert!(!r.usage_expected);
        assert!(parse_request(Api::CountTokens, b"nonsense").is_ok());
    }
}
