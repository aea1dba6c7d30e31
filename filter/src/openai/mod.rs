//! Parsing of request bodies, one file per API beside the path → parser table
//! ([`parsers`]): the OpenAI APIs (`/v1/completions`, `/v1/chat/completions`,
//! `/v1/responses`, `/v1/embeddings`, conversations, audio, the render paths) and vLLM's
//! pooling and tokenizer APIs (`/rerank`, `/score`, `/pooling`, `/classify`, `/tokenize`,
//! `/detokenize`) here; Anthropic's Messages ([`anthropic`]); vLLM's token-in generate
//! ([`vllm_generate`]); SGLang's `/generate` ([`sglang`]); any other path passed through.
//!
//! Only what routing needs is kept: the model, whether the response streams, and the
//! prompt text (for prefix-cache affinity and token estimates). Generative APIs are
//! validated as the reference's parsers do (`model` required, completions need `prompt`,
//! chat and messages need a message, a response needs `input`, generate needs
//! `token_ids`); the other APIs are never refused by the gateway: their prompt text is
//! extracted where there is one (embeddings, rerank, score, pooling, tokenize, SGLang,
//! a passed-through body with `prompt`, `messages` or `input`) and they are routed by load
//! otherwise (conversations, detokenize, render, count_tokens, multipart audio), with the
//! server answering what it finds wrong.

pub mod anthropic;
pub mod json;
pub mod multimodal;
pub mod parsers;
pub mod scan;
pub mod sglang;
pub mod vllm_generate;

use crate::errors::ApiError;
use json::Json;
use std::borrow::Cow;

/// The OpenAI request parser's type name in `EndpointPickerConfig`.
pub const PARSER_TYPE: &str = "openai-parser";

/// Which API a request targets, from its path ([`parsers::Parsers::resolve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    ChatCompletions,
    /// `/v1/responses` (OpenAI Responses API).
    Responses,
    /// `/v1/conversations` and its items.
    Conversations,
    /// `/v1/embeddings`.
    Embeddings,
    /// `/rerank`, `/v1/rerank`, `/v2/rerank`.
    Rerank,
    /// `/score`, `/v1/score`.
    Score,
    /// `/pooling`, `/classify`.
    Pooling,
    /// `/tokenize`.
    Tokenize,
    /// `/detokenize`.
    Detokenize,
    /// `/v1/audio/transcriptions`, `/v1/audio/translations` (multipart bodies).
    Audio,
    /// `/v1/chat/completions/render`, `/v1/completions/render`: routed by load.
    Render,
    /// Anthropic's `/v1/messages`.
    Messages,
    /// Anthropic's `/v1/messages/count_tokens`: routed by load.
    CountTokens,
    /// vLLM's `/inference/v1/generate` (token ids in).
    Generate,
    /// SGLang's `/generate`.
    SglangGenerate,
    /// A path no parser claims, passed through (`passthrough-parser`).
    Passthrough,
}

impl Api {
    /// The API of a path with the default parsers; the query string is ignored.
    pub fn from_path(path: &str) -> Api {
        parsers::Parsers::default()
            .resolve(path)
            .unwrap_or(Api::Passthrough)
    }

    /// The OpenAI parser's claim on `path` (query and trailing `/` removed): the API and
    /// the length of the path's end that names it.
    fn openai_claim(path: &str) -> Option<(Api, usize)> {
        use parsers::suffix;
        for (s, api) in [
            ("chat/completions/render", Api::Render),
            ("completions/render", Api::Render),
            ("chat/completions", Api::ChatCompletions),
            ("completions", Api::Completions),
        ] {
            if let Some(n) = suffix(path, s) {
                return Some((api, n));
            }
        }
        // Byte-wise segment checks, not substring searches.
        let from = |at: usize| path.len() - at;
        let mut at = 0usize;
        let mut audio = None;
        let mut prefixed = None;
        for seg in path.split('/') {
            let rest = path.get(at..).unwrap_or("");
            let last = rest.len() == seg.len();
            if seg == "audio" && !last && audio.is_none() {
                audio = Some(from(at));
            }
            if prefixed.is_none() {
                if seg.starts_with("conversations") {
                    prefixed = Some((Api::Conversations, from(at)));
                } else if seg.starts_with("responses") {
                    prefixed = Some((Api::Responses, from(at)));
                }
            }
            at += seg.len() + 1;
        }
        if let Some(n) = audio {
            return Some((Api::Audio, n));
        }
        if prefixed.is_some() {
            return prefixed;
        }
        let last = path.rsplit_once('/').map_or(path, |(_, l)| l);
        let api = match last {
            "embeddings" => Api::Embeddings,
            "rerank" => Api::Rerank,
            "score" => Api::Score,
            "pooling" | "classify" => Api::Pooling,
            "tokenize" => Api::Tokenize,
            "detokenize" => Api::Detokenize,
            _ => return None,
        };
        Some((api, last.len()))
    }

    /// Whether the gateway validates the body (generative APIs, as the reference);
    /// the others are routed whatever their body, the server answers their errors.
    pub fn validated(self) -> bool {
        matches!(
            self,
            Api::Completions
                | Api::ChatCompletions
                | Api::Responses
                | Api::Messages
                | Api::Generate
        )
    }

    /// Whether errors the gateway answers on this API take Anthropic's shape.
    pub fn anthropic(self) -> bool {
        matches!(self, Api::Messages | Api::CountTokens)
    }
}

/// The parts of an inference request the picker uses (the prompt borrows the body when it
/// is one string without escapes).
#[derive(Debug, Clone, PartialEq)]
pub struct InferenceRequest<'a> {
    /// The API the request targets.
    pub api: Api,
    /// The `model` field.
    pub model: String,
    /// `stream: true`.
    pub stream: bool,
    /// The prompt flattened to text: the prompt string(s), or every message's content
    /// as `role: content` lines.
    pub prompt: Cow<'a, str>,
    /// Chat only: each message's role and content lengths (bytes) in `prompt`, so the
    /// conversation can be rendered again ([`InferenceRequest::messages`]).
    pub chat: Vec<(u32, u32)>,
    /// `max_tokens` / `max_completion_tokens`, when given.
    pub max_tokens: Option<u64>,
    /// `cache_salt`, when given (it scopes prefix-cache hashes).
    pub cache_salt: Option<String>,
    /// The response ends with `usage`: not streamed, streamed with
    /// `stream_options.include_usage`, or the Responses API (its `response.completed`).
    pub usage_expected: bool,
}

/// Parses a request body for `api`. Errors are the 400s a client should see; only the
/// generative APIs ([`Api::validated`]) have any.
pub fn parse_request(api: Api, body: &[u8]) -> Result<InferenceRequest<'_>, ApiError> {
    match api {
        Api::Completions | Api::ChatCompletions | Api::Responses => openai_request(api, body),
        Api::Messages => other_request(api, body, anthropic::routed, anthropic::parse_messages),
        Api::Generate => other_request(api, body, vllm_generate::routed, vllm_generate::parse),
        Api::SglangGenerate => {
            let mut r = InferenceRequest::empty(api);
            sglang::parse(&mut r, body);
            Ok(r)
        }
        _ => Ok(lenient(api, body)),
    }
}

/// The top-level object of a validated request's body, or the 400 a client should see.
fn object(doc: &json::Body<'_>) -> Result<(), ApiError> {
    doc.0
        .as_ref()
        .map(|_| ())
        .ok_or_else(|| ApiError::bad_request("request body must be a JSON object", None))
}

fn not_json(e: serde_json::Error) -> ApiError {
    ApiError::bad_request(format!("request body is not valid JSON: {e}"), None)
}

/// A validated request of an API with its own parser file: the body's fields `keep`
/// names, read by `read`.
fn other_request<'a>(
    api: Api,
    body: &'a [u8],
    keep: fn(&str) -> bool,
    read: fn(&Json<'a>, &mut InferenceRequest<'a>) -> Result<(), ApiError>,
) -> Result<InferenceRequest<'a>, ApiError> {
    let doc = json::parse_keeping(body, keep).map_err(not_json)?;
    object(&doc)?;
    let mut r = InferenceRequest::empty(api);
    if let Some(obj) = &doc.0 {
        read(obj, &mut r)?;
    }
    Ok(r)
}

/// `model`, required: a non-empty string.
pub(crate) fn required_model(obj: &Json) -> Result<String, ApiError> {
    match obj.get("model") {
        Some(Json::Str(m)) if !m.is_empty() => Ok(m.to_string()),
        Some(Json::Str(_)) => Err(ApiError::bad_request(
            "`model` must not be empty",
            Some("model"),
        )),
        Some(_) => Err(ApiError::bad_request(
            "`model` must be a string",
            Some("model"),
        )),
        None => Err(ApiError::bad_request(
            "missing required field `model`",
            Some("model"),
        )),
    }
}

/// `stream`, optional: a boolean (absent or `null`: not streamed).
pub(crate) fn stream_flag(obj: &Json) -> Result<bool, ApiError> {
    match obj.get("stream") {
        None | Some(Json::Null) => Ok(false),
        Some(Json::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::bad_request(
            "`stream` must be a boolean",
            Some("stream"),
        )),
    }
}

/// A token limit, optional: a non-negative integer (reported as `max_tokens`).
pub(crate) fn max_tokens(v: Option<&Json>) -> Result<Option<u64>, ApiError> {
    match v {
        None | Some(Json::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            ApiError::bad_request(
                "`max_tokens` must be a non-negative integer",
                Some("max_tokens"),
            )
        }),
    }
}

/// `messages`, required: a non-empty list of objects.
pub(crate) fn message_list<'j, 'a>(v: Option<&'j Json<'a>>) -> Result<&'j [Json<'a>], ApiError> {
    let messages = match v {
        Some(Json::Array(m)) if !m.is_empty() => m,
        Some(Json::Array(_)) | None | Some(Json::Null) => {
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
    if messages.iter().any(|m| !matches!(m, Json::Object(_))) {
        return Err(ApiError::bad_request(
            "each message must be an object",
            Some("messages"),
        ));
    }
    Ok(messages)
}

fn openai_request(api: Api, body: &[u8]) -> Result<InferenceRequest<'_>, ApiError> {
    let doc = json::parse(body).map_err(not_json)?;
    let Some(obj) = doc.0.as_ref() else {
        return Err(ApiError::bad_request(
            "request body must be a JSON object",
            None,
        ));
    };
    let model = required_model(obj)?;
    let stream = stream_flag(obj)?;
    let max_tokens = max_tokens(
        obj.get("max_tokens")
            .or_else(|| obj.get("max_completion_tokens"))
            .or_else(|| obj.get("max_output_tokens")),
    )?;
    let mut chat = Vec::new();
    let prompt = match api {
        Api::ChatCompletions => Cow::Owned(chat_prompt(obj.get("messages"), &mut chat)?),
        Api::Responses => Cow::Owned(responses_prompt(obj)?),
        _ => completion_prompt(obj.get("prompt"))?,
    };
    let include_usage = obj
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Json::as_bool)
        .unwrap_or(false);
    Ok(InferenceRequest {
        api,
        model,
        stream,
        prompt,
        chat,
        max_tokens,
        cache_salt: cache_salt(obj),
        usage_expected: !stream || include_usage || api == Api::Responses,
    })
}

fn cache_salt(obj: &Json) -> Option<String> {
    obj.get("cache_salt")
        .and_then(Json::as_str)
        .map(str::to_string)
}

impl InferenceRequest<'_> {
    /// A request of `api` with nothing read yet.
    pub fn empty(api: Api) -> Self {
        InferenceRequest {
            api,
            model: String::new(),
            stream: false,
            prompt: Cow::Borrowed(""),
            chat: Vec::new(),
            max_tokens: None,
            cache_salt: None,
            usage_expected: false,
        }
    }
}

/// A request of an API the gateway does not validate: whatever its body holds (a JSON
/// object or not), the model and the prompt text when they are there.
fn lenient(api: Api, body: &[u8]) -> InferenceRequest<'_> {
    let mut r = InferenceRequest::empty(api);
    if api == Api::Audio {
        return r; // multipart: routed by load
    }
    let Ok(json::Body(Some(obj))) = json::parse(body) else {
        return r;
    };
    if let Some(Json::Str(m)) = obj.get("model") {
        r.model = m.to_string();
    }
    r.stream = obj.get("stream").and_then(Json::as_bool).unwrap_or(false);
    r.cache_salt = cache_salt(&obj);
    let mut out = String::new();
    let fields: &[&str] = match api {
        Api::Embeddings | Api::Pooling => &["input", "messages"],
        Api::Rerank => &["query", "documents"],
        Api::Score => &["text_1", "text_2", "queries", "documents"],
        Api::Tokenize => &["prompt", "messages"],
        // A body the gateway has no parser for: the usual prompt fields, if present.
        Api::Passthrough => &["prompt", "messages", "input"],
        _ => &[],
    };
    for f in fields {
        if let Some(v) = obj.get(f) {
            if *f == "messages" {
                out.push_str(&chat_prompt(Some(v), &mut Vec::new()).unwrap_or_default());
            } else {
                text_of(v, &mut out);
            }
        }
    }
    r.prompt = Cow::Owned(out);
    r
}

/// The text in a value: strings as they are, token ids as numbers followed by a space
/// (so equal token prompts hash equally), lists in order, objects by their `text` or
/// `content` field.
pub(crate) fn text_of(v: &Json, out: &mut String) {
    match v {
        Json::Str(s) => out.push_str(s),
        Json::Number(n) => {
            out.push_str(&n.to_string());
            out.push(' ');
        }
        Json::Array(items) => items.iter().for_each(|i| text_of(i, out)),
        Json::Object(_) => {
            if let Some(t) = v.get("text").or_else(|| v.get("content")) {
                text_of(t, out);
            }
        }
        _ => {}
    }
}

/// The Responses API prompt: `instructions`, then `input` (a string, or items with a
/// role and content), as `role: content` lines like chat.
fn responses_prompt(obj: &Json) -> Result<String, ApiError> {
    let mut out = String::new();
    if let Some(Json::Str(i)) = obj.get("instructions") {
        out.push_str("system: ");
        out.push_str(i);
        out.push('\n');
    }
    match obj.get("input") {
        Some(Json::Str(s)) => {
            out.push_str("user: ");
            out.push_str(s);
            out.push('\n');
        }
        Some(Json::Array(items)) => {
            for item in items {
                let role = item.get("role").and_then(Json::as_str).unwrap_or("user");
                out.push_str(role);
                out.push_str(": ");
                match item {
                    Json::Object(_) => {
                        if let Some(c) = item.get("content") {
                            text_of(c, &mut out);
                        }
                    }
                    other => text_of(other, &mut out),
                }
                out.push('\n');
            }
        }
        None | Some(Json::Null) => {
            return Err(ApiError::bad_request(
                "missing required field `input`",
                Some("input"),
            ))
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "`input` must be a string or a list of items",
                Some("input"),
            ))
        }
    }
    Ok(out)
}

/// A completion's prompt: one string as the body holds it (no copy without escapes), or
/// the list's strings joined.
fn completion_prompt<'a>(v: Option<&Json<'a>>) -> Result<Cow<'a, str>, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "`prompt` must be a string or a list of strings",
            Some("prompt"),
        )
    };
    match v {
        None | Some(Json::Null) => Err(ApiError::bad_request(
            "missing required field `prompt`",
            Some("prompt"),
        )),
        Some(Json::Str(s)) => Ok(s.clone()),
        Some(Json::Array(items)) => {
            let mut out = String::new();
            for item in items {
                match item {
                    Json::Str(s) => out.push_str(s),
                    // Token-id prompts: keep the ids as text so equal prompts hash equally.
                    Json::Number(n) => {
                        out.push_str(&n.to_string());
                        out.push(' ');
                    }
                    _ => return Err(bad()),
                }
            }
            Ok(Cow::Owned(out))
        }
        Some(_) => Err(bad()),
    }
}

impl InferenceRequest<'_> {
    /// A chat request's `(role, content)` messages, read back from `prompt`.
    pub fn messages(&self) -> impl Iterator<Item = (&str, &str)> {
        let mut at = 0usize;
        self.chat.iter().filter_map(move |&(role, content)| {
            let (role, content) = (role as usize, content as usize);
            let r = self.prompt.get(at..at + role)?;
            let c = self.prompt.get(at + role + 2..at + role + 2 + content)?;
            at += role + 2 + content + 1;
            Some((r, c))
        })
    }
}

fn chat_prompt(v: Option<&Json>, spans: &mut Vec<(u32, u32)>) -> Result<String, ApiError> {
    let messages = message_list(v)?;
    let mut out = String::new();
    for message in messages {
        let role = message.get("role").and_then(Json::as_str).unwrap_or("");
        out.push_str(role);
        out.push_str(": ");
        let content_start = out.len();
        match message.get("content") {
            Some(Json::Str(s)) => out.push_str(s),
            // Content parts: keep the text parts, in order.
            Some(Json::Array(parts)) => {
                for part in parts {
                    if let Some(text) = part.get("text").and_then(Json::as_str) {
                        out.push_str(text);
                    }
                }
            }
            _ => {}
        }
        let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        spans.push((len(role.len()), len(out.len() - content_start)));
        out.push('\n');
    }
    Ok(out)
}

/// The number after the last `key` (a quoted JSON key, e.g. `"cached_tokens"`) in a piece
/// of a response: how the response path reads `usage` counts from the end of a body or of
/// a stream chunk without parsing the whole JSON.
pub fn usage_number(window: &[u8], key: &[u8]) -> Option<u64> {
    // The last occurrence: each position is told apart by two of the key's inner bytes
    // (its quotes are everywhere in JSON) before the whole key is compared.
    let n = key.len();
    let (i, j) = if n >= 3 {
        (1, n - 2)
    } else {
        (0, n.saturating_sub(1))
    };
    let (a, b) = (*key.get(i)?, *key.get(j)?);
    let at = (0..=window.len().checked_sub(n)?).rev().find(|&at| {
        window.get(at + i) == Some(&a)
            && window.get(at + j) == Some(&b)
            && window.get(at..at + n) == Some(key)
    })?;
    let rest = window.get(at + key.len()..)?;
    let digits: Vec<u8> = rest
        .iter()
        .skip_while(|b| b.is_ascii_whitespace() || **b == b':')
        .take_while(|b| b.is_ascii_digit())
        .copied()
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
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
        assert_eq!(Api::from_path("/other"), Api::Passthrough);
        for (path, api) in [
            ("/v1/responses", Api::Responses),
            ("/v1/conversations", Api::Conversations),
            ("/v1/conversations/c1/items", Api::Conversations),
            ("/v1/embeddings", Api::Embeddings),
            ("/rerank", Api::Rerank),
            ("/v1/rerank", Api::Rerank),
            ("/v2/rerank", Api::Rerank),
            ("/score", Api::Score),
            ("/v1/score", Api::Score),
            ("/pooling", Api::Pooling),
            ("/classify", Api::Pooling),
            ("/tokenize", Api::Tokenize),
            ("/detokenize", Api::Detokenize),
            ("/v1/audio/transcriptions", Api::Audio),
            ("/v1/audio/translations", Api::Audio),
        ] {
            assert_eq!(Api::from_path(path), api, "{path}");
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_responses_request_reads_its_instructions_and_input() {
        let r = parse_request(
            Api::Responses,
            br#"{"model":"m","instructions":"be brief","input":[
                {"role":"user","content":[{"type":"input_text","text":"hi"}]},
                {"role":"assistant","content":"hello"}],"stream":true,"max_output_tokens":9}"#,
        )
        .unwrap();
        assert_eq!(r.prompt, "system: be brief\nuser: hi\nassistant: hello\n");
        assert!(r.stream);
        assert_eq!(r.max_tokens, Some(9));
        let s = parse_request(Api::Responses, br#"{"model":"m","input":"hi"}"#).unwrap();
        assert_eq!(s.prompt, "user: hi\n");
        let e = parse_request(Api::Responses, br#"{"model":"m"}"#).unwrap_err();
        assert_eq!((e.status, e.param), (400, Some("input")));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn pooling_apis_give_their_text_and_are_never_refused() {
        let cases: [(Api, &[u8], &str, &str); 7] = [
            (
                Api::Embeddings,
                br#"{"model":"e","input":["a","b"]}"#,
                "e",
                "ab",
            ),
            (Api::Embeddings, br#"{"input":[1,2]}"#, "", "1 2 "),
            (
                Api::Rerank,
                br#"{"model":"r","query":"q","documents":["d1",{"text":"d2"}]}"#,
                "r",
                "qd1d2",
            ),
            (
                Api::Score,
                br#"{"text_1":"x","text_2":["y","z"]}"#,
                "",
                "xyz",
            ),
            (
                Api::Pooling,
                br#"{"model":"p","messages":[{"role":"user","content":"hi"}]}"#,
                "p",
                "user: hi\n",
            ),
            (
                Api::Tokenize,
                br#"{"model":"t","prompt":"abc"}"#,
                "t",
                "abc",
            ),
            (Api::Detokenize, br#"{"model":"t","tokens":[1,2]}"#, "t", ""),
        ];
        for (api, body, model, prompt) in cases {
            let r = parse_request(api, body).unwrap();
            assert_eq!(
                (r.model.as_str(), r.prompt.as_ref()),
                (model, prompt),
                "{api:?}"
            );
        }
        // Bodies the gateway cannot read are vLLM's to answer, not refused here.
        for api in [Api::Embeddings, Api::Conversations, Api::Audio, Api::Rerank] {
            let r = parse_request(api, b"--boundary\r\nContent-Disposition: form-data").unwrap();
            assert_eq!(r.prompt, "");
            assert!(parse_request(api, b"").is_ok());
        }
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
        let m: Vec<_> = r.messages().collect();
        assert_eq!(m, vec![("system", "be brief"), ("user", "hi")]);
        // Contents with the separators in them read back exactly.
        let r = parse_request(
            Api::ChatCompletions,
            br#"{"model":"m","messages":[{"role":"user","content":"a: b\nuser: c"},{"role":"assistant","content":""}]}"#,
        )
        .unwrap();
        let m: Vec<_> = r.messages().collect();
        assert_eq!(m, vec![("user", "a: b\nuser: c"), ("assistant", "")]);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn usage_numbers_are_read_from_the_last_occurrence_of_their_key() {
        let w = br#"{"usage":{"prompt_tokens":12,"cached_tokens": 8},"x":{"prompt_tokens" : 30}}"#;
        assert_eq!(usage_number(w, b"\"prompt_tokens\""), Some(30));
        assert_eq!(usage_number(w, b"\"cached_tokens\""), Some(8));
        assert_eq!(usage_number(w, b"\"input_tokens\""), None);
        assert_eq!(
            usage_number(b"\"cached_tokens\"", b"\"cached_tokens\""),
            None
        );
        assert_eq!(usage_number(b"ab", b"\"cached_tokens\""), None);
        assert_eq!(usage_number(b"\"n\":7", b"\"n\""), Some(7));
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
