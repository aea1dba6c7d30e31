//! End to end through a real Envoy 1.40 with the filter (2 workers) in front of two
//! `vllm-sim` servers: every API vLLM serves besides completions and chat — responses,
//! embeddings, rerank, score, pooling, classify, tokenize, detokenize, conversations and
//! audio — is routed and served where the gateway says.

use serde_json::{json, Value};
use std::collections::HashMap;
use tests::envoy::Envoy;
use tests::http::{self, Response};
use tests::openai::MODEL;
use tests::vllm_sim_server::VllmSimServer;

/// Two fast servers and Envoy with the default configuration in front of them.
fn gateway() -> (Vec<VllmSimServer>, Envoy) {
    let servers = VllmSimServer::fast_pool(2);
    let envoy = Envoy::start(&json!({}), &VllmSimServer::addresses(&servers), 2);
    (servers, envoy)
}

/// Asserts that a server answered `what` with 200 where the gateway says it did;
/// returns that server.
fn served(r: &Response, what: &str) -> String {
    assert_eq!(r.status, 200, "{what}: {}", r.text());
    let server = r
        .header("x-sim-server")
        .unwrap_or_else(|| panic!("{what}: no x-sim-server"));
    let gateway = r
        .header("x-gateway-destination-endpoint-served")
        .unwrap_or_else(|| panic!("{what}: no x-gateway-destination-endpoint-served"));
    assert_eq!(
        gateway, server,
        "{what}: served header vs the server that answered"
    );
    server.to_string()
}

fn post(envoy: &Envoy, path: &str, body: &Value) -> Response {
    http::post_json(&envoy.listen, path, &body.to_string()).expect(path)
}

/// A `multipart/form-data` body with a `model` field and a `file` of `audio`.
fn multipart(boundary: &str, audio: &[u8]) -> Vec<u8> {
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{MODEL}\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"clip.wav\"\r\n\
         Content-Type: audio/wav\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(audio);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    body
}

#[test]
fn every_api_is_served_where_the_gateway_says() {
    let (servers, envoy) = gateway();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut count = |server: String| *seen.entry(server).or_default() += 1;

    // Responses, non-streamed and streamed.
    let r = post(
        &envoy,
        "/v1/responses",
        &json!({"model": MODEL, "input": "Say something.", "max_output_tokens": 4}),
    );
    count(served(&r, "responses"));
    let v = r.json();
    assert_eq!(v["object"], "response");
    assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
    assert!(v["usage"]["output_tokens"].as_u64().unwrap() >= 1);
    let r = post(
        &envoy,
        "/v1/responses",
        &json!({"model": MODEL, "input": "Stream it.", "max_output_tokens": 4, "stream": true}),
    );
    count(served(&r, "streamed responses"));
    assert!(r
        .header("content-type")
        .unwrap_or("")
        .starts_with("text/event-stream"));
    let text = r.text();
    assert!(text.starts_with("event: response.created\n"), "{text}");
    assert!(
        text.contains("event: response.output_text.delta\n"),
        "{text}"
    );
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    assert!(last.starts_with("event: response.completed\n"), "{text}");

    // Embeddings: one vector per input.
    let r = post(
        &envoy,
        "/v1/embeddings",
        &json!({"model": MODEL, "input": ["first input", "second input"]}),
    );
    count(served(&r, "embeddings"));
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    assert_eq!(v["data"][1]["object"], "embedding");
    assert!(!v["data"][1]["embedding"].as_array().unwrap().is_empty());
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);

    // Rerank, under its three paths.
    for path in ["/rerank", "/v1/rerank", "/v2/rerank"] {
        let r = post(
            &envoy,
            path,
            &json!({"model": MODEL, "query": "which?", "documents": ["one doc", "another doc"]}),
        );
        count(served(&r, path));
        let v = r.json();
        let results = v["results"].as_array().unwrap();
        assert_eq!(results.len(), 2, "{path}");
        assert!(results[0]["relevance_score"].is_f64());
        assert!(results[0]["document"]["text"].is_string());
        assert!(v["usage"]["total_tokens"].as_u64().unwrap() > 0);
    }

    // Score, under its two paths.
    for path in ["/score", "/v1/score"] {
        let r = post(
            &envoy,
            path,
            &json!({"model": MODEL, "text_1": "a query", "text_2": ["a doc", "b doc"]}),
        );
        count(served(&r, path));
        let v = r.json();
        assert_eq!(v["object"], "list");
        assert_eq!(v["data"][1]["object"], "score");
        assert!(v["data"][1]["score"].is_f64());
    }

    // Pooling and classify.
    let r = post(
        &envoy,
        "/pooling",
        &json!({"model": MODEL, "input": "pool this"}),
    );
    count(served(&r, "pooling"));
    let v = r.json();
    assert_eq!(v["data"][0]["object"], "pooling");
    assert!(v["data"][0]["data"].is_array());
    let r = post(
        &envoy,
        "/classify",
        &json!({"model": MODEL, "input": ["good", "bad"]}),
    );
    count(served(&r, "classify"));
    let v = r.json();
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    assert!(v["data"][0]["label"].is_string());
    assert_eq!(v["data"][0]["num_classes"], 2);
    assert_eq!(v["data"][0]["probs"].as_array().unwrap().len(), 2);

    // Tokenize, then detokenize its tokens (on whichever server the gateway picks: the
    // text comes back whole where it was tokenized).
    let prompt = "Tokenize this sentence, please.";
    let r = post(
        &envoy,
        "/tokenize",
        &json!({"model": MODEL, "prompt": prompt}),
    );
    let tokenized_on = served(&r, "tokenize");
    count(tokenized_on.clone());
    let v = r.json();
    let tokens = v["tokens"].clone();
    assert_eq!(v["count"], tokens.as_array().unwrap().len());
    assert!(v["max_model_len"].as_u64().unwrap() > 0);
    let r = post(
        &envoy,
        "/detokenize",
        &json!({"model": MODEL, "tokens": tokens}),
    );
    let detokenized_on = served(&r, "detokenize");
    count(detokenized_on.clone());
    let text = r.json()["prompt"].as_str().expect("prompt").to_string();
    if detokenized_on == tokenized_on {
        assert_eq!(text, prompt);
    }

    // Conversations: create, then its items on the server that has it.
    let r = post(
        &envoy,
        "/v1/conversations",
        &json!({"metadata": {"topic": "e2e"}}),
    );
    count(served(&r, "create a conversation"));
    let v = r.json();
    assert_eq!(v["object"], "conversation");
    assert_eq!(v["metadata"], json!({"topic": "e2e"}));
    assert!(v["id"].as_str().unwrap().starts_with("conv_"));
    assert!(v["created_at"].is_u64());

    // Audio: multipart transcription and translation.
    let audio: Vec<u8> = (0..32_000u32).map(|i| (i % 251) as u8).collect();
    let body = multipart("e2e-boundary", &audio);
    for path in ["/v1/audio/transcriptions", "/v1/audio/translations"] {
        let r = http::request(
            &envoy.listen,
            "POST",
            path,
            &[("content-type", "multipart/form-data; boundary=e2e-boundary")],
            &body,
        )
        .expect(path);
        count(served(&r, path));
        let v = r.json();
        assert!(!v["text"].as_str().unwrap().is_empty(), "{path}: {v}");
    }
    let r = http::request(
        &envoy.listen,
        "POST",
        "/v1/audio/transcriptions",
        &[("content-type", "multipart/form-data; boundary=e2e-boundary")],
        &body,
    )
    .unwrap();
    assert_eq!(r.json()["usage"], json!({"type": "duration", "seconds": 1}));

    // Everything was served by the pool (and by both of its servers).
    let addresses = VllmSimServer::addresses(&servers);
    assert!(
        seen.keys().all(|s| addresses.contains(&s.as_str())),
        "{seen:?}"
    );
    assert_eq!(seen.values().sum::<usize>(), 15);
    assert_eq!(seen.len(), 2, "{seen:?}");
}

#[test]
fn pooling_bodies_reach_the_server_and_responses_are_validated_by_the_gateway() {
    let (_servers, envoy) = gateway();
    // Not JSON: the gateway does not judge an embeddings body, the server answers its 400.
    let r = http::post_json(&envoy.listen, "/v1/embeddings", "this is not JSON").unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    let server = r.header("x-sim-server").expect("answered by a server");
    assert_eq!(
        r.header("x-gateway-destination-endpoint-served"),
        Some(server)
    );
    assert_eq!(r.json()["error"]["type"], "BadRequestError");
    // No input: the server's 400 names it.
    let r = post(&envoy, "/v1/embeddings", &json!({"model": MODEL}));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.header("x-sim-server").is_some());
    assert_eq!(r.json()["error"]["param"], "input");

    // A response request without input: the gateway's own 400, naming `input`.
    let r = post(&envoy, "/v1/responses", &json!({"model": MODEL}));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.header("x-sim-server"), None, "the gateway answered");
    let v = r.json();
    assert_eq!(v["error"]["param"], "input");
    assert!(v["error"]["message"].as_str().unwrap().contains("input"));
}

#[test]
fn a_conversation_is_read_back_from_the_server_that_created_it() {
    let (servers, envoy) = gateway();
    // Conversations live in memory on the server that created them; body-less GETs are
    // routed by load (ties at random), so each server gets some of them.
    let r = post(&envoy, "/v1/conversations", &json!({}));
    let owner = served(&r, "create");
    let created = r.json();
    let id = created["id"].as_str().unwrap().to_string();
    let mut found = 0;
    let mut missing = 0;
    for _ in 0..40 {
        let r = http::get(&envoy.listen, &format!("/v1/conversations/{id}")).unwrap();
        let server = r.header("x-sim-server").expect("x-sim-server").to_string();
        assert_eq!(
            r.header("x-gateway-destination-endpoint-served"),
            Some(server.as_str())
        );
        if server == owner {
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(r.json(), created);
            found += 1;
        } else {
            assert_eq!(r.status, 404, "{}", r.text());
            assert_eq!(r.json()["error"]["type"], "NotFoundError");
            missing += 1;
        }
        if found > 0 && missing > 0 {
            break;
        }
    }
    assert!(found > 0 && missing > 0, "found {found}, missing {missing}");
    assert_eq!(servers.len(), 2);
    // Items go where the conversation is, or 404.
    let r = http::request(
        &envoy.listen,
        "POST",
        &format!("/v1/conversations/{id}/items"),
        &[("content-type", "application/json")],
        json!({"items": [{"role": "user", "content": "hello"}]})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    let server = r.header("x-sim-server").unwrap();
    let expected = if server == owner { 200 } else { 404 };
    assert_eq!(r.status, expected, "{}", r.text());
}

#[test]
fn identical_long_embeddings_inputs_land_on_the_same_server() {
    let (_servers, envoy) = gateway();
    // The prefix index learns pooling prompts as it learns completions.
    let input = "A long passage to embed, identical in every request. ".repeat(20);
    let body = json!({"model": MODEL, "input": input});
    let first = served(&post(&envoy, "/v1/embeddings", &body), "first");
    for i in 0..8 {
        let again = served(&post(&envoy, "/v1/embeddings", &body), "again");
        assert_eq!(again, first, "request {i}");
    }
    // Different inputs still spread over the pool.
    let mut seen = std::collections::HashSet::new();
    for i in 0..20 {
        let input = format!("{i} an unrelated passage {i} ").repeat(8);
        let body = json!({"model": MODEL, "input": input});
        seen.insert(served(&post(&envoy, "/v1/embeddings", &body), "other"));
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
}
