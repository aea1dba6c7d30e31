//! End to end through a real Envoy 1.40 with the filter (2 workers) in front of two
//! `vllm-sim` servers: the APIs beyond OpenAI's are parsed by their own parsers (Anthropic
//! Messages, vLLM's token-in generate, SGLang's generate, the render paths), any other
//! path is passed through to a server rather than refused, and `requestHandler.parsers`
//! chooses the parsers as the reference's configuration does.

use serde_json::{json, Value};
use tests::envoy::Envoy;
use tests::http::{self, Response};
use tests::openai::MODEL;
use tests::vllm_sim_server::VllmSimServer;

/// The name clients use; the pool rewrites it to the servers' model.
const CLIENT_MODEL: &str = "claude-sim";

fn gateway_with(config: &Value) -> (Vec<VllmSimServer>, Envoy) {
    let servers = VllmSimServer::fast_pool(2);
    let envoy = Envoy::start(config, &VllmSimServer::addresses(&servers), 2);
    (servers, envoy)
}

/// Two servers; requests for [`CLIENT_MODEL`] are sent as [`MODEL`].
fn gateway() -> (Vec<VllmSimServer>, Envoy) {
    gateway_with(
        &json!({"pool": {"maxRequestBodyBytes": 65536, "modelRewrites": [
        {"name": "alias", "modelName": CLIENT_MODEL, "targets": [{"modelName": MODEL}]}]}}),
    )
}

fn post(envoy: &Envoy, path: &str, body: &Value) -> Response {
    http::post_json(&envoy.listen, path, &body.to_string()).expect(path)
}

/// The server that answered, checked against the one the gateway says served it.
fn served(r: &Response, what: &str) -> String {
    let server = r
        .header("x-sim-server")
        .unwrap_or_else(|| panic!("{what}: answered by the gateway: {} {}", r.status, r.text()));
    assert_eq!(
        r.header("x-gateway-destination-endpoint-served"),
        Some(server),
        "{what}"
    );
    server.to_string()
}

/// The `(event, data)` pairs of an Anthropic event stream.
fn events(r: &Response) -> Vec<(String, Value)> {
    let text = r.text();
    let mut out = Vec::new();
    let mut event = String::new();
    for line in text.lines() {
        if let Some(e) = line.strip_prefix("event: ") {
            event = e.to_string();
        } else if let Some(d) = line.strip_prefix("data: ") {
            out.push((event.clone(), serde_json::from_str(d).expect(d)));
        }
    }
    out
}

#[test]
fn anthropic_messages_are_served_with_the_clients_model_and_usage() {
    let (_servers, envoy) = gateway();
    let body = json!({"model": CLIENT_MODEL, "max_tokens": 8,
        "system": [{"type": "text", "text": "You are terse."}],
        "messages": [{"role": "user", "content": "Say something."}]});
    let r = post(&envoy, "/v1/messages", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    served(&r, "messages");
    let v = r.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["content"][0]["type"], "text");
    // Sent as the servers' model, answered as the client's.
    assert_eq!(v["model"], CLIENT_MODEL);
    assert!(v["usage"]["input_tokens"].as_u64().unwrap() > 0);
    assert!(v["usage"]["output_tokens"].as_u64().unwrap() >= 1);

    // Streamed: Anthropic's event sequence, the model restored in `message_start`.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = post(&envoy, "/v1/messages", &streamed);
    assert_eq!(r.status, 200, "{}", r.text());
    served(&r, "streamed messages");
    assert!(r
        .header("content-type")
        .unwrap_or("")
        .starts_with("text/event-stream"));
    let ev = events(&r);
    let names: Vec<&str> = ev.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"), "{names:?}");
    assert_eq!(names.last(), Some(&"message_stop"), "{names:?}");
    assert!(names.contains(&"content_block_delta"), "{names:?}");
    assert_eq!(ev[0].1["message"]["model"], CLIENT_MODEL);
    let delta = ev.iter().find(|(e, _)| e == "message_delta").unwrap();
    assert!(delta.1["usage"]["output_tokens"].as_u64().unwrap() >= 1);

    // count_tokens: routed by load, answered by a server.
    let r = post(
        &envoy,
        "/v1/messages/count_tokens",
        &json!({"model": CLIENT_MODEL, "messages": [{"role": "user", "content": "Count me."}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    served(&r, "count_tokens");
    assert!(r.json()["input_tokens"].as_u64().unwrap() > 0);
}

#[test]
fn the_gateways_own_errors_on_the_messages_path_have_anthropics_shape() {
    let (_servers, envoy) = gateway();
    let r = post(
        &envoy,
        "/v1/messages",
        &json!({"model": CLIENT_MODEL, "max_tokens": 8}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.header("x-sim-server").is_none(), "the gateway answers");
    let v = r.json();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"].as_str().unwrap().contains("messages"));

    let big = "x".repeat(70_000);
    let r = post(
        &envoy,
        "/v1/messages",
        &json!({"model": CLIENT_MODEL, "max_tokens": 8,
                "messages": [{"role": "user", "content": big}]}),
    );
    assert_eq!(r.status, 413, "{}", r.text());
    let v = r.json();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "request_too_large");

    // The OpenAI paths keep OpenAI's shape.
    let r = post(&envoy, "/v1/chat/completions", &json!({"model": MODEL}));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], 400);
}

#[test]
fn token_in_generate_is_served_and_keeps_its_prefix_on_one_server() {
    let (_servers, envoy) = gateway();
    // A conversation's token ids growing turn by turn, as a token-in client sends them.
    let mut ids: Vec<u32> = (0..600).map(|i| 1000 + i * 7 % 5000).collect();
    let mut first = None;
    for turn in 0..6 {
        let body = json!({"token_ids": ids, "sampling_params": {"max_tokens": 4},
                          "model": MODEL});
        let r = post(&envoy, "/inference/v1/generate", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let server = served(&r, "generate");
        let v = r.json();
        assert!(!v["choices"][0]["token_ids"].as_array().unwrap().is_empty());
        assert_eq!(v["usage"]["prompt_tokens"], ids.len());
        assert_eq!(*first.get_or_insert(server.clone()), server, "turn {turn}");
        ids.extend(
            v["choices"][0]["token_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32),
        );
        ids.extend(2000..2050);
    }
    // Streamed, with usage.
    let r = post(
        &envoy,
        "/inference/v1/generate",
        &json!({"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 3}, "stream": true,
                "stream_options": {"include_usage": true}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    served(&r, "streamed generate");
    assert!(r.text().contains("\"usage\""), "{}", r.text());
    assert!(r.text().trim_end().ends_with("data: [DONE]"));
    // Without token ids the gateway refuses it (as the reference's vllmhttp-parser).
    let r = post(
        &envoy,
        "/inference/v1/generate",
        &json!({"sampling_params": {}}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "token_ids");
}

#[test]
fn unknown_paths_sglang_generate_and_render_reach_a_server() {
    let (_servers, envoy) = gateway();
    // A path no parser claims is passed through: the server answers what it finds wrong.
    let r = post(&envoy, "/v1/some/future/api", &json!({"anything": [1, 2]}));
    served(&r, "unknown path");
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.json()["detail"], "Not Found");
    let r = http::request(
        &envoy.listen,
        "POST",
        "/v2/opaque",
        &[],
        b"\x00\x01 not json",
    )
    .unwrap();
    served(&r, "opaque body");
    // SGLang's native generate.
    let r = post(
        &envoy,
        "/generate",
        &json!({"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    served(&r, "sglang generate");
    assert_eq!(r.json()["meta_info"]["prompt_tokens"], 3);
    // The render paths: routed (by load: sequential requests against idle servers may all
    // find the same one least loaded, so no spread is asserted), answered by a server
    // with the token-in request.
    for i in 0..12 {
        let r = post(
            &envoy,
            "/v1/chat/completions/render",
            &json!({"model": MODEL, "messages": [{"role": "user", "content": format!("hi {i}")}]}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        served(&r, "render");
        assert!(!r.json()["token_ids"].as_array().unwrap().is_empty());
    }
    let r = post(
        &envoy,
        "/v1/completions/render",
        &json!({"model": MODEL, "prompt": "hello"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn request_handler_parsers_load_as_the_reference_writes_them() {
    // The reference's shape: the parser declared as a plugin, referenced by name.
    let (_servers, envoy) = gateway_with(&json!({
        "plugins": [{"type": "random-picker"}, {"type": "passthrough-parser"}],
        "requestHandler": {"parsers": [{"pluginRef": "passthrough-parser"}]},
        "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "random-picker"}]}]
    }));
    // Everything passes through, even a completion the OpenAI parser would refuse.
    let r = post(
        &envoy,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "hi", "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    served(&r, "passthrough");
    let r = post(&envoy, "/v1/completions", &json!({"prompt": "no model"}));
    served(&r, "passthrough of a bad body");

    // An explicit list without a fallback: a path no parser claims is the gateway's 404.
    let (_servers, envoy) = gateway_with(&json!({
        "plugins": [{"name": "vllm", "type": "vllmhttp-parser"}, {"name": "oai", "type": "openai-parser"}],
        "requestHandler": {"parsers": [{"pluginRef": "vllm"}, {"pluginRef": "oai"}]}
    }));
    let r = post(&envoy, "/v1/messages", &json!({"model": MODEL}));
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(r.header("x-sim-server").is_none());
    assert!(r.text().contains("requestHandler.parsers"), "{}", r.text());
    let r = post(
        &envoy,
        "/inference/v1/generate",
        &json!({"token_ids": [1], "sampling_params": {}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}
