//! `--tokenizer DIR`: a real model's tokenizer and chat template instead of the stand-in
//! ([`crate::tokenizer`]), so the KV events carry the token ids a real vLLM would send.
//!
//! From a model directory as vLLM reads it: `tokenizer.json` (the `tokenizers` crate),
//! the chat template (`chat_template.jinja`, else `tokenizer_config.json`'s
//! `chat_template`) with `bos_token` / `eos_token` from `tokenizer_config.json`. As vLLM:
//! a completion prompt is encoded with the tokenizer's special tokens (its BOS), a chat
//! request is rendered by the template (minijinja with `trim_blocks` / `lstrip_blocks`,
//! the generation prompt on) and encoded without them.

use serde_json::Value;
use std::path::Path;
use tokenizers::Tokenizer;

/// A loaded model tokenizer.
pub struct ModelTokenizer {
    tokenizer: Tokenizer,
    env: Option<minijinja::Environment<'static>>,
    bos: String,
    eos: String,
}

impl std::fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("chat_template", &self.env.is_some())
            .finish()
    }
}

fn special(config: Option<&Value>, name: &str) -> String {
    let v = config.and_then(|c| c.get(name));
    v.and_then(Value::as_str)
        .or_else(|| v.and_then(|v| v.get("content")).and_then(Value::as_str))
        .unwrap_or("")
        .to_string()
}

impl ModelTokenizer {
    /// Loads `dir` (errors name the file).
    pub fn load(dir: &Path) -> Result<Self, String> {
        let file = dir.join("tokenizer.json");
        let tokenizer =
            Tokenizer::from_file(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let config_file = dir.join("tokenizer_config.json");
        let config: Option<Value> = match std::fs::read(&config_file) {
            Ok(b) => Some(
                serde_json::from_slice(&b)
                    .map_err(|e| format!("{}: {e}", config_file.display()))?,
            ),
            Err(_) => None,
        };
        let source = std::fs::read_to_string(dir.join("chat_template.jinja"))
            .ok()
            .or_else(|| {
                config
                    .as_ref()
                    .and_then(|c| c.get("chat_template"))
                    .and_then(Value::as_str)
                    .map(str::to_string)
            });
        let env = match source {
            Some(source) => {
                let mut env = minijinja::Environment::new();
                env.set_trim_blocks(true);
                env.set_lstrip_blocks(true);
                env.set_unknown_method_callback(
                    minijinja_contrib::pycompat::unknown_method_callback,
                );
                env.add_function(
                    "raise_exception",
                    |msg: String| -> Result<String, minijinja::Error> {
                        Err(minijinja::Error::new(
                            minijinja::ErrorKind::InvalidOperation,
                            msg,
                        ))
                    },
                );
                env.add_template_owned("chat", source)
                    .map_err(|e| format!("chat template: {e}"))?;
                Some(env)
            }
            None => None,
        };
        Ok(ModelTokenizer {
            tokenizer,
            env,
            bos: special(config.as_ref(), "bos_token"),
            eos: special(config.as_ref(), "eos_token"),
        })
    }

    /// A completion prompt's token ids (special tokens added, as vLLM does).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.ids(text, true)
    }

    fn ids(&self, text: &str, special: bool) -> Result<Vec<u32>, String> {
        self.tokenizer
            .encode(text, special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| format!("tokenizer: {e}"))
    }

    /// The text of a conversation rendered by the chat template.
    pub fn render(&self, messages: &[(&str, String)]) -> Result<String, String> {
        let env = self
            .env
            .as_ref()
            .ok_or("the model directory has no chat template")?;
        let msgs: Vec<Value> = messages
            .iter()
            .map(|(r, c)| serde_json::json!({"role": r, "content": c}))
            .collect();
        env.get_template("chat")
            .and_then(|t| {
                t.render(minijinja::context! {
                    messages => msgs,
                    add_generation_prompt => true,
                    bos_token => self.bos.as_str(),
                    eos_token => self.eos.as_str(),
                })
            })
            .map_err(|e| format!("chat template: {e}"))
    }

    /// A chat request's token ids: rendered, then encoded without special tokens.
    pub fn encode_chat(&self, messages: &[(&str, String)]) -> Result<Vec<u32>, String> {
        self.ids(&self.render(messages)?, false)
    }
}
