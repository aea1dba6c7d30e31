//! Text keys: block keys of a real model's prompts without a tokenizer in the filter
//! (`precise-prefix-cache-scorer` with `tokenizer: relay`).
//!
//! `kv-relay`, given the servers' model directory, turns each cached token block back into
//! the bytes it came from and publishes, per server, chained keys of fixed-size blocks of
//! the prompt's bytes (only blocks wholly inside the cached token prefix):
//! `root = xxh64(model)`, `key_j = xxh64(bytes [jB, (j+1)B) ‖ LE_u64(key_{j-1}))`. The
//! filter computes the same from the prompt text as the servers tokenize it:
//!
//! * a completion: the relay's `completionPrefix` (what tokenization adds, e.g. a BOS
//!   token's text) then the prompt;
//! * a chat request: the conversation rendered by the template's **shape**, which the
//!   relay learnt from the model's Jinja template (a head, a separator per role pair, a
//!   tail per last role; contents trimmed or not) — concatenation, no Jinja here. A
//!   conversation the shape cannot render (a role pair never learnt, or a template the
//!   relay could not reduce to a shape) has no text keys: the approximate index answers.

use hashbrown::HashMap;
use serde_json::Value;
use xxhash_rust::xxh64::xxh64;

/// What the relay publishes under `text`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TextSpec {
    /// Bytes per text block.
    pub block_bytes: usize,
    /// Text tokenization adds before a completion prompt.
    pub completion_prefix: String,
    /// The chat template's shape, if it has one.
    pub chat: Option<ChatShape>,
}

/// A chat template reduced to concatenation (see the module doc).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatShape {
    head_system: Option<String>,
    head: Option<String>,
    seps: HashMap<String, String>,
    tails: HashMap<String, String>,
    trim: bool,
}

fn strings(v: Option<&Value>) -> HashMap<String, String> {
    v.and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect()
}

impl TextSpec {
    /// Reads the relay's `text` object; `None` when it is absent or malformed.
    pub fn from_json(v: &Value) -> Option<TextSpec> {
        let block_bytes = usize::try_from(v.get("blockBytes")?.as_u64()?).ok()?;
        if block_bytes == 0 {
            return None;
        }
        let chat = v.get("chat").filter(|c| c.is_object()).map(|c| {
            let s = |k: &str| c.get(k).and_then(Value::as_str).map(str::to_string);
            ChatShape {
                head_system: s("headSystem"),
                head: s("head"),
                seps: strings(c.get("seps")),
                tails: strings(c.get("tails")),
                trim: c.get("trim").and_then(Value::as_bool).unwrap_or(false),
            }
        });
        Some(TextSpec {
            block_bytes,
            completion_prefix: v
                .get("completionPrefix")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            chat,
        })
    }
}

impl ChatShape {
    /// The conversation as the servers' template renders it; `None` when the shape
    /// does not cover it.
    pub fn render<'a>(&self, messages: impl Iterator<Item = (&'a str, &'a str)>) -> Option<String> {
        let mut out = String::new();
        let mut prev: Option<&str> = None;
        let mut key = String::new();
        for (role, content) in messages {
            match prev {
                None if role == "system" => out.push_str(self.head_system.as_deref()?),
                None => out.push_str(self.head.as_deref()?),
                Some(p) => {
                    key.clear();
                    key.push_str(p);
                    key.push('>');
                    key.push_str(role);
                    out.push_str(self.seps.get(key.as_str())?);
                }
            }
            out.push_str(if self.trim { content.trim() } else { content });
            prev = Some(role);
        }
        out.push_str(self.tails.get(prev?)?);
        Some(out)
    }
}

/// The text keys of `text` (full blocks of `block` bytes, at most `max_blocks`).
pub fn keys(model: &str, text: &[u8], block: usize, max_blocks: usize) -> Vec<u64> {
    if block == 0 {
        return Vec::new();
    }
    let mut prev = xxh64(model.as_bytes(), 0);
    let mut buf = Vec::with_capacity(block + 8);
    text.chunks_exact(block)
        .take(max_blocks)
        .map(|b| {
            buf.clear();
            buf.extend_from_slice(b);
            buf.extend_from_slice(&prev.to_le_bytes());
            prev = xxh64(&buf, 0);
            prev
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    /// The same vector as kv-relay's `keys::tests::known_text_vector`.
    #[wasm_bindgen_test(unsupported = test)]
    fn keys_match_the_relay() {
        assert_eq!(
            keys("m", b"abcdefghij", 4, 256),
            vec![0xbc35_fa6a_95e9_6a05, 0x53f5_ee97_c675_1efd]
        );
        assert_eq!(keys("m", b"abcdefghij", 4, 1).len(), 1);
        assert!(keys("m", b"abc", 0, 9).is_empty());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_learnt_shape_renders_by_concatenation() {
        let spec = TextSpec::from_json(&json!({
            "blockBytes": 64, "completionPrefix": "<s>",
            "chat": {"head": "<s>[sys]default[/sys][u]", "headSystem": "<s>[sys]",
                     "seps": {"system>user": "[/sys][u]", "user>assistant": "[/u][a]", "assistant>user": "[/a][u]"},
                     "tails": {"user": "[/u][a]"}, "trim": true}
        }))
        .unwrap();
        assert_eq!(spec.completion_prefix, "<s>");
        let chat = spec.chat.unwrap();
        let r = |m: &[(&'static str, &'static str)]| chat.render(m.iter().copied());
        assert_eq!(
            r(&[("system", " be brief "), ("user", "hi")]).unwrap(),
            "<s>[sys]be brief[/sys][u]hi[/u][a]"
        );
        assert_eq!(
            r(&[("user", "hi"), ("assistant", "yo"), ("user", "ok")]).unwrap(),
            "<s>[sys]default[/sys][u]hi[/u][a]yo[/a][u]ok[/u][a]"
        );
        // Not learnt: a tool turn, a conversation ending with the assistant.
        assert_eq!(r(&[("user", "hi"), ("tool", "x")]), None);
        assert_eq!(r(&[("user", "hi"), ("assistant", "yo")]), None);
        assert_eq!(r(&[]), None);
        assert_eq!(TextSpec::from_json(&json!({"blockBytes": 0})), None);
    }
}
