//! Model rewrites: the model a request is sent as, the body that says so, and the client's
//! model name put back into the response.
//!
//! The target is the rewrite header's model if the client sent one, else the request's;
//! then a matching `pool.modelRewrites` rule (exact model first, then a rule without a
//! model) may replace it with one of its weighted targets. The response carries the
//! served model's name; it is turned back into the client's, chunk by chunk, as the
//! reference's `rewriteModelName` does.

use crate::config::Pool;

/// The model to send a request for `model` as. `header` is the rewrite header's value,
/// `draw` a uniform number in [0, 1) for the weighted choice among a rule's targets.
pub fn target(model: &str, header: Option<&str>, pool: &Pool, draw: f64) -> String {
    let named = header.unwrap_or(model);
    match pool.rewrite(named, draw) {
        Some((_, t)) => t.to_string(),
        None => named.to_string(),
    }
}

/// `body` (a JSON object) with its `model` field set to `target`; `None` if it is not a
/// JSON object.
pub fn rewrite_body(body: &[u8], target: &str) -> Option<Vec<u8>> {
    let mut doc: serde_json::Value = serde_json::from_slice(body).ok()?;
    doc.as_object_mut()?.insert(
        "model".into(),
        serde_json::Value::String(target.to_string()),
    );
    serde_json::to_vec(&doc).ok()
}

/// `chunk` with `"model":"<sent>"` (with or without a space after the colon) turned back
/// into the client's model name; `None` when nothing matched (the chunk is left as is).
pub fn restore(chunk: &[u8], sent: &str, client: &str) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(chunk).ok()?;
    let mut out = text.to_string();
    for sep in [":", ": "] {
        let from = format!("\"model\"{sep}\"{sent}\"");
        let to = format!("\"model\"{sep}\"{client}\"");
        out = out.replace(&from, &to);
    }
    (out != text).then(|| out.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::load;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn pool() -> Pool {
        load(
            r#"{"pool":{"modelRewrites":[
                {"name":"canary","modelName":"llama","targets":[
                    {"modelName":"llama-v1","weight":90},{"modelName":"llama-v2","weight":10}]},
                {"name":"catch-all","targets":[{"modelName":"default-model"}]}]}}"#,
        )
        .unwrap()
        .pool
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_rule_sends_the_request_as_one_of_its_weighted_targets() {
        let p = pool();
        assert_eq!(target("llama", None, &p, 0.5), "llama-v1");
        assert_eq!(target("llama", None, &p, 0.95), "llama-v2");
        // A model no rule names falls to the rule without a model.
        assert_eq!(target("other", None, &p, 0.5), "default-model");
        // No rule at all: the request's own model.
        assert_eq!(target("m", None, &Pool::default(), 0.5), "m");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_rewrite_header_names_the_model_the_rules_then_apply_to() {
        let p = pool();
        assert_eq!(target("other", Some("llama"), &p, 0.1), "llama-v1");
        assert_eq!(target("llama", Some("x"), &Pool::default(), 0.1), "x");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_body_says_the_target_and_keeps_everything_else() {
        let body = br#"{"model":"llama","prompt":"hi","max_tokens":5}"#;
        let out = rewrite_body(body, "llama-v2").unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["model"], "llama-v2");
        assert_eq!(v["prompt"], "hi");
        assert_eq!(v["max_tokens"], 5);
        assert_eq!(rewrite_body(b"[1,2]", "x"), None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_response_gets_the_clients_model_name_back() {
        let chunk = br#"data: {"id":"1","model":"llama-v2","choices":[]}"#;
        let out = restore(chunk, "llama-v2", "llama").unwrap();
        assert_eq!(
            out,
            br#"data: {"id":"1","model":"llama","choices":[]}"#.to_vec()
        );
        let spaced = br#"{"model": "llama-v2"}"#;
        assert_eq!(
            restore(spaced, "llama-v2", "llama").unwrap(),
            br#"{"model": "llama"}"#.to_vec()
        );
        assert_eq!(restore(br#"{"model":"other"}"#, "llama-v2", "llama"), None);
    }
}
