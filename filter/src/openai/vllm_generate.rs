//! vLLM's token-in API, `/inference/v1/generate`: `token_ids` (required, as the
//! reference's `vllmhttp-parser` requires them), `sampling_params.max_tokens`, `model`
//! (optional), `stream`, `stream_options.include_usage`, `cache_salt`.
//!
//! The prompt for prefix affinity is the token ids as text (`"1 2 3 "`), so a conversation
//! whose ids grow turn by turn keeps its prefix; its response has OpenAI's `usage`.

use super::json::Json;
use super::{stream_flag, InferenceRequest};
use crate::errors::ApiError;
use std::borrow::Cow;

/// The top-level fields a generate request is parsed for.
pub fn routed(key: &str) -> bool {
    matches!(
        key,
        "model" | "stream" | "stream_options" | "token_ids" | "sampling_params" | "cache_salt"
    )
}

/// Parses a `/inference/v1/generate` body.
pub fn parse<'a>(obj: &Json<'a>, r: &mut InferenceRequest<'a>) -> Result<(), ApiError> {
    match obj.get("model") {
        None | Some(Json::Null) => {}
        Some(Json::Str(m)) => r.model = m.to_string(),
        Some(_) => {
            return Err(ApiError::bad_request(
                "`model` must be a string",
                Some("model"),
            ))
        }
    }
    r.stream = stream_flag(obj)?;
    let bad = || {
        ApiError::bad_request(
            "`token_ids` must be a non-empty list of token ids",
            Some("token_ids"),
        )
    };
    let ids = match obj.get("token_ids") {
        Some(Json::Array(ids)) if !ids.is_empty() => ids,
        _ => return Err(bad()),
    };
    let mut prompt = String::with_capacity(ids.len() * 6);
    for id in ids {
        let n = id.as_u64().ok_or_else(bad)?;
        prompt.push_str(&n.to_string());
        prompt.push(' ');
    }
    r.prompt = Cow::Owned(prompt);
    r.max_tokens = obj
        .get("sampling_params")
        .and_then(|s| s.get("max_tokens"))
        .and_then(Json::as_u64);
    let include_usage = obj
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Json::as_bool)
        .unwrap_or(false);
    r.usage_expected = !r.stream || include_usage;
    r.cache_salt = obj
        .get("cache_salt")
        .and_then(Json::as_str)
        .map(str::to_string);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{parse_request, Api};
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn the_token_ids_are_the_prompt() {
        let r = parse_request(
            Api::Generate,
            br#"{"model":"m","token_ids":[101,7,42],"sampling_params":{"max_tokens":5,"temperature":0},
                "stream":true,"stream_options":{"include_usage":true},"cache_salt":"s"}"#,
        )
        .unwrap();
        assert_eq!(r.prompt, "101 7 42 ");
        assert_eq!(r.max_tokens, Some(5));
        assert!(r.stream && r.usage_expected);
        assert_eq!(r.cache_salt.as_deref(), Some("s"));
        // Growing ids keep the prefix.
        let longer = parse_request(
            Api::Generate,
            br#"{"token_ids":[101,7,42,9],"sampling_params":{}}"#,
        )
        .unwrap();
        assert!(longer.prompt.starts_with(r.prompt.as_ref()));
        assert_eq!(longer.model, "");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_generate_request_without_token_ids_is_400() {
        for body in [
            &br#"{"model":"m","sampling_params":{}}"#[..],
            br#"{"token_ids":[]}"#,
            br#"{"token_ids":["a"]}"#,
            br#"{"token_ids":[-1]}"#,
        ] {
            let e = parse_request(Api::Generate, body).unwrap_err();
            assert_eq!((e.status, e.param), (400, Some("token_ids")));
        }
        let e = parse_request(Api::Generate, b"[").unwrap_err();
        assert_eq!(e.status, 400);
    }
}
