//! Model rewrites: the model a request is sent as, the body that says so, and the client's
//! model name put back into the response.
//!
//! The target is the rewrite header's model if the client sent one, else the request's;
//! then a matching `pool.modelRewrites` rule (exact model first, then a rule without a
//! model) may replace it with one of its weighted targets. The response carries the
//! served model's name; it is turned back into the client's, chunk by chunk, as the
//! reference's `rewriteModelName` does. Both names are written there as JSON strings
//! ([`json_string`]): a name with `"` or `\` gives back exactly what the client sent.

use crate::config::Pool;

/// The model to send a request for `model` as, and the rule that chose it (if one did).
/// `header` is the rewrite header's value, `draw` a uniform number in [0, 1) for the
/// weighted choice among a rule's targets.
pub fn target<'a>(
    model: &str,
    header: Option<&str>,
    pool: &'a Pool,
    draw: f64,
) -> (String, Option<&'a str>) {
    let named = header.unwrap_or(model);
    match pool.rewrite(named, draw) {
        Some((rule, t)) => (t.to_string(), Some(rule)),
        None => (named.to_string(), None),
    }
}

/// `name` as a JSON string literal, quotes included (`"`, `\` and control characters
/// escaped, as `serde_json` writes them; other characters as they are): how a model name
/// is written into a JSON response, e.g. the client's name put back in place of the
/// model the request was sent as. Every API that restores a model name in a response
/// writes it with this function.
pub fn json_string(name: &str) -> String {
    serde_json::Value::from(name).to_string()
}

/// The model names the configuration names (the rules' incoming models and targets):
/// known to be served from the start, for the metrics' label places.
pub fn configured_models(pool: &Pool) -> Vec<&str> {
    let mut names = Vec::new();
    for rule in &pool.model_rewrites {
        names.extend(rule.model_name.as_deref());
        names.extend(rule.targets.iter().map(|t| t.model_name.as_str()));
    }
    names
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

/// Puts the client's model name back into a response, chunk by chunk: `"model":"<sent>"`
/// (with or without a space after the colon) becomes `"model":"<client>"`, also when a
/// chunk boundary falls inside it (the unfinished tail is held back and joined to the next
/// chunk; the last chunk releases it). Both names are matched and written as JSON strings
/// ([`json_string`]).
#[derive(Debug, Clone)]
pub struct Restorer {
    patterns: [(Vec<u8>, Vec<u8>); 2],
    carry: Vec<u8>,
}

impl Restorer {
    /// Restores `client` where the server says `sent`.
    pub fn new(sent: &str, client: &str) -> Self {
        let (sent, client) = (json_string(sent), json_string(client));
        let pair = |sep: &str| {
            (
                format!("\"model\"{sep}{sent}").into_bytes(),
                format!("\"model\"{sep}{client}").into_bytes(),
            )
        };
        Self {
            patterns: [pair(":"), pair(": ")],
            carry: Vec::new(),
        }
    }

    /// The bytes to send for `chunk` (`end`: the response's last chunk); `None` when they
    /// are the chunk unchanged.
    pub fn chunk(&mut self, chunk: &[u8], end: bool) -> Option<Vec<u8>> {
        if self.carry.is_empty() && !chunk.contains(&b'"') {
            return None;
        }
        let mut data = std::mem::take(&mut self.carry);
        let carried = !data.is_empty();
        data.extend_from_slice(chunk);
        let mut out = Vec::with_capacity(data.len());
        let mut changed = carried;
        let mut i = 0;
        while let Some(rest) = data.get(i..).filter(|r| !r.is_empty()) {
            if rest.first() == Some(&b'"') {
                if let Some((from, to)) = self.patterns.iter().find(|(f, _)| rest.starts_with(f)) {
                    out.extend_from_slice(to);
                    i += from.len();
                    changed = true;
                    continue;
                }
                if !end && self.patterns.iter().any(|(f, _)| f.starts_with(rest)) {
                    self.carry = rest.to_vec();
                    changed = true;
                    break;
                }
            }
            out.extend_from_slice(rest.get(..1).unwrap_or_default());
            i += 1;
        }
        changed.then_some(out)
    }
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
        assert_eq!(target("llama", None, &p, 0.5).0, "llama-v1");
        assert_eq!(target("llama", None, &p, 0.95).0, "llama-v2");
        // A model no rule names falls to the rule without a model.
        assert_eq!(target("other", None, &p, 0.5).0, "default-model");
        // No rule at all: the request's own model.
        assert_eq!(target("m", None, &Pool::default(), 0.5).0, "m");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_rewrite_header_names_the_model_the_rules_then_apply_to() {
        let p = pool();
        assert_eq!(target("other", Some("llama"), &p, 0.1).0, "llama-v1");
        assert_eq!(target("llama", Some("x"), &Pool::default(), 0.1).0, "x");
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

    fn restore(chunk: &[u8]) -> Option<Vec<u8>> {
        Restorer::new("llama-v2", "llama").chunk(chunk, true)
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_response_gets_the_clients_model_name_back() {
        let chunk = br#"data: {"id":"1","model":"llama-v2","choices":[]}"#;
        assert_eq!(
            restore(chunk).unwrap(),
            br#"data: {"id":"1","model":"llama","choices":[]}"#.to_vec()
        );
        assert_eq!(
            restore(br#"{"model": "llama-v2"}"#).unwrap(),
            br#"{"model": "llama"}"#.to_vec()
        );
        assert_eq!(restore(br#"{"model":"other"}"#), None);
        assert_eq!(restore(b"no quotes at all"), None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_name_split_across_chunks_is_restored_at_every_split_point() {
        let body = br#"data: {"model":"llama-v2","x":1}

data: {"model": "llama-v2","model":"llama-v2x"}

"#;
        let want = String::from_utf8(body.to_vec())
            .unwrap()
            .replace("\"llama-v2\"", "\"llama\"");
        for split in 0..=body.len() {
            for second in split..=body.len() {
                let mut r = Restorer::new("llama-v2", "llama");
                let mut out = Vec::new();
                let parts = [&body[..split], &body[split..second], &body[second..]];
                for (k, part) in parts.iter().enumerate() {
                    let end = k == parts.len() - 1;
                    match r.chunk(part, end) {
                        Some(b) => out.extend(b),
                        None => out.extend_from_slice(part),
                    }
                }
                assert_eq!(
                    String::from_utf8(out).unwrap(),
                    want,
                    "split at {split} and {second}"
                );
            }
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_name_that_needs_escaping_comes_back_as_the_client_wrote_it() {
        let client = "x\",\"choices\":[],\"injected\":\"";
        let sent = "llama-v2";
        let body = br#"{"id":"1","model":"llama-v2","choices":[{"text":"hi"}]}"#;
        let out = Restorer::new(sent, client).chunk(body, true).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).expect("valid JSON");
        assert_eq!(v["model"], client, "the client's name, not new fields");
        assert!(v.get("injected").is_none());
        assert_eq!(v["choices"][0]["text"], "hi");
        for name in ["back\\slash", "new\nline", "quote\"", "ctl\u{1}", "é"] {
            let out = Restorer::new(sent, name).chunk(body, true).unwrap();
            let v: serde_json::Value = serde_json::from_slice(&out).expect("valid JSON");
            assert_eq!(v["model"], name);
        }
        // A target that needs escaping is found as the server writes it.
        let served = br#"{"model":"a\"b"}"#;
        let out = Restorer::new("a\"b", "m").chunk(served, true).unwrap();
        assert_eq!(out, br#"{"model":"m"}"#.to_vec());
        assert_eq!(json_string("a\"b\\"), r#""a\"b\\""#);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_configuration_names_its_models() {
        let p = pool();
        assert_eq!(
            configured_models(&p),
            vec!["llama", "llama-v1", "llama-v2", "default-model"]
        );
    }
}
