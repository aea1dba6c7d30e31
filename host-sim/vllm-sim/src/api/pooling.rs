//! vLLM's pooling APIs: `/v1/embeddings`, `/pooling`, `/classify`, `/score` (and
//! `/v1/score`) and `/rerank` (and `/v1/rerank`, `/v2/rerank`): request parsing into
//! engine prompts, and response bodies in vLLM's shapes.
//!
//! Each output item is one engine request (one per input; one per query–document pair
//! for score and rerank, as a cross-encoder runs them). The pooled values are
//! deterministic stand-ins derived from the prompt's tokens: the same text always gets
//! the same embedding, score or class probabilities.

use super::errors::ApiError;
use super::openai::{json_error, messages_text, token_prompts};
use crate::engine::Usage;
use crate::rng::Rng;
use crate::tokenizer;
use serde_json::{json, Map, Value};

/// Which pooling endpoint a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolingApi {
    /// `/v1/embeddings`
    Embeddings,
    /// `/pooling`
    Pooling,
    /// `/classify`
    Classify,
    /// `/score`, `/v1/score`
    Score,
    /// `/rerank`, `/v1/rerank`, `/v2/rerank`
    Rerank,
}

impl PoolingApi {
    /// The prefix of the response's `id`, as vLLM's.
    pub fn id_prefix(self) -> &'static str {
        match self {
            PoolingApi::Embeddings => "embd",
            PoolingApi::Pooling => "pool",
            PoolingApi::Classify => "classify",
            PoolingApi::Score => "score",
            PoolingApi::Rerank => "rerank",
        }
    }
}

/// Size of an embedding when the request does not ask for `dimensions`.
pub const EMBEDDING_DIMENSIONS: usize = 8;

/// The largest `dimensions` accepted.
pub const MAX_DIMENSIONS: usize = 4096;

/// Classes of `/classify` (labels `LABEL_0`, `LABEL_1`, as a Hugging Face head without
/// `id2label` names them).
pub const NUM_CLASSES: usize = 2;

/// A parsed pooling request.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolingRequest {
    pub api: PoolingApi,
    pub model: Option<String>,
    /// One engine prompt per output item.
    pub prompts: Vec<Vec<u32>>,
    /// Embeddings and pooling: values per vector.
    pub dimensions: usize,
    /// Embeddings and pooling: `encoding_format: "base64"` (little-endian f32).
    pub base64: bool,
    /// Rerank: the documents' texts, returned in the results.
    pub documents: Vec<String>,
    /// Rerank: results returned (0: all).
    pub top_n: usize,
}

/// Parses a request body for `api`. Errors are vLLM's 400s.
pub fn parse(api: PoolingApi, body: &[u8]) -> Result<PoolingRequest, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(json_error)?;
    let Value::Object(obj) = value else {
        return Err(ApiError::bad_request("request body must be a JSON object"));
    };
    let mut request = PoolingRequest {
        api,
        model: optional_string(&obj, "model")?,
        prompts: Vec::new(),
        dimensions: EMBEDDING_DIMENSIONS,
        base64: false,
        documents: Vec::new(),
        top_n: 0,
    };
    match api {
        PoolingApi::Embeddings | PoolingApi::Pooling => {
            request.prompts = input_prompts(&obj)?;
            request.dimensions = dimensions(&obj)?;
            request.base64 = base64_format(&obj)?;
        }
        PoolingApi::Classify => request.prompts = input_prompts(&obj)?,
        PoolingApi::Score => request.prompts = score_prompts(&obj)?,
        PoolingApi::Rerank => {
            let query = match obj.get("query") {
                Some(Value::String(q)) => q.clone(),
                None | Some(Value::Null) => return Err(missing("query")),
                Some(_) => {
                    return Err(ApiError::bad_request("query must be a string").with_param("query"))
                }
            };
            request.documents = match obj.get("documents") {
                None | Some(Value::Null) => return Err(missing("documents")),
                Some(d) => texts(d, "documents")?,
            };
            if request.documents.is_empty() {
                return Err(
                    ApiError::bad_request("documents must not be empty").with_param("documents")
                );
            }
            request.prompts = request
                .documents
                .iter()
                .map(|d| pair_prompt(&query, d))
                .collect();
            request.top_n = match obj.get("top_n") {
                None | Some(Value::Null) => 0,
                Some(n) => n.as_u64().ok_or_else(|| {
                    ApiError::bad_request("top_n must be a non-negative integer")
                        .with_param("top_n")
                })? as usize,
            };
        }
    }
    Ok(request)
}

fn missing(field: &str) -> ApiError {
    ApiError::bad_request(format!("Field required: `{field}`")).with_param(field)
}

fn optional_string(obj: &Map<String, Value>, field: &str) -> Result<Option<String>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => {
            Err(ApiError::bad_request(format!("{field} must be a string")).with_param(field))
        }
    }
}

/// `input` (a string, strings, token ids or lists of them), or chat `messages`.
fn input_prompts(obj: &Map<String, Value>) -> Result<Vec<Vec<u32>>, ApiError> {
    if let Some(input) = obj.get("input").filter(|v| !v.is_null()) {
        return token_prompts(input, "input");
    }
    if let Some(messages) = obj.get("messages").filter(|v| !v.is_null()) {
        let generation_prompt = obj
            .get("add_generation_prompt")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let text = messages_text(messages, generation_prompt)?;
        return Ok(vec![tokenizer::encode(&text)]);
    }
    Err(missing("input"))
}

fn dimensions(obj: &Map<String, Value>) -> Result<usize, ApiError> {
    match obj.get("dimensions") {
        None | Some(Value::Null) => Ok(EMBEDDING_DIMENSIONS),
        Some(n) => n
            .as_u64()
            .filter(|n| (1..=MAX_DIMENSIONS as u64).contains(n))
            .map(|n| n as usize)
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "dimensions must be an integer from 1 to {MAX_DIMENSIONS}"
                ))
                .with_param("dimensions")
            }),
    }
}

fn base64_format(obj: &Map<String, Value>) -> Result<bool, ApiError> {
    match obj.get("encoding_format").and_then(Value::as_str) {
        None | Some("float") => Ok(false),
        Some("base64") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "encoding_format must be 'float' or 'base64', got '{other}'"
        ))
        .with_param("encoding_format")),
    }
}

/// The texts of a score or rerank field: a string, or a list of strings (or of
/// objects with a `text` or `content` string).
fn texts(value: &Value, param: &str) -> Result<Vec<String>, ApiError> {
    let invalid =
        || ApiError::bad_request(format!("{param} must be a string or a list of strings"));
    let text = |v: &Value| -> Option<String> {
        match v {
            Value::String(s) => Some(s.clone()),
            Value::Object(o) => o
                .get("text")
                .or_else(|| o.get("content"))
                .and_then(Value::as_str)
                .map(str::to_string),
            _ => None,
        }
    };
    match value {
        Value::Array(items) => items
            .iter()
            .map(|v| text(v).ok_or_else(|| invalid().with_param(param)))
            .collect(),
        v => Ok(vec![text(v).ok_or_else(|| invalid().with_param(param))?]),
    }
}

/// The query–document pairs of `/score`: `text_1`/`text_2`, `queries`/`documents`,
/// `queries`/`items` or `data_1`/`data_2`; one query for all documents, or one each.
fn score_prompts(obj: &Map<String, Value>) -> Result<Vec<Vec<u32>>, ApiError> {
    const FIELDS: [(&str, &str); 4] = [
        ("text_1", "text_2"),
        ("queries", "documents"),
        ("queries", "items"),
        ("data_1", "data_2"),
    ];
    let (left, right) = FIELDS
        .iter()
        .find_map(|&(a, b)| {
            let (va, vb) = (obj.get(a)?, obj.get(b)?);
            Some(texts(va, a).and_then(|l| Ok((l, texts(vb, b)?))))
        })
        .ok_or_else(|| missing("text_1"))??;
    if left.is_empty() || right.is_empty() {
        return Err(ApiError::bad_request(
            "At least one text element must be given",
        ));
    }
    if left.len() != 1 && left.len() != right.len() {
        return Err(ApiError::bad_request(
            "Input lengths must be either 1:1, 1:N or N:N",
        ));
    }
    Ok(right
        .iter()
        .enumerate()
        .map(|(i, doc)| pair_prompt(&left[if left.len() == 1 { 0 } else { i }], doc))
        .collect())
}

/// A cross-encoder's prompt for a query–document pair: the query first, so the
/// documents of one query share its prefix.
pub fn pair_prompt(query: &str, document: &str) -> Vec<u32> {
    tokenizer::encode(&format!("{query}\n{document}"))
}

/// A seed from a prompt's tokens (FNV-1a over the ids).
fn prompt_seed(prompt: &[u32]) -> u64 {
    prompt.iter().fold(0xcbf2_9ce4_8422_2325, |h, t| {
        (h ^ u64::from(*t)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A deterministic unit vector of `dims` values for a prompt (vLLM normalizes
/// embeddings by default).
pub fn embedding(prompt: &[u32], dims: usize) -> Vec<f32> {
    let mut rng = Rng::new(prompt_seed(prompt));
    let raw: Vec<f64> = (0..dims).map(|_| rng.next_f64() * 2.0 - 1.0).collect();
    let norm = raw
        .iter()
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt()
        .max(f64::MIN_POSITIVE);
    raw.iter().map(|x| (x / norm) as f32).collect()
}

/// A deterministic relevance score in (0, 1) for a pair's prompt.
pub fn score(prompt: &[u32]) -> f64 {
    let mut rng = Rng::new(prompt_seed(prompt) ^ 0x5c0e);
    0.001 + 0.998 * rng.next_f64()
}

/// Deterministic class probabilities (softmax of two logits) for a prompt.
pub fn class_probs(prompt: &[u32]) -> [f64; NUM_CLASSES] {
    let mut rng = Rng::new(prompt_seed(prompt) ^ 0xc1a5);
    let logits = [rng.normal(0.0, 2.0), rng.normal(0.0, 2.0)];
    let max = logits[0].max(logits[1]);
    let exp = logits.map(|l| (l - max).exp());
    let sum = exp[0] + exp[1];
    exp.map(|e| e / sum)
}

/// The response body, after every prompt's engine request finished with `usage`
/// (summed over them).
pub fn response_json(
    request: &PoolingRequest,
    id: &str,
    created: u64,
    model: &str,
    usage: &Usage,
) -> String {
    let usage_json = json!({
        "prompt_tokens": usage.prompt_tokens,
        "total_tokens": usage.prompt_tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": null,
    });
    let vector = |prompt: &[u32]| -> Value {
        let v = embedding(prompt, request.dimensions);
        if request.base64 {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            Value::String(base64(&bytes))
        } else {
            json!(v)
        }
    };
    let prompts = request.prompts.iter().enumerate();
    let body = match request.api {
        PoolingApi::Rerank => {
            let mut results: Vec<(usize, f64)> = request
                .prompts
                .iter()
                .enumerate()
                .map(|(i, p)| (i, score(p)))
                .collect();
            results.sort_by(|a, b| b.1.total_cmp(&a.1));
            if request.top_n > 0 {
                results.truncate(request.top_n);
            }
            let results: Vec<Value> = results
                .into_iter()
                .map(|(i, s)| {
                    json!({"index": i, "document": {"text": request.documents[i], "multi_modal": null},
                           "relevance_score": s})
                })
                .collect();
            json!({"id": id, "model": model, "usage": {"prompt_tokens": usage.prompt_tokens,
                   "total_tokens": usage.prompt_tokens}, "results": results})
        }
        api => {
            let data: Vec<Value> = match api {
                PoolingApi::Embeddings => prompts
                    .map(
                        |(i, p)| json!({"index": i, "object": "embedding", "embedding": vector(p)}),
                    )
                    .collect(),
                PoolingApi::Pooling => prompts
                    .map(|(i, p)| json!({"index": i, "object": "pooling", "data": vector(p)}))
                    .collect(),
                PoolingApi::Classify => prompts
                    .map(|(i, p)| {
                        let probs = class_probs(p);
                        let label = if probs[1] > probs[0] { 1 } else { 0 };
                        json!({"index": i, "label": format!("LABEL_{label}"), "probs": probs,
                               "num_classes": NUM_CLASSES})
                    })
                    .collect(),
                _ => prompts
                    .map(|(i, p)| json!({"index": i, "object": "score", "score": score(p)}))
                    .collect(),
            };
            json!({"id": id, "object": "list", "created": created, "model": model,
                   "data": data, "usage": usage_json})
        }
    };
    body.to_string()
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(prompt_tokens: usize) -> Usage {
        Usage {
            prompt_tokens,
            ..Usage::default()
        }
    }

    #[test]
    fn embeddings_are_deterministic_unit_vectors_one_per_input() {
        let r = parse(
            PoolingApi::Embeddings,
            br#"{"model":"m","input":["first text","second text"]}"#,
        )
        .unwrap();
        assert_eq!(r.prompts.len(), 2);
        let v: Value =
            serde_json::from_str(&response_json(&r, "embd-1", 5, "m", &usage(6))).unwrap();
        assert_eq!(v["object"], "list");
        assert_eq!(v["usage"]["prompt_tokens"], 6);
        assert_eq!(v["usage"]["total_tokens"], 6);
        let data = v["data"].as_array().unwrap();
        assert_eq!(data.len(), 2);
        for (i, d) in data.iter().enumerate() {
            assert_eq!(d["index"], i);
            assert_eq!(d["object"], "embedding");
            let e: Vec<f64> = serde_json::from_value(d["embedding"].clone()).unwrap();
            assert_eq!(e.len(), EMBEDDING_DIMENSIONS);
            let norm: f64 = e.iter().map(|x| x * x).sum();
            assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        }
        assert_ne!(data[0]["embedding"], data[1]["embedding"]);
        let again = parse(PoolingApi::Embeddings, br#"{"input":"first text"}"#).unwrap();
        assert_eq!(embedding(&again.prompts[0], 8), embedding(&r.prompts[0], 8));
    }

    #[test]
    fn dimensions_base64_and_messages() {
        let r = parse(
            PoolingApi::Embeddings,
            br#"{"input":"x","dimensions":3,"encoding_format":"base64"}"#,
        )
        .unwrap();
        let v: Value =
            serde_json::from_str(&response_json(&r, "embd-1", 5, "m", &usage(1))).unwrap();
        // 3 f32 = 12 bytes = 16 base64 characters.
        assert_eq!(v["data"][0]["embedding"].as_str().unwrap().len(), 16);
        assert_eq!(base64(b"hello"), "aGVsbG8=");
        let r = parse(
            PoolingApi::Pooling,
            br#"{"messages":[{"role":"user","content":"hi"}]}"#,
        )
        .unwrap();
        assert_eq!(r.prompts, vec![tokenizer::encode("<|user|>\nhi\n")]);
        assert!(parse(PoolingApi::Embeddings, br#"{"input":"x","dimensions":0}"#).is_err());
    }

    #[test]
    fn bodies_it_cannot_read_are_400s_naming_the_field() {
        let e = parse(PoolingApi::Embeddings, br#"{"model":"m"}"#).unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (400, Some("input")));
        assert_eq!(
            parse(PoolingApi::Embeddings, b"not json")
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(
            parse(PoolingApi::Rerank, br#"{"documents":["a"]}"#)
                .unwrap_err()
                .param
                .as_deref(),
            Some("query")
        );
        assert!(parse(PoolingApi::Score, br#"{"text_1":["a","b"],"text_2":["c"]}"#).is_err());
        assert!(parse(PoolingApi::Score, br#"{"model":"m"}"#).is_err());
        assert!(parse(PoolingApi::Classify, br#"[1,2]"#).is_err());
    }

    #[test]
    fn score_classify_and_rerank_shapes() {
        let r = parse(
            PoolingApi::Score,
            br#"{"text_1":"query","text_2":["doc a","doc b","doc c"]}"#,
        )
        .unwrap();
        assert_eq!(r.prompts.len(), 3);
        let v: Value =
            serde_json::from_str(&response_json(&r, "score-1", 5, "m", &usage(9))).unwrap();
        for (i, d) in v["data"].as_array().unwrap().iter().enumerate() {
            assert_eq!(d["index"], i);
            assert_eq!(d["object"], "score");
            let s = d["score"].as_f64().unwrap();
            assert!(s > 0.0 && s < 1.0);
        }

        let r = parse(PoolingApi::Classify, br#"{"input":["a","b"]}"#).unwrap();
        let v: Value =
            serde_json::from_str(&response_json(&r, "classify-1", 5, "m", &usage(2))).unwrap();
        let d = &v["data"][1];
        assert_eq!(d["num_classes"], 2);
        let probs: Vec<f64> = serde_json::from_value(d["probs"].clone()).unwrap();
        assert!((probs.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        assert!(d["label"].as_str().unwrap().starts_with("LABEL_"));

        let r = parse(
            PoolingApi::Rerank,
            br#"{"query":"q","documents":["one","two",{"text":"three"}],"top_n":2}"#,
        )
        .unwrap();
        let v: Value =
            serde_json::from_str(&response_json(&r, "rerank-1", 5, "m", &usage(9))).unwrap();
        let results = v["results"].as_array().unwrap();
        assert_eq!(results.len(), 2);
        assert!(results[0]["relevance_score"].as_f64() >= results[1]["relevance_score"].as_f64());
        let i = results[0]["index"].as_u64().unwrap() as usize;
        assert_eq!(results[0]["document"]["text"], ["one", "two", "three"][i]);
        assert_eq!(v["usage"], json!({"prompt_tokens": 9, "total_tokens": 9}));
    }
}
