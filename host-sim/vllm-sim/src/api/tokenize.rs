//! vLLM's `/tokenize` and `/detokenize`, with the simulator's tokenizer
//! ([`crate::tokenizer`]). Neither touches the engine (nor its metrics), as in vLLM.
//!
//! Token ids are hashes, so they cannot be turned back into text by themselves: a
//! [`Vocabulary`] remembers the pieces it was asked to tokenize (bounded), output
//! tokens decode to their words, and any other id decodes to U+FFFD, as a byte-level
//! tokenizer renders bytes it cannot decode.

use super::errors::ApiError;
use super::openai::{json_error, messages_text};
use crate::tokenizer;
use serde_json::{json, Value};
use std::collections::HashMap;

/// A parsed `/tokenize` request.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    /// `prompt`, or `messages` rendered like chat (with the assistant's turn unless
    /// `add_generation_prompt: false`).
    pub text: String,
    pub return_token_strs: bool,
}

fn object(body: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    match serde_json::from_slice(body).map_err(json_error)? {
        Value::Object(o) => Ok(o),
        _ => Err(ApiError::bad_request("request body must be a JSON object")),
    }
}

fn model(obj: &serde_json::Map<String, Value>) -> Option<String> {
    obj.get("model").and_then(Value::as_str).map(str::to_string)
}

/// Parses a `/tokenize` body.
pub fn parse_tokenize(body: &[u8]) -> Result<TokenizeRequest, ApiError> {
    let obj = object(body)?;
    let text = match (obj.get("prompt"), obj.get("messages")) {
        (Some(Value::String(p)), _) => p.clone(),
        (Some(p), _) if !p.is_null() => {
            return Err(ApiError::bad_request("prompt must be a string").with_param("prompt"))
        }
        (_, Some(m)) if !m.is_null() => {
            let generation_prompt = obj
                .get("add_generation_prompt")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            messages_text(m, generation_prompt)?
        }
        _ => return Err(ApiError::bad_request("Field required: `prompt`").with_param("prompt")),
    };
    Ok(TokenizeRequest {
        model: model(&obj),
        text,
        return_token_strs: obj
            .get("return_token_strs")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    })
}

/// The `/tokenize` response: `{count, max_model_len, tokens, token_strs}`.
pub fn tokenize_json(request: &TokenizeRequest, max_model_len: usize) -> String {
    let tokens = tokenizer::encode(&request.text);
    let strs = request
        .return_token_strs
        .then(|| tokenizer::pieces(&request.text));
    json!({"count": tokens.len(), "max_model_len": max_model_len, "tokens": tokens,
           "token_strs": strs})
    .to_string()
}

/// A parsed `/detokenize` request.
#[derive(Clone, Debug, PartialEq)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

/// Parses a `/detokenize` body (`tokens`: token ids).
pub fn parse_detokenize(body: &[u8]) -> Result<DetokenizeRequest, ApiError> {
    let obj = object(body)?;
    let invalid =
        || ApiError::bad_request("tokens must be a list of token ids").with_param("tokens");
    let tokens = match obj.get("tokens") {
        None | Some(Value::Null) => {
            return Err(ApiError::bad_request("Field required: `tokens`").with_param("tokens"))
        }
        Some(Value::Array(ids)) => ids
            .iter()
            .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(invalid)?,
        Some(_) => return Err(invalid()),
    };
    Ok(DetokenizeRequest {
        model: model(&obj),
        tokens,
    })
}

/// The `/detokenize` response: `{prompt}`.
pub fn detokenize_json(prompt: &str) -> String {
    json!({ "prompt": prompt }).to_string()
}

/// Token pieces seen by `/tokenize`, so that `/detokenize` can give the text back.
#[derive(Clone, Debug)]
pub struct Vocabulary {
    pieces: HashMap<u32, Box<str>>,
    capacity: usize,
}

impl Vocabulary {
    /// A vocabulary that remembers at most `capacity` pieces (then learns no more).
    pub fn new(capacity: usize) -> Self {
        Vocabulary {
            pieces: HashMap::new(),
            capacity,
        }
    }

    /// Remembers the pieces of `text`.
    pub fn learn(&mut self, text: &str) {
        for piece in tokenizer::pieces(text) {
            if self.pieces.len() >= self.capacity {
                return;
            }
            let id = tokenizer::encode(piece)[0];
            self.pieces.entry(id).or_insert_with(|| piece.into());
        }
    }

    /// The text of `tokens`.
    pub fn decode(&self, tokens: &[u32]) -> String {
        let mut out = String::new();
        for id in tokens {
            match self.pieces.get(id) {
                Some(piece) => out.push_str(piece),
                None => out.push_str(tokenizer::output_word(*id).unwrap_or("\u{FFFD}")),
            }
        }
        out
    }
}

impl Default for Vocabulary {
    /// Up to 65,536 pieces.
    fn default() -> Self {
        Self::new(1 << 16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenize_counts_and_detokenize_gives_the_text_back() {
        let r = parse_tokenize(
            br#"{"model":"m","prompt":"Hello there, tokenizer","return_token_strs":true}"#,
        )
        .unwrap();
        let v: Value = serde_json::from_str(&tokenize_json(&r, 4096)).unwrap();
        assert_eq!(v["count"], 6);
        assert_eq!(v["max_model_len"], 4096);
        let tokens: Vec<u32> = serde_json::from_value(v["tokens"].clone()).unwrap();
        assert_eq!(tokens, tokenizer::encode("Hello there, tokenizer"));
        assert_eq!(v["token_strs"][0], "Hell");

        let mut vocab = Vocabulary::default();
        vocab.learn(&r.text);
        assert_eq!(vocab.decode(&tokens), "Hello there, tokenizer");
        let output = [tokenizer::output_token_id(0), tokenizer::output_token_id(1)];
        assert_eq!(vocab.decode(&output), " the model");
        assert_eq!(Vocabulary::new(0).decode(&tokens[..1]), "\u{FFFD}");

        let d = parse_detokenize(br#"{"tokens":[1,2]}"#).unwrap();
        assert_eq!(d.tokens, vec![1, 2]);
        assert_eq!(
            serde_json::from_str::<Value>(&detokenize_json("x")).unwrap(),
            json!({"prompt": "x"})
        );
    }

    #[test]
    fn chat_messages_and_errors() {
        let r = parse_tokenize(br#"{"messages":[{"role":"user","content":"hi"}]}"#).unwrap();
        assert_eq!(r.text, "<|user|>\nhi\n<|assistant|>\n");
        assert!(!r.return_token_strs);
        let r = parse_tokenize(
            br#"{"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false}"#,
        )
        .unwrap();
        assert_eq!(r.text, "<|user|>\nhi\n");
        let v: Value = serde_json::from_str(&tokenize_json(&r, 8)).unwrap();
        assert!(v["token_strs"].is_null());
        for bad in [&br#"{}"#[..], b"nope", br#"{"prompt":1}"#] {
            assert_eq!(parse_tokenize(bad).unwrap_err().status, 400);
        }
        for bad in [&br#"{}"#[..], br#"{"tokens":"x"}"#, br#"{"tokens":[-1]}"#] {
            assert_eq!(parse_detokenize(bad).unwrap_err().status, 400);
        }
    }
}
