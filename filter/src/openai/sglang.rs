//! SGLang's native `/generate`: `input_ids` (one prompt's ids, or a batch's lists) or
//! `text` (a string or a list), `sampling_params.max_new_tokens`, `stream`, `extra_key`
//! (SGLang's cache salt). Never refused by the gateway (SGLang answers what it finds
//! wrong): a body it cannot read is routed by load.
//!
//! Its response reports `meta_info.prompt_tokens` and `meta_info.cached_tokens` (the last
//! streamed chunk too), which the usage scan reads like OpenAI's `usage`.

use super::json::{self, Json};
use super::{text_of, InferenceRequest};
use std::borrow::Cow;

/// The top-level fields a `/generate` request is parsed for.
pub fn routed(key: &str) -> bool {
    matches!(
        key,
        "model" | "stream" | "input_ids" | "text" | "sampling_params" | "extra_key"
    )
}

/// Reads what routing can use from a `/generate` body.
pub fn parse(r: &mut InferenceRequest<'_>, body: &[u8]) {
    let Ok(json::Body(Some(obj))) = json::parse_keeping(body, routed) else {
        return;
    };
    if let Some(Json::Str(m)) = obj.get("model") {
        r.model = m.to_string();
    }
    r.stream = obj.get("stream").and_then(Json::as_bool).unwrap_or(false);
    let mut prompt = String::new();
    if let Some(ids) = obj.get("input_ids") {
        text_of(ids, &mut prompt);
    } else if let Some(text) = obj.get("text") {
        text_of(text, &mut prompt);
    }
    r.prompt = Cow::Owned(prompt);
    r.max_tokens = obj
        .get("sampling_params")
        .and_then(|s| s.get("max_new_tokens"))
        .and_then(Json::as_u64);
    r.cache_salt = obj
        .get("extra_key")
        .and_then(Json::as_str)
        .map(str::to_string);
    // `meta_info` ends the body, and the last chunk of a stream.
    r.usage_expected = true;
}

#[cfg(test)]
mod tests {
    use super::super::{parse_request, Api};
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn input_ids_or_text_are_the_prompt_and_nothing_is_refused() {
        let r = parse_request(
            Api::SglangGenerate,
            br#"{"input_ids":[1,2,3],"sampling_params":{"max_new_tokens":8},"stream":true,"extra_key":"k"}"#,
        )
        .unwrap();
        assert_eq!(r.prompt, "1 2 3 ");
        assert_eq!(r.max_tokens, Some(8));
        assert!(r.stream);
        assert_eq!(r.cache_salt.as_deref(), Some("k"));
        let t = parse_request(Api::SglangGenerate, br#"{"text":"hello"}"#).unwrap();
        assert_eq!(t.prompt, "hello");
        for body in [&b"not json"[..], b"{}", b"[1]", b""] {
            let r = parse_request(Api::SglangGenerate, body).unwrap();
            assert_eq!(r.prompt, "");
        }
    }
}
