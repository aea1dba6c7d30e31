//! The `vllm-sim` engine behind host-sim's `Upstream` trait, driven directly in virtual
//! time (no filter): SSE timing from the engine's steps, prefix caching, queueing and 429,
//! cancellation, conditions, errors, and determinism.

use host_sim::vllm_sim::engine::{Engine, EngineRequest};
use host_sim::vllm_sim::sim::{self, Arrival};
use host_sim::vllm_sim::tokenizer;
use host_sim::world::upstream::{Emit, UpstreamRequest};
use host_sim::{ms, Condition, Nanos, Upstream, VllmConfig, VllmUpstream, MS, SEC};
use serde_json::Value;
use std::time::Duration;

const ADDR: &str = "10.0.0.1:8000";

fn post(path: &str, body: &str) -> UpstreamRequest {
    UpstreamRequest {
        method: "POST".into(),
        path: path.into(),
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.as_bytes().to_vec(),
    }
}

fn completion_request(prompt: &str, max_tokens: u32, stream: bool) -> UpstreamRequest {
    let body = serde_json::json!({
        "model": "sim-model", "prompt": prompt, "max_tokens": max_tokens,
        "ignore_eos": true, "stream": stream,
        "stream_options": {"include_usage": true},
    });
    post("/v1/completions", &body.to_string())
}

/// Polls every wake until the server is idle; what came out, with its time.
fn drain(u: &mut impl Upstream) -> Vec<(Nanos, Emit)> {
    drain_until(u, Nanos::MAX)
}

fn drain_until(u: &mut impl Upstream, end: Nanos) -> Vec<(Nanos, Emit)> {
    let mut all = Vec::new();
    for _ in 0..1_000_000 {
        let Some(t) = u.next_wake().filter(|t| *t <= end) else {
            return all;
        };
        let mut out = Vec::new();
        u.poll(t, &mut out);
        all.extend(out.into_iter().map(|e| (t, e)));
    }
    panic!("the server never went idle");
}

fn of(all: &[(Nanos, Emit)], id: u64) -> Vec<(Nanos, Emit)> {
    all.iter()
        .filter(|(_, e)| match e {
            Emit::Head { id: i, .. } | Emit::Data { id: i, .. } | Emit::End { id: i } => *i == id,
        })
        .cloned()
        .collect()
}

fn status(emits: &[(Nanos, Emit)]) -> u16 {
    match emits.first() {
        Some((_, Emit::Head { status, .. })) => *status,
        other => panic!("no head first: {other:?}"),
    }
}

fn header<'a>(emits: &'a [(Nanos, Emit)], name: &str) -> Option<&'a str> {
    match emits.first() {
        Some((_, Emit::Head { headers, .. })) => headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str()),
        _ => None,
    }
}

fn body(emits: &[(Nanos, Emit)]) -> String {
    let mut b = Vec::new();
    for (_, e) in emits {
        if let Emit::Data { bytes, .. } = e {
            b.extend_from_slice(bytes);
        }
    }
    String::from_utf8(b).expect("utf-8 body")
}

/// The JSON frames of an SSE body (without `[DONE]`).
fn frames(body: &str) -> Vec<Value> {
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    body.split("\n\n")
        .filter(|f| !f.is_empty() && *f != "data: [DONE]")
        .map(|f| serde_json::from_str(f.strip_prefix("data: ").expect("data frame")).unwrap())
        .collect()
}

fn metric(u: &mut impl Upstream, now: Nanos, series: &str) -> f64 {
    let text = u.metrics(now);
    host_sim::prometheus::value(&text, series)
        .unwrap_or_else(|| panic!("no series `{series}` in:\n{text}"))
}

fn words(tag: &str, n: usize) -> String {
    (0..n).map(|i| format!("{tag}{i:03} ")).collect()
}

#[test]
fn a_stream_gets_its_head_at_once_then_one_sse_chunk_per_engine_step() {
    let mut u = VllmConfig::new(ADDR)
        .profile("h100-llama-8b")
        .seed(3)
        .build();
    let prompt = words("hello", 40);
    u.start(ms(5), 1, &completion_request(&prompt, 8, true));
    let all = drain(&mut u);
    assert_eq!(status(&all), 200);
    assert_eq!(all[0].0, ms(5), "the head leaves on submission");
    assert_eq!(
        header(&all, "content-type"),
        Some("text/event-stream; charset=utf-8")
    );
    assert_eq!(header(&all, "x-sim-server"), Some(ADDR));
    assert_eq!(header(&all, "x-inference-port"), Some("8000"));
    assert!(matches!(all.last(), Some((_, Emit::End { id: 1 }))));

    // The frames: 8 tokens, the finish chunk, the usage chunk, [DONE].
    let f = frames(&body(&all));
    assert_eq!(f.len(), 10, "{f:?}");
    assert!(f[..8]
        .iter()
        .all(|c| c["choices"][0]["finish_reason"].is_null()));
    assert_eq!(f[8]["choices"][0]["finish_reason"], "length");
    assert_eq!(f[9]["usage"]["completion_tokens"], 8);

    // Each token is one chunk, sent when the engine's step produced it: the same times as
    // the engine alone (same seed, same request) reports.
    let data_times: Vec<Nanos> = all
        .iter()
        .filter(|(_, e)| matches!(e, Emit::Data { .. }))
        .map(|(t, _)| *t)
        .collect();
    let mut engine = Engine::new(u.config().engine.clone());
    let traces = sim::run(
        &mut engine,
        &[Arrival {
            at: Duration::from_millis(5),
            request: EngineRequest::fixed(tokenizer::encode(&prompt), 8),
        }],
        Duration::from_secs(60),
    );
    let engine_times: Vec<Nanos> = traces[0]
        .token_times
        .iter()
        .map(|d| d.as_nanos() as Nanos)
        .collect();
    assert_eq!(data_times, engine_times);
    // The calibrated profile: 30 ms + 250 µs per prompt token to the first token, 12 ms
    // per token after (± 15 % jitter).
    let ttft = data_times[0] - ms(5);
    assert!((ms(20)..ms(90)).contains(&ttft), "TTFT {ttft} ns");
    for w in data_times.windows(2) {
        assert!(
            (ms(6)..ms(20)).contains(&(w[1] - w[0])),
            "ITL {} ns",
            w[1] - w[0]
        );
    }
}

#[test]
fn a_repeated_prefix_is_served_from_the_kv_cache() {
    let mut u = VllmConfig::new(ADDR).seed(1).build();
    let prefix = words("shared", 100); // 250 tokens
    u.start(
        0,
        1,
        &completion_request(&format!("{prefix}first"), 4, false),
    );
    let first = drain(&mut u);
    u.start(
        SEC,
        2,
        &completion_request(&format!("{prefix}second"), 4, false),
    );
    let second = drain(&mut u);
    let (a, b): (Value, Value) = (
        serde_json::from_str(&body(&first)).unwrap(),
        serde_json::from_str(&body(&second)).unwrap(),
    );
    // Nothing cached: vLLM writes `"prompt_tokens_details": null`.
    assert!(a["usage"]["prompt_tokens_details"].is_null(), "{a}");
    assert!(a["usage"].get("prompt_tokens_details").is_some(), "{a}");
    let cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(cached, 240, "the 15 full blocks of the shared prefix");
    assert_eq!(header(&second, "content-type"), Some("application/json"));
    assert_eq!(
        header(&second, "content-length"),
        Some(body(&second).len().to_string().as_str())
    );
    // Skipping the prefill of 240 tokens (60 ms) shows in the latency.
    let took = |e: &[(Nanos, Emit)], start: Nanos| e.last().unwrap().0 - start;
    assert!(
        took(&second, SEC) + ms(30) < took(&first, 0),
        "{} vs {}",
        took(&second, SEC),
        took(&first, 0)
    );
    assert_eq!(
        metric(
            &mut u,
            2 * SEC,
            r#"vllm:prefix_cache_hits_total{model_name="sim-model"}"#
        ),
        240.0
    );
}

#[test]
fn overload_queues_requests_then_refuses_with_429() {
    let mut u = VllmConfig::new(ADDR)
        .max_num_seqs(2)
        .max_waiting(3)
        .seed(2)
        .build();
    for id in 1..=8 {
        u.start(
            0,
            id,
            &completion_request(&words("q", 20 + id as usize), 16, true),
        );
    }
    let waiting = r#"vllm:num_requests_waiting{model_name="sim-model"}"#;
    let running = r#"vllm:num_requests_running{model_name="sim-model"}"#;
    // The first step admitted the first request; three wait; the rest were refused.
    assert_eq!(metric(&mut u, ms(1), waiting), 3.0);
    assert_eq!(metric(&mut u, ms(1), running), 1.0);
    let all = drain(&mut u);
    let mut refused = 0;
    let mut firsts = Vec::new();
    for id in 1..=8 {
        let e = of(&all, id);
        match status(&e) {
            429 => {
                refused += 1;
                assert_eq!(e[0].0, 0, "refused at once");
                let v: Value = serde_json::from_str(&body(&e)).unwrap();
                assert_eq!(
                    v["error"]["message"],
                    "Failed to enqueue request, waiting requests queue is full"
                );
                assert_eq!(v["error"]["type"], "RateLimitError");
                assert_eq!(header(&e, "x-sim-server"), Some(ADDR));
            }
            200 => {
                assert_eq!(frames(&body(&e)).len(), 16 + 2);
                let first = e
                    .iter()
                    .find(|(_, x)| matches!(x, Emit::Data { .. }))
                    .unwrap();
                firsts.push(first.0);
            }
            s => panic!("status {s}"),
        }
    }
    assert_eq!(refused, 4);
    // Queued requests wait for room in the batch of two: the last admitted starts
    // after a running one finished (16 tokens of ~12 ms).
    assert!(firsts[3] > firsts[0] + ms(150), "{firsts:?}");
    assert_eq!(metric(&mut u, 10 * SEC, waiting), 0.0);
    assert_eq!(metric(&mut u, 10 * SEC, running), 0.0);
    assert_eq!(
        metric(
            &mut u,
            10 * SEC,
            r#"vllm:request_success_total{finished_reason="length",model_name="sim-model"}"#
        ),
        4.0
    );
}

#[test]
fn a_cancelled_request_is_aborted_in_the_engine_and_sends_nothing_more() {
    let mut u = VllmConfig::new(ADDR).seed(4).build();
    u.start(0, 1, &completion_request("tell me a long story", 200, true));
    let before = drain_until(&mut u, ms(100));
    assert!(before.iter().any(|(_, e)| matches!(e, Emit::Data { .. })));
    u.cancel(ms(100), 1);
    assert!(drain(&mut u).is_empty());
    let abort = r#"vllm:request_success_total{finished_reason="abort",model_name="sim-model"}"#;
    assert_eq!(metric(&mut u, ms(200), abort), 1.0);
    assert_eq!(
        metric(
            &mut u,
            ms(200),
            r#"vllm:num_requests_running{model_name="sim-model"}"#
        ),
        0.0
    );
    assert_eq!(u.active(), 0);
}

#[test]
fn conditions_slow_fail_and_heal_the_server() {
    let mut u = VllmConfig::new(ADDR).seed(5).build();
    let req = completion_request(&words("c", 50), 2, true);
    let ttft = |u: &mut VllmUpstream, at: Nanos, id: u64| {
        u.start(at, id, &req);
        let e = drain(u);
        assert_eq!(status(&e), 200);
        e.iter()
            .find(|(_, x)| matches!(x, Emit::Data { .. }))
            .unwrap()
            .0
            - at
    };
    let normal = ttft(&mut u, 0, 1);
    u.set_condition(SEC, Condition::Slowed(4.0));
    let slowed = ttft(&mut u, SEC, 2);
    assert!(slowed > 2 * normal, "{slowed} vs {normal}");
    u.set_condition(2 * SEC, Condition::Failing(503));
    u.start(2 * SEC, 3, &req);
    let failed = drain(&mut u);
    assert_eq!(status(&failed), 503);
    assert_eq!(failed[0].0, 2 * SEC);
    let v: Value = serde_json::from_str(&body(&failed)).unwrap();
    assert_eq!(v["error"]["type"], "InternalServerError");
    assert_eq!(v["error"]["code"], 503);
    u.set_condition(3 * SEC, Condition::Healthy);
    // The cache now holds this prompt: compare with a fresh one instead.
    let healed = ttft(&mut u, 3 * SEC, 4);
    assert!(healed < slowed, "{healed} vs {slowed}");
}

#[test]
fn bad_requests_get_the_servers_errors_and_metrics_are_served() {
    let mut u = VllmConfig::new(ADDR).build();
    u.start(0, 1, &post("/v1/completions", "{not json"));
    u.start(
        0,
        2,
        &post(
            "/v1/chat/completions",
            r#"{"model":"other","messages":[{"role":"user","content":"hi"}]}"#,
        ),
    );
    u.start(
        0,
        3,
        &post("/v1/completions", r#"{"prompt":"x","max_tokens":5000}"#),
    );
    u.start(
        0,
        4,
        &post(
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}"#,
        )
        .clone(),
    );
    let mut get = post("/metrics", "");
    get.method = "GET".into();
    u.start(0, 5, &get);
    let mut unknown = post("/v2/nothing", "");
    unknown.method = "GET".into();
    u.start(0, 6, &unknown);
    let mut xerr = completion_request("x", 1, false);
    xerr.headers.push(("x-return-error".into(), "429".into()));
    u.start(0, 7, &xerr);
    let all = drain(&mut u);
    let json = |id| -> Value { serde_json::from_str(&body(&of(&all, id))).unwrap() };
    assert_eq!(status(&of(&all, 1)), 400);
    assert!(json(1)["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("JSON decode error"));
    assert_eq!(status(&of(&all, 2)), 404);
    assert_eq!(
        json(2)["error"]["message"],
        "The model `other` does not exist."
    );
    assert_eq!(status(&of(&all, 3)), 400);
    assert!(json(3)["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("This model's maximum context length is 4096 tokens."));
    assert_eq!(status(&of(&all, 4)), 200);
    assert_eq!(json(4)["object"], "chat.completion");
    assert_eq!(json(4)["model"], "sim-model");
    assert!(json(4)["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(status(&of(&all, 5)), 200);
    // The chat request (4) is in the running batch at that moment.
    assert!(body(&of(&all, 5)).contains("vllm:num_requests_running{model_name=\"sim-model\"} 1"));
    assert_eq!(status(&of(&all, 6)), 404);
    assert_eq!(body(&of(&all, 6)), r#"{"detail":"Not Found"}"#);
    assert_eq!(status(&of(&all, 7)), 429);
    assert_eq!(json(7)["error"]["type"], "RateLimitError");
}

/// A mixed workload: streamed and not, chat and completions, shared prefixes, overlap.
fn workload(seed: u64) -> Vec<(Nanos, Emit)> {
    let mut u = VllmConfig::new(ADDR).seed(seed).max_num_seqs(4).build();
    let mut all = Vec::new();
    for i in 0..24u64 {
        let at = i * 7 * MS;
        all.extend(drain_until(&mut u, at));
        let req = if i % 3 == 0 {
            post(
                "/v1/chat/completions",
                &serde_json::json!({"messages": [{"role": "system", "content": words("sys", 30)},
                    {"role": "user", "content": format!("question {i}")}],
                    "max_tokens": 12, "stream": i % 2 == 0})
                .to_string(),
            )
        } else {
            completion_request(
                &format!("{}{i}", words("p", 10 + i as usize % 4)),
                10,
                i % 2 == 1,
            )
        };
        u.start(at, i, &req);
    }
    all.extend(drain(&mut u));
    all
}

#[test]
fn the_same_seed_gives_the_same_answers_at_the_same_times() {
    let a = workload(7);
    assert_eq!(
        a.iter()
            .filter(|(_, e)| matches!(e, Emit::End { .. }))
            .count(),
        24
    );
    assert_eq!(a, workload(7));
    let b = workload(8);
    assert_ne!(a, b, "another seed draws other lengths, text and jitter");
}

#[test]
fn a_shared_handle_sees_the_engine_the_sim_drives() {
    let shared = VllmConfig::new(ADDR).max_num_seqs(1).build().shared();
    let mut driver: Box<dyn Upstream> = Box::new(shared.clone());
    driver.start(0, 1, &completion_request("a", 8, false));
    driver.start(0, 2, &completion_request("b", 8, false));
    let mut out = Vec::new();
    driver.poll(ms(1), &mut out);
    let s = shared.borrow().snapshot();
    assert_eq!((s.running, s.waiting), (1, 1));
    assert_eq!(shared.borrow().active(), 2);
}
