//! Parsing of OpenAI-style inference requests (`/v1/completions`, `/v1/chat/completions`).
//!
//! Only what routing needs is kept: the model, whether the response streams, and the
//! prompt text (for prefix-cache affinity and token estimates). Validation follows
//! the reference's OpenAI parser: the API comes from the path suffix, `model` is
//! required, completions need `prompt`, chat needs at least one message.

use crate::errors::ApiError;
use serde_json::Value;

/// The request parser's type name in `EndpointPickerConfig` (the only parser).
pub const PARSER_TYPE: &str = "openai-parser";

/// Which OpenAI API a request targets, from the suffix of its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/completions` (also the default for unknown paths, as in the reference).
    Completions,
    /// `/v1/chat/completions`.
    ChatCompletions,
}

impl Api {
    /// Classifies a request path; the query string is ignored.
    pub fn from_path(path: &str) -> Api {
        let path = path.split('?').next().unwrap_or(path);
        if path.ends_with("/chat/completions") {
            Api::ChatCompletions
        } else {
            Api::Completions
        }
    }
}

/// The parts of an inference request the picker uses.
#[derive(Debug, Clone, PartialEq)]
pub struct InferenceRequest {
    /// The API the request targets.
    pub api: Api,
    /// The `model` field.
    pub model: String,
    /// `stream: true`.
    pub stream: bool,
    /// The prompt flattened to text: the prompt string(s), or every message's content
    /// as `role: content` lines.
    pub prompt: String,
    /// `max_tokens` / `max_completion_tokens`, when given.
    pub max_tokens: Option<u64>,
    /// `cache_salt`, when given (it scopes prefix-cache hashes).
    pub cache_salt: Option<String>,
}

/// Parses a request body for `api`. Errors are the 400s a client should see.
pub fn parse_request(api: Api, body: &[u8]) -> Result<InferenceRequest, ApiError> {
    let doc: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("request body is not valid JSON: {e}"), None))?;
    let obj = doc
        .as_object()
        .ok_or_else(|| ApiError::bad_request("request body must be a JSON object", None))?;
    let model = match obj.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        Some(Value::String(_)) => {
            return Err(ApiError::bad_request(
                "`model` must not be empty",
                Some("model"),
            ))
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "`model` must be a string",
                Some("model"),
            ))
        }
        None => {
            return Err(ApiError::bad_request(
                "missing required field `model`",
                Some("model"),
            ))
        }
    };
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::bad_request(
                "`stream` must be a boolean",
                Some("stream"),
            ))
        }
    };
    let max_tokens = match obj
        .get("max_tokens")
        .or_else(|| obj.get("max_completion_tokens"))
    {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| {
            ApiError::bad_request(
                "`max_tokens` must be a non-negative integer",
                Some("max_tokens"),
            )
        })?),
    };
    let prompt = match api {
        Api::Completions => completion_prompt(obj.get("prompt"))?,
        Api::ChatCompletions => chat_prompt(obj.get("messages"))?,
    };
    let cache_salt = obj
        .get("cache_salt")
        .and_then(Value::as_str)
        .map(str::to_string);
    Ok(InferenceRequest {
        api,
        model,
        stream,
        prompt,
        max_tokens,
        cache_salt,
    })
}

fn completion_prompt(v: Option<&Value>) -> Result<String, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "`prompt` must be a string or a list of strings",
            Some("prompt"),
        )
    };
    match v {
        None | Some(Value::Null) => Err(ApiError::bad_request(
            "missing required field `prompt`",
            Some("prompt"),
        )),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(items)) => {
            let mut out = String::new();
            for item in items {
                match item {
                    Value::String(s) => out.push_str(s),
                    // Token-id prompts: keep the ids as text so equal prompts hash equally.
                    Value::Number(n) => {
                        out.push_str(&n.to_string());
                        out.push(' ');
                    }
                    _ => return Err(bad()),
                }
            }
            Ok(out)
        }
        Some(_) => Err(bad()),
    }
}

fn chat_prompt(v: Option<&Value>) -> Result<String, ApiError> {
    let messages = match v {
        Some(Value::Array(m)) if !m.is_empty() => m,
        Some(Value::Array(_)) | None | Some(Value::Null) => {
            return Err(ApiError::bad_request(
                "`messages` must hold at least one message",
                Some("messages"),
            ))
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "`messages` must be a list",
                Some("messages"),
            ))
        }
    };
    let mut out = String::new();
    for message in messages {
        let obj = message.as_object().ok_or_else(|| {
            ApiError::bad_request("each message must be an object", Some("messages"))
        })?;
        let role = obj.get("role").and_then(Value::as_str).unwrap_or("");
        out.push_str(role);
        out.push_str(": ");
        match obj.get("content") {
            Some(Value::String(s)) => out.push_str(s),
            // Content parts: keep the text parts, in order.
            Some(Value::Array(parts)) => {
                for part in parts {
                    if let Some(text) = part.get("text").and_then(Value::as_str) {
                        out.push_str(text);
                    }
                }
            }
            _ => {}
        }
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn api_comes_from_the_path_suffix() {
        assert_eq!(Api::from_path("/v1/chat/completions"), Api::ChatCompletions);
        assert_eq!(
            Api::from_path("/v1/chat/completions?x=1"),
            Api::ChatCompletions
        );
        assert_eq!(Api::from_path("/v1/completions"), Api::Completions);
        assert_eq!(Api::from_path("/other"), Api::Completions);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn parses_a_completion() {
        let r = parse_request(
            Api::Completions,
            br#"{"model":"m","prompt":"hello","stream":true,"max_tokens":7}"#,
        )
        .unwrap();
        assert_eq!(r.model, "m");
        assert!(r.stream);
        assert_eq!(r.prompt, "hello");
        assert_eq!(r.max_tokens, Some(7));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn parses_a_chat_request_with_content_parts() {
        let r = parse_request(
            Api::ChatCompletions,
            br#"{"model":"m","messages":[{"role":"system","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"hi"}]}]}"#,
        )
        .unwrap();
        assert!(!r.stream);
        assert_eq!(r.prompt, "system: be brief\nuser: hi\n");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn list_prompts_are_joined() {
        let r = parse_request(Api::Completions, br#"{"model":"m","prompt":["a","b"]}"#).unwrap();
        assert_eq!(r.prompt, "ab");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn malformed_requests_are_400_naming_the_field() {
        let cases: [(Api, &[u8], Option<&str>); 7] = [
            (Api::Completions, b"{not json", None),
            (Api::Completions, b"[]", None),
            (Api::Completions, br#"{"prompt":"x"}"#, Some("model")),
            (
                Api::Completions,
                br#"{"model":3,"prompt":"x"}"#,
                Some("model"),
            ),
            (Api::Completions, br#"{"model":"m"}"#, Some("prompt")),
            (
                Api::ChatCompletions,
                br#"{"model":"m","messages":[]}"#,
                Some("messages"),
            ),
            (
                Api::Completions,
                br#"{"model":"m","prompt":"x","stream":"yes"}"#,
                Some("stream"),
            ),
        ];
        for (api, body, param) in cases {
            let e = parse_request(api, body).unwrap_err();
            assert_eq!(e.status, 400);
            assert_eq!(e.param, param, "{}", String::from_utf8_lossy(body));
        }
    }
}
