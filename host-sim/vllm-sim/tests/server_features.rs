//! Server features a test harness relies on: startup delay, failure
//! injection, the admin endpoint, LoRA endpoints, P/D, prefix-cache usage,
//! 429 on overload, data-parallel ranks.

mod common;

use common::{metric, read_sse, start, zero_config, Client};
use serde_json::json;
use std::time::{Duration, Instant};
use vllm_sim::failures::FailureType;

#[tokio::test]
async fn ready_is_503_until_the_startup_delay_has_passed() {
    let mut config = zero_config();
    config.startup_duration = Duration::from_millis(300);
    let server = start(config).await;
    let mut c = Client::connect(server.addrs()[0]).await;
    let (status, _, _) = c.call("GET", "/health/ready", "").await;
    assert_eq!(status, 503);
    let (status, _, _) = c.call("GET", "/health", "").await;
    assert_eq!(status, 200);
    let (status, v) = c.post_json("/v1/completions", json!({"prompt": "x"})).await;
    assert_eq!(status, 503, "{v}");
    tokio::time::sleep(Duration::from_millis(350)).await;
    let (status, _, _) = c.call("GET", "/health/ready", "").await;
    assert_eq!(status, 200);
    let (status, _) = c.post_json("/v1/completions", json!({"prompt": "x"})).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn injected_failures_and_the_x_return_error_header() {
    let mut config = zero_config();
    config.failures.rate_percent = 100.0;
    config.failures.types = vec![FailureType::RateLimit];
    let server = start(config).await;
    let mut c = Client::connect(server.addrs()[0]).await;
    let body = json!({"prompt": "x"}).to_string();
    let (status, text, _) = c.call("POST", "/v1/completions", &body).await;
    assert_eq!(status, 429);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["type"], "RateLimitError");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("Rate limit reached for sim-model"));
    // The header wins over the random draw.
    let (status, text, _) = c
        .call_with(
            "POST",
            "/v1/chat/completions",
            &body,
            &[("X-Return-Error", "503")],
        )
        .await;
    assert_eq!(status, 503);
    assert!(text.contains("InternalServerError"));
    let (status, _, _) = c
        .call_with(
            "POST",
            "/v1/completions",
            &body,
            &[("X-Return-Error", "nope")],
        )
        .await;
    assert_eq!(status, 400);
    // Failures never touch the other endpoints.
    let (status, _, _) = c.call("GET", "/v1/models", "").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn admin_config_makes_a_server_slow_then_failing_mid_run() {
    let server = start(zero_config()).await;
    let mut c = Client::connect(server.addrs()[0]).await;
    let stream_body =
        json!({"prompt": "timed", "max_tokens": 4, "ignore_eos": true, "stream": true}).to_string();

    let started = Instant::now();
    let events = read_sse(c.send("POST", "/v1/completions", &stream_body, &[]).await).await;
    assert_eq!(events.len(), 6);
    let fast = started.elapsed();

    let (status, v) = c
        .post_json("/admin/config", json!({"inter_token_latency": "60ms"}))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["inter_token_latency"], "60ms");
    let started = Instant::now();
    let events = read_sse(c.send("POST", "/v1/completions", &stream_body, &[]).await).await;
    assert_eq!(events.len(), 6);
    let slow = started.elapsed();
    // The first token ends the (instant) prefill step; three 60 ms decode steps follow.
    assert!(
        slow >= Duration::from_millis(180),
        "slow {slow:?}, fast {fast:?}"
    );

    let (status, _) = c
        .post_json(
            "/admin/config",
            json!({"failure_injection_rate": 100, "failure_types": ["server_error"]}),
        )
        .await;
    assert_eq!(status, 200);
    let (status, v) = c.post_json("/v1/completions", json!({"prompt": "x"})).await;
    assert_eq!(status, 503);
    assert_eq!(
        v["error"]["message"],
        "The server is overloaded or not ready yet."
    );

    let (status, text, _) = c.call("GET", "/admin/config", "").await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["failure_injection_rate"], 100.0);
    assert_eq!(v["failure_types"], json!(["server_error"]));
    let (status, _) = c
        .post_json("/admin/config", json!({"no_such_knob": 1}))
        .await;
    assert_eq!(status, 400);
    let (status, _) = c
        .post_json("/admin/config", json!({"failure_injection_rate": 0}))
        .await;
    assert_eq!(status, 200);
    let (status, _) = c
        .post_json("/v1/completions", json!({"prompt": "x", "max_tokens": 1}))
        .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn lora_adapters_load_unload_and_serve() {
    let mut config = zero_config();
    config.lora_modules = vec![vllm_sim::server::LoraModule {
        name: "sql-lora".into(),
        path: "/loras/sql".into(),
    }];
    let server = start(config).await;
    let mut c = Client::connect(server.addrs()[0]).await;
    let (status, v) = c
        .post_json(
            "/v1/load_lora_adapter",
            json!({"lora_name": "chat-lora", "lora_path": "/loras/chat"}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, _) = c
        .post_json(
            "/v1/load_lora_adapter",
            json!({"lora_name": "chat-lora", "lora_path": "/loras/chat"}),
        )
        .await;
    assert_eq!(status, 400);

    let (_, text, _) = c.call("GET", "/v1/models", "").await;
    let models: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["sim-model", "chat-lora", "sql-lora"]);
    assert_eq!(models["data"][1]["parent"], "sim-model");
    assert_eq!(models["data"][1]["root"], "/loras/chat");

    let (status, v) = c
        .post_json(
            "/v1/completions",
            json!({"model": "chat-lora", "prompt": "x", "max_tokens": 2}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["model"], "chat-lora");

    let (status, _) = c
        .post_json("/v1/unload_lora_adapter", json!({"lora_name": "chat-lora"}))
        .await;
    assert_eq!(status, 200);
    let (status, _) = c
        .post_json("/v1/unload_lora_adapter", json!({"lora_name": "chat-lora"}))
        .await;
    assert_eq!(status, 404);
    let (status, _) = c
        .post_json(
            "/v1/completions",
            json!({"model": "chat-lora", "prompt": "x"}),
        )
        .await;
    assert_eq!(status, 404);
    let (_, text, _) = c.call("GET", "/metrics", "").await;
    assert!(text.contains("vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"}"));
}

#[tokio::test]
async fn pd_prefill_side_returns_kv_transfer_params() {
    let server = start(zero_config()).await;
    let mut c = Client::connect(server.addrs()[0]).await;
    let (status, v) = c
        .post_json("/v1/completions", json!({"prompt": "prefill me", "max_tokens": 50, "kv_transfer_params": {"do_remote_decode": true}}))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "remote_decode");
    assert_eq!(v["usage"]["completion_tokens"], 1);
    assert_eq!(v["kv_transfer_params"]["do_remote_prefill"], true);
    assert_eq!(
        v["kv_transfer_params"]["remote_block_ids"],
        json!(["DUMMY_ID"])
    );
    let (status, _) = c
        .post_json("/v1/completions", json!({"prompt": "x", "stream": true, "kv_transfer_params": {"do_remote_decode": true}}))
        .await;
    assert_eq!(status, 400);
    let (status, v) = c
        .post_json("/v1/completions", json!({"prompt": "decode me", "max_tokens": 3, "ignore_eos": true, "kv_transfer_params": {"do_remote_prefill": true}}))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 3);
}

#[tokio::test]
async fn repeated_prefix_reports_cached_tokens_over_http() {
    let server = start(zero_config()).await;
    let mut c = Client::connect(server.addrs()[0]).await;
    let system = "You are the assistant of a gateway test suite. ".repeat(10);
    let chat = |q: &str| json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}], "max_tokens": 2});
    let (_, first) = c
        .post_json("/v1/chat/completions", chat("first question"))
        .await;
    let (_, second) = c
        .post_json("/v1/chat/completions", chat("second question"))
        .await;
    assert!(first["usage"]["prompt_tokens_details"].is_null(), "{first}");
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached >= 112, "{second}"); // the 470-char system prompt is ≥ 117 tokens
    assert_eq!(cached % 16, 0);
    let (_, text, _) = c.call("GET", "/metrics", "").await;
    assert_eq!(
        metric(
            &text,
            "vllm:prefix_cache_hits_total{model_name=\"sim-model\"}"
        ),
        Some(cached as f64)
    );
}

#[tokio::test]
async fn overload_gives_waiting_requests_then_429() {
    let mut config = zero_config();
    config.engine.max_num_seqs = 1;
    config.engine.max_waiting_queue_length = 1;
    config.engine.latency.inter_token_latency = Duration::from_millis(50);
    let server = start(config).await;
    let addr = server.addrs()[0];
    let long = json!({"prompt": "occupy", "max_tokens": 20, "ignore_eos": true, "stream": true})
        .to_string();

    // 1. A running request (we have seen its first token).
    let mut first = Client::connect(addr).await;
    let resp = first.send("POST", "/v1/completions", &long, &[]).await;
    assert_eq!(resp.status(), 200);
    let running = tokio::spawn(read_sse(resp));
    // 2. A waiting one.
    let mut second = Client::connect(addr).await;
    let waiting = tokio::spawn(async move {
        second
            .post_json(
                "/v1/completions",
                json!({"prompt": "wait", "max_tokens": 1}),
            )
            .await
    });
    let mut probe = Client::connect(addr).await;
    let mut seen = (0.0, 0.0);
    for _ in 0..100 {
        let (_, text, _) = probe.call("GET", "/metrics", "").await;
        seen = (
            metric(&text, "vllm:num_requests_running{model_name=\"sim-model\"}").unwrap_or(0.0),
            metric(&text, "vllm:num_requests_waiting{model_name=\"sim-model\"}").unwrap_or(0.0),
        );
        if seen == (1.0, 1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen, (1.0, 1.0));
    // 3. No room left.
    let (status, v) = probe
        .post_json("/v1/completions", json!({"prompt": "rejected"}))
        .await;
    assert_eq!(status, 429);
    assert_eq!(
        v["error"]["message"],
        "Failed to enqueue request, waiting requests queue is full"
    );
    assert_eq!(running.await.unwrap().len(), 22);
    assert_eq!(waiting.await.unwrap().0, 200);
}

#[tokio::test]
async fn data_parallel_ranks_are_separate_servers() {
    let mut config = zero_config();
    config.data_parallel_size = 3;
    config.server_name = Some("pod-a".into());
    let server = start(config).await;
    assert_eq!(server.addrs().len(), 3);
    assert_eq!(server.names(), vec!["pod-a-0", "pod-a-1", "pod-a-2"]);
    for (addr, name) in server.addrs().into_iter().zip(server.names()) {
        let mut c = Client::connect(addr).await;
        let (status, _, headers) = c
            .call(
                "POST",
                "/v1/completions",
                &json!({"prompt": "x", "max_tokens": 1}).to_string(),
            )
            .await;
        assert_eq!(status, 200);
        assert_eq!(headers["x-sim-server"], name.as_str());
        let (_, text, _) = c.call("GET", "/metrics", "").await;
        // Each rank counts only its own request.
        assert_eq!(
            metric(
                &text,
                "vllm:generation_tokens_total{model_name=\"sim-model\"}"
            ),
            Some(1.0)
        );
    }
}

#[tokio::test]
async fn priority_policy_serves_the_lower_body_priority_first_and_fcfs_refuses_it() {
    let mut config = zero_config();
    config.engine.max_num_seqs = 1;
    config.engine.scheduling_policy = vllm_sim::engine::SchedulingPolicy::Priority;
    config.engine.latency.inter_token_latency = Duration::from_millis(20);
    let server = start(config).await;
    let addr = server.addrs()[0];

    // The only slot is taken; then a batch request (priority 10) and an
    // interactive one (0) wait, in that order.
    let mut first = Client::connect(addr).await;
    let long = json!({"prompt": "occupy", "max_tokens": 20, "ignore_eos": true, "stream": true});
    let resp = first
        .send("POST", "/v1/completions", &long.to_string(), &[])
        .await;
    assert_eq!(resp.status(), 200);
    let running = tokio::spawn(read_sse(resp));
    let mut probe = Client::connect(addr).await;
    let mut waiting = Vec::new();
    for (name, priority) in [("batch", 10), ("interactive", 0)] {
        let mut c = Client::connect(addr).await;
        waiting.push(tokio::spawn(async move {
            let body =
                json!({"prompt": name, "max_tokens": 2, "ignore_eos": true, "priority": priority});
            let (status, _) = c.post_json("/v1/completions", body).await;
            (status, Instant::now())
        }));
        let want = waiting.len() as f64;
        for _ in 0..100 {
            let (_, text, _) = probe.call("GET", "/metrics", "").await;
            if metric(&text, "vllm:num_requests_waiting{model_name=\"sim-model\"}") == Some(want) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    running.await.unwrap();
    let interactive = waiting.pop().unwrap().await.unwrap();
    let batch = waiting.pop().unwrap().await.unwrap();
    assert_eq!((batch.0, interactive.0), (200, 200));
    assert!(
        interactive.1 < batch.1,
        "the interactive request went first"
    );

    // The default policy answers a priority with vLLM's 400.
    let server = start(zero_config()).await;
    let mut c = Client::connect(server.addrs()[0]).await;
    let (status, v) = c
        .post_json("/v1/completions", json!({"prompt": "x", "priority": -1}))
        .await;
    assert_eq!(status, 400);
    assert_eq!(
        v["error"]["message"],
        "Got priority -1 but Priority scheduling is not enabled."
    );
}
