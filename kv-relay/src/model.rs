//! A model's tokenizer and chat template, loaded by the relay so that the filter needs
//! neither ([`crate::keys`]'s text keys).
//!
//! From a model directory as vLLM reads it (a Hugging Face snapshot): `tokenizer.json`
//! (the `tokenizers` crate), the chat template (`--chat-template` file, else
//! `chat_template.jinja`, else `tokenizer_config.json`'s `chat_template`) and
//! `bos_token` / `eos_token` from `tokenizer_config.json`.
//!
//! * Token bytes: every token id's bytes, so a cached block's token ids turn back into the
//!   prompt bytes they came from. Only **byte-level BPE** tokenizers (the `ByteLevel`
//!   decoder: Llama 3, Qwen 2/2.5/3, DeepSeek, GPT-style) give every token exact bytes;
//!   others are refused at load. The tokenizer must also give the text back unchanged
//!   (no `add_prefix_space`), checked at load.
//! * Completion prefix: what tokenization adds before a completion prompt (Llama 3's
//!   `<|begin_of_text|>`), which the filter prepends.
//! * Chat shape: [`crate::chat::learn`] over the template rendered as vLLM does
//!   (minijinja, `trim_blocks` and `lstrip_blocks` as in `transformers`, the generation
//!   prompt on, Python string methods).

use crate::chat::{self, ChatShape, Messages};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use tokenizers::Tokenizer;

/// What the relay knows of the servers' model.
#[derive(Debug)]
pub struct Model {
    /// Bytes of token `id`: `bytes[offsets[id]..offsets[id + 1]]`.
    bytes: Vec<u8>,
    offsets: Vec<u32>,
    /// Text tokenization adds before a completion prompt.
    pub completion_prefix: String,
    /// The template's shape, or why chat prompts cannot be keyed.
    pub chat: Result<ChatShape, String>,
}

/// GPT-2's byte-level alphabet: the character standing for each byte.
fn byte_chars() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
    let mut map = HashMap::with_capacity(256);
    let mut n = 0u32;
    for b in 0..=255u8 {
        let c = if printable(b) {
            u32::from(b)
        } else {
            n += 1;
            255 + n
        };
        if let Some(c) = char::from_u32(c) {
            map.insert(c, b);
        }
    }
    map
}

fn read_json(path: &Path) -> Result<Option<Value>, String> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// A special token of `tokenizer_config.json` (a string or `{"content": …}`).
fn special(config: Option<&Value>, name: &str) -> String {
    let v = config.and_then(|c| c.get(name));
    v.and_then(Value::as_str)
        .or_else(|| v.and_then(|v| v.get("content")).and_then(Value::as_str))
        .unwrap_or("")
        .to_string()
}

/// The chat template source: the override file, `chat_template.jinja`, or the config's.
fn template_source(
    dir: &Path,
    config: Option<&Value>,
    chat_template: Option<&Path>,
) -> Result<Option<String>, String> {
    if let Some(p) = chat_template {
        return std::fs::read_to_string(p)
            .map(Some)
            .map_err(|e| format!("{}: {e}", p.display()));
    }
    if let Ok(s) = std::fs::read_to_string(dir.join("chat_template.jinja")) {
        return Ok(Some(s));
    }
    Ok(match config.and_then(|c| c.get("chat_template")) {
        Some(Value::String(s)) => Some(s.clone()),
        // A list of named templates: the default one.
        Some(Value::Array(named)) => named
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    })
}

/// Renders `source` as `transformers`' `apply_chat_template` does.
pub fn renderer(
    source: String,
    bos: String,
    eos: String,
) -> Result<impl Fn(&Messages<'_>) -> Result<String, String>, String> {
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                msg,
            ))
        },
    );
    // A template inserting today's date (`transformers` passes `strftime_now`) renders
    // differently each day: a value that changes on every call makes the shape check
    // refuse it rather than learn one day's date.
    let calls = std::sync::atomic::AtomicU64::new(0);
    env.add_function("strftime_now", move |_format: String| -> String {
        let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("<date {n}>")
    });
    env.add_template_owned("chat", source)
        .map_err(|e| format!("chat template: {e}"))?;
    Ok(move |messages: &Messages<'_>| {
        let msgs: Vec<Value> = messages
            .iter()
            .map(|(r, c)| serde_json::json!({"role": r, "content": c}))
            .collect();
        let t = env.get_template("chat").map_err(|e| e.to_string())?;
        t.render(minijinja::context! {
            messages => msgs,
            add_generation_prompt => true,
            bos_token => bos.as_str(),
            eos_token => eos.as_str(),
        })
        .map_err(|e| e.to_string())
    })
}

impl Model {
    /// Loads the model directory `dir` (see the module doc); errors name the file and
    /// what is wrong.
    pub fn load(dir: &Path, chat_template: Option<&Path>) -> Result<Model, String> {
        let file = dir.join("tokenizer.json");
        let raw = read_json(&file)?.ok_or_else(|| format!("{}: not found", file.display()))?;
        let decoder = raw
            .pointer("/decoder/type")
            .and_then(Value::as_str)
            .unwrap_or("none");
        if decoder != "ByteLevel" {
            return Err(format!(
                "{}: decoder {decoder:?}: only byte-level BPE tokenizers (decoder \"ByteLevel\") give every token exact bytes",
                file.display()
            ));
        }
        let tokenizer =
            Tokenizer::from_file(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let model = Self::from_tokenizer(&tokenizer, dir, chat_template)?;
        Ok(model)
    }

    fn from_tokenizer(
        tokenizer: &Tokenizer,
        dir: &Path,
        chat_template: Option<&Path>,
    ) -> Result<Model, String> {
        let chars = byte_chars();
        let added = tokenizer.get_added_tokens_decoder();
        let size = tokenizer.get_vocab_size(true) as u32;
        let top = tokenizer
            .get_vocab(true)
            .values()
            .copied()
            .max()
            .unwrap_or(0)
            .max(size.saturating_sub(1));
        let (mut bytes, mut offsets) = (Vec::new(), vec![0u32]);
        for id in 0..=top {
            if let Some(t) = added.get(&id) {
                bytes.extend_from_slice(t.content.as_bytes());
            } else if let Some(piece) = tokenizer.id_to_token(id) {
                for c in piece.chars() {
                    let b = chars.get(&c).ok_or_else(|| {
                        format!("token {id} ({piece:?}) is not byte-level: the tokenizer is not byte-level BPE")
                    })?;
                    bytes.push(*b);
                }
            }
            offsets.push(u32::try_from(bytes.len()).map_err(|_| "vocabulary too large")?);
        }
        let config = read_json(&dir.join("tokenizer_config.json"))?;
        let (bos, eos) = (
            special(config.as_ref(), "bos_token"),
            special(config.as_ref(), "eos_token"),
        );
        let mut model = Model {
            bytes,
            offsets,
            completion_prefix: String::new(),
            chat: Err("no chat template".into()),
        };
        // The text must come back unchanged, and what tokenization adds is the prefix.
        let probe = "Hello world,\n  the tokenizer's round trip: 1234 ✓";
        let ids = |special: bool| -> Result<Vec<u32>, String> {
            tokenizer
                .encode(probe, special)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| format!("tokenizer: {e}"))
        };
        let (plain, full) = (model.text(&ids(false)?), model.text(&ids(true)?));
        if plain.as_deref() != Some(probe.as_bytes()) {
            return Err(
                "the tokenizer does not give the text back unchanged (a normalizer or add_prefix_space)"
                    .into(),
            );
        }
        let full = full.unwrap_or_default();
        let at = full
            .windows(probe.len())
            .position(|w| w == probe.as_bytes())
            .ok_or("the tokenizer's special tokens split the prompt")?;
        model.completion_prefix = String::from_utf8_lossy(&full[..at]).into_owned();
        if let Some(source) = template_source(dir, config.as_ref(), chat_template)? {
            let render = renderer(source, bos, eos)?;
            model.chat = chat::learn(&render);
        }
        Ok(model)
    }

    /// Appends the bytes of `tokens` to `out`; false when an id is unknown.
    pub fn append(&self, tokens: &[u32], out: &mut Vec<u8>) -> bool {
        for t in tokens {
            let i = *t as usize;
            let (Some(a), Some(b)) = (self.offsets.get(i), self.offsets.get(i + 1)) else {
                return false;
            };
            out.extend_from_slice(&self.bytes[*a as usize..*b as usize]);
        }
        true
    }

    /// The bytes of `tokens`, or `None` when an id is unknown.
    pub fn text(&self, tokens: &[u32]) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(tokens.len() * 4);
        self.append(tokens, &mut out).then_some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_covers_every_byte() {
        let m = byte_chars();
        assert_eq!(m.len(), 256);
        assert_eq!(m[&'a'], b'a');
        assert_eq!(m[&'\u{120}'], b' '); // GPT-2's 'Ġ'
        assert_eq!(m[&'\u{10a}'], b'\n'); // 'Ċ'
    }
}
