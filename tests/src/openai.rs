//! What the tests ask the gateway for: the model every simulated server serves, and
//! OpenAI request bodies.

use serde_json::json;

/// The model every `vllm-sim` of the tests serves (`--model`).
pub const MODEL: &str = "sim-model";

/// A `/v1/completions` body for [`MODEL`].
pub fn completion(prompt: &str, max_tokens: u32, stream: bool) -> String {
    json!({"model": MODEL, "prompt": prompt, "stream": stream, "max_tokens": max_tokens})
        .to_string()
}
