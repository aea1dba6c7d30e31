//! End-to-end tests of the HTTP server: start it on an ephemeral port, talk
//! to it over loopback, check what a client relies on.

mod common;

use common::{metric, read_sse, start, zero_config, Client};
use serde_json::{json, Value};
use std::time::Duration;

#[tokio::test]
async fn streamed_chat_follows_vllm_chunk_sequence_and_names_the_server() {
    let server = start(zero_config()).await;
    let addr = server.addrs()[0];
    let mut c = Client::connect(addr).await;
    let body = json!({"model": "sim-model", "messages": [{"role": "user", "content": "Hello there"}],
                      "max_tokens": 5, "ignore_eos": true, "stream": true,
                      "stream_options": {"include_usage": true}});
    let resp = c
        .send("POST", "/v1/chat/completions", &body.to_string(), &[])
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-sim-server"], addr.to_string().as_str());
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let events = read_sse(resp).await;
    let payloads: Vec<&str> = events.iter().map(|(_, p)| p.as_str()).collect();
    // role + 5 tokens + finish + usage + [DONE]
    assert_eq!(payloads.len(), 9, "{payloads:#?}");
    assert_eq!(*payloads.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = payloads[..8]
        .iter()
        .map(|p| serde_json::from_str(p).unwrap())
        .collect();
    for ch in &chunks {
        assert_eq!(ch["object"], "chat.completion.chunk");
        assert_eq!(ch["model"], "sim-model");
        assert!(ch["id"].as_str().unwrap().starts_with("chatcmpl-"));
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    for ch in &chunks[1..6] {
        assert!(!ch["choices"][0]["delta"]["content"]
            .as_str()
            .unwrap()
            .is_empty());
        assert!(ch["choices"][0]["finish_reason"].is_null());
        assert!(ch.get("usage").is_some_and(Value::is_null));
    }
    assert_eq!(chunks[6]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[7]["choices"], json!([]));
    let usage = &chunks[7]["usage"];
    assert_eq!(usage["completion_tokens"], 5);
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 0);
    assert_eq!(usage["total_tokens"], prompt_tokens + 5);
    // Nothing cached: vLLM leaves `prompt_tokens_details` out of a stream chunk.
    assert!(usage.get("prompt_tokens_details").is_none(), "{usage}");
}

#[tokio::test]
async fn non_streamed_completion_has_usage_and_one_choice_per_prompt() {
    let server = start(zero_config()).await;
    let mut c = Client::connect(server.addrs()[0]).await;
    let (status, v) = c
        .post_json("/v1/completions", json!({"prompt": ["one prompt", "and another one"], "max_tokens": 7, "ignore_eos": true}))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    for (i, ch) in choices.iter().enumerate() {
        assert_eq!(ch["index"], i);
        assert_eq!(ch["finish_reason"], "length");
        assert!(!ch["text"].as_str().unwrap().is_empty());
    }
    assert_eq!(v["usage"]["completion_tokens"], 14);
    assert_eq!(v["usage"]["prompt_tokens"], 3 + 4);
    // Nothing cached: vLLM writes `"prompt_tokens_details": null` in a whole body.
    assert!(v["usage"]["prompt_tokens_details"].is_null(), "{v}");
    assert!(v["usage"].get("prompt_tokens_details").is_some(), "{v}");

    // Without ignore_eos the length is drawn, but never above max_tokens.
    for _ in 0..20 {
        let (_, v) = c
            .post_json("/v1/completions", json!({"prompt": "x", "max_tokens": 3}))
            .await;
        let n = v["usage"]["completion_tokens"].as_u64().unwrap();
        assert!((1..=3).contains(&n));
    }
}

#[tokio::test]
async fn errors_are_openai_shaped_with_vllm_statuses() {
    let mut config = zero_config();
    config.engine.max_model_len = 64;
    let server = start(config).await;
    let mut c = Client::connect(server.addrs()[0]).await;

    let (status, text, headers) = c.call("POST", "/v1/completions", "{not json").await;
    assert_eq!(status, 400);
    assert!(headers.contains_key("x-sim-server"));
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["type"], "BadRequestError");
    assert_eq!(v["error"]["code"], 400);
    assert!(v["error"]["param"].is_null());

    let (status, v) = c
        .post_json(
            "/v1/chat/completions",
            json!({"model": "other", "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(status, 404);
    assert_eq!(v["error"]["message"], "The model `other` does not exist.");
    assert_eq!(v["error"]["type"], "NotFoundError");

    let long = "word ".repeat(60); // 75 tokens > 64
    let (status, v) = c
        .post_json("/v1/completions", json!({"prompt": long, "max_tokens": 10}))
        .await;
    assert_eq!(status, 400);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("This model's maximum context length is 64 tokens."));

    let (status, v) = c
        .post_json("/v1/completions", json!({"prompt": "x", "max_tokens": 0}))
        .await;
    assert_eq!(status, 400, "{v}");

    let (status, _, _) = c.call("GET", "/nope", "").await;
    assert_eq!(status, 404);
    let (status, _, _) = c.call("GET", "/v1/completions", "").await;
    assert_eq!(status, 405);
}

#[tokio::test]
async fn metrics_expose_vllm_names_and_move_with_requests() {
    let server = start(zero_config()).await;
    let mut c = Client::connect(server.addrs()[0]).await;
    let (status, before, headers) = c.call("GET", "/metrics", "").await;
    assert_eq!(status, 200);
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    for series in [
        "vllm:num_requests_running{model_name=\"sim-model\"}",
        "vllm:num_requests_waiting{model_name=\"sim-model\"}",
        "vllm:kv_cache_usage_perc{model_name=\"sim-model\"}",
    ] {
        assert_eq!(metric(&before, series), Some(0.0), "{series}");
    }
    assert!(before.contains("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"4096\"} 1"));
    let gen = "vllm:generation_tokens_total{model_name=\"sim-model\"}";
    assert_eq!(metric(&before, gen), Some(0.0));
    let (status, _) = c
        .post_json(
            "/v1/completions",
            json!({"prompt": "hello", "max_tokens": 4, "ignore_eos": true}),
        )
        .await;
    assert_eq!(status, 200);
    let (_, after, _) = c.call("GET", "/metrics", "").await;
    assert_eq!(metric(&after, gen), Some(4.0));
    assert_eq!(
        metric(
            &after,
            "vllm:request_success_total{finished_reason=\"length\",model_name=\"sim-model\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &after,
            "vllm:time_to_first_token_seconds_count{model_name=\"sim-model\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &after,
            "vllm:inter_token_latency_seconds_count{model_name=\"sim-model\"}"
        ),
        Some(3.0)
    );
}

#[tokio::test]
async fn streamed_tokens_leave_as_they_are_produced() {
    let mut config = zero_config();
    config.engine.latency.inter_token_latency = Duration::from_millis(40);
    let server = start(config).await;
    let mut c = Client::connect(server.addrs()[0]).await;
    let body = json!({"prompt": "stream me", "max_tokens": 4, "ignore_eos": true, "stream": true});
    // Twice on one kept-alive connection: the delayed-ACK pitfall shows on the second.
    for _ in 0..2 {
        let resp = c
            .send("POST", "/v1/completions", &body.to_string(), &[])
            .await;
        let events = read_sse(resp).await;
        assert_eq!(events.len(), 4 + 1 + 1, "4 tokens, finish, [DONE]");
        // The 4 tokens come from 4 decode-bearing steps 40 ms apart (the first
        // step only prefills), so the first token arrives well before the last.
        let gap = events[3].0 - events[0].0;
        assert!(
            gap >= Duration::from_millis(100),
            "tokens were batched: {gap:?}"
        );
    }
}
