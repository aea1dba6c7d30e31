//! `token-producer` (llm-d-router; also its legacy name `tokenizer`): in the reference, a
//! per-request call to a vLLM render service (`vllm.url`) that puts the prompt's token ids
//! on the request for the precise prefix producer and the multimodal decider.
//!
//! Here it is accepted and checked, and does nothing at request time, on purpose: a
//! callout per request from every Envoy worker would put a network round trip before
//! every pick. What it provides is provided elsewhere:
//!
//! * the token ids precise matching needs: `precise-prefix-cache-producer`'s `tokenizer`
//!   — `vllm-sim` (the simulator's tokenizer, in the filter), or `relay`, where kv-relay
//!   (`--tokenizer MODEL_DIR`, the model `modelName` names) turns each cached block back
//!   into text and the filter keys the request's text the same way;
//! * token counts for load: the 4-bytes-per-token estimate, as the reference's default
//!   `estimate` backend.
//!
//! `modelName` and `vllm` (`url`, `timeout`, `mmTimeout`) are checked for shape only;
//! `udsTokenizerConfig` (deprecated in the reference) and `estimate` tuning are refused.

use crate::config::quantity::parse_duration_ms;
use crate::config::validate::{as_str, err};
use crate::config::{ConfigError, Params};
use serde_json::Value;

/// The type name.
pub const TYPE: &str = "token-producer";
/// Its legacy name in the reference.
pub const ALIAS: &str = "tokenizer";

/// Checks the parameters.
pub fn check(v: &Value, path: &str) -> Result<(), ConfigError> {
    let p = Params::new(
        Some(v),
        path,
        &["modelName", "vllm", "udsTokenizerConfig", "estimate"],
    )?;
    p.string("modelName", "")?;
    for (name, why) in [
        ("udsTokenizerConfig", "the filter calls no tokenizer service; for a real model's tokens run kv-relay --tokenizer MODEL_DIR and set tokenizer: relay on precise-prefix-cache-producer"),
        ("estimate", "token counts are estimated at 4 bytes a token, with no multimodal placeholder estimation; remove it"),
    ] {
        if p.get(name).is_some() {
            return Err(err(&p.path(name), why));
        }
    }
    if let Some(vllm) = p.get("vllm") {
        let vp = Params::new(
            Some(vllm),
            &p.path("vllm"),
            &["url", "timeout", "mmTimeout"],
        )?;
        let url = vp.string("url", "http://localhost:8000")?;
        if !url.starts_with("http://") && !url.starts_with("https://") {
            return Err(err(&vp.path("url"), "must be an http:// URL"));
        }
        for name in ["timeout", "mmTimeout"] {
            if let Some(d) = vp.get(name) {
                let path = vp.path(name);
                parse_duration_ms(as_str(d, &path)?).map_err(|e| err(&path, e))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn reference_parameters_load_and_bad_ones_name_the_field() {
        assert!(check(
            &json!({"modelName": "m", "vllm": {"url": "http://localhost:8000", "timeout": "5s"}}),
            "p"
        )
        .is_ok());
        let e = |v| check(&v, "p").unwrap_err().path;
        assert_eq!(e(json!({"vllm": {"timeout": "soon"}})), "p.vllm.timeout");
        assert_eq!(e(json!({"vllm": {"url": "localhost"}})), "p.vllm.url");
        assert_eq!(e(json!({"udsTokenizerConfig": {}})), "p.udsTokenizerConfig");
    }
}
