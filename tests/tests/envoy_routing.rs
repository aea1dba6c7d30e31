//! End to end through a real Envoy 1.40 with the filter (2 workers) in front of three
//! `vllm-sim` servers: what a user of the gateway sees.

use serde_json::json;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tests::envoy::Envoy;
use tests::http;
use tests::openai::{completion, MODEL};
use tests::vllm_sim_server::VllmSimServer;

/// Envoy with the default configuration in front of `servers`.
fn start(servers: &[VllmSimServer], workers: u32) -> Envoy {
    Envoy::start(&json!({}), &VllmSimServer::addresses(servers), workers)
}

#[test]
fn concurrent_requests_are_spread_and_served_where_the_gateway_says() {
    let servers = VllmSimServer::pool(
        3,
        &[
            "--model",
            MODEL,
            "--time-to-first-token",
            "20ms",
            "--inter-token-latency",
            "5ms",
        ],
    );
    let envoy = start(&servers, 2);
    let served: Mutex<HashMap<String, usize>> = Mutex::new(HashMap::new());
    let requests = 72;
    let clients = 8;
    std::thread::scope(|s| {
        for c in 0..clients {
            let (envoy, served) = (&envoy, &served);
            s.spawn(move || {
                for i in (c..requests).step_by(clients) {
                    let body = completion(&format!("request {i}"), 8, i % 2 == 0);
                    let path = if i % 3 == 0 { "/v1/chat/completions" } else { "/v1/completions" };
                    let body = if i % 3 == 0 {
                        json!({"model": MODEL, "messages": [{"role": "user", "content": format!("q {i}")}], "max_tokens": 8}).to_string()
                    } else {
                        body
                    };
                    let r = http::post_json(&envoy.listen, path, &body).expect("request");
                    assert_eq!(r.status, 200, "request {i}: {}", r.text());
                    let server = r.header("x-sim-server").expect("server identity").to_string();
                    let gateway = r
                        .header("x-gateway-destination-endpoint-served")
                        .expect("x-gateway-destination-endpoint-served");
                    assert_eq!(gateway, server, "the served header names the server that answered");
                    *served.lock().unwrap().entry(server).or_default() += 1;
                }
            });
        }
    });
    let served = served.into_inner().unwrap();
    assert_eq!(served.values().sum::<usize>(), requests);
    for server in &servers {
        let n = served.get(&server.address).copied().unwrap_or(0);
        assert!(n > 0, "{} got no request: {served:?}", server.address);
        assert!(
            n <= requests / 2,
            "{} got {n} of {requests}: {served:?}",
            server.address
        );
    }
}

#[test]
fn malformed_requests_get_openai_style_errors() {
    let servers = VllmSimServer::pool(1, &["--model", MODEL]);
    let endpoints = [servers[0].address.as_str()];
    let envoy = Envoy::start(
        &json!({"pool": {"maxRequestBodyBytes": 4096}}),
        &endpoints,
        2,
    );

    let r = http::post_json(&envoy.listen, "/v1/completions", "{not json").unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");

    let r = http::post_json(&envoy.listen, "/v1/completions", r#"{"prompt":"no model"}"#).unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "model");

    let big = completion(&"x".repeat(8000), 1, false);
    let r = http::post_json(&envoy.listen, "/v1/completions", &big).unwrap();
    assert_eq!(r.status, 413);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("4096"));

    // The gateway still serves well-formed requests afterwards.
    let r = http::post_json(
        &envoy.listen,
        "/v1/completions",
        &completion("ok", 2, false),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_client_cannot_choose_the_destination_itself() {
    let servers = VllmSimServer::pool(2, &["--model", MODEL]);
    let envoy = start(&servers[..1], 1);
    // The client names the server outside the pool; the gateway overrides it.
    let r = http::request(
        &envoy.listen,
        "POST",
        "/v1/completions",
        &[("x-gateway-destination-endpoint", &servers[1].address)],
        completion("hi", 2, false).as_bytes(),
    )
    .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-sim-server"), Some(servers[0].address.as_str()));
}

/// The headers a client sets to steer the gateway (objective, fairness id, rewrite,
/// subset, SLOs, profile selection, in both generations of names) and the ones only
/// the gateway may set are not
/// passed to the model server; the destination the server sees is the gateway's.
#[test]
fn the_gateways_headers_are_stripped_before_the_model_server() {
    let servers = VllmSimServer::pool(2, &["--model", MODEL]);
    let envoy = start(&servers[..1], 1);
    let steering = [
        ("x-gateway-inference-objective", "critical"),
        ("x-llm-d-inference-objective", "critical"),
        ("x-gateway-inference-fairness-id", "tenant-a"),
        ("x-llm-d-inference-fairness-id", "tenant-a"),
        ("x-gateway-model-name-rewrite", MODEL),
        ("x-llm-d-model-name-rewrite", MODEL),
        (
            "x-gateway-destination-endpoint-subset",
            servers[0].address.as_str(),
        ),
        ("x-gateway-destination-endpoint-served", "1.2.3.4:5"),
        ("x-prefiller-host-port", "1.2.3.4:5"),
        ("x-slo-ttft-ms", "500"),
        ("x-llm-d-slo-ttft-ms", "500"),
        ("x-slo-tpot-ms", "50"),
        ("x-llm-d-slo-tpot-ms", "50.5"),
        ("x-prediction-based-scheduling", "true"),
        ("x-prediction-based-scheduling-off", "false"),
        (
            "x-gateway-destination-endpoint",
            servers[1].address.as_str(),
        ),
        ("x-client-own", "kept"),
    ];
    let r = http::request(
        &envoy.listen,
        "POST",
        "/v1/completions",
        &steering,
        completion("hi", 2, false).as_bytes(),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let seen: Vec<&str> = r
        .header("x-sim-request-headers")
        .unwrap_or_default()
        .split(',')
        .collect();
    for (name, _) in &steering[..15] {
        assert!(!seen.contains(name), "{name} reached the server: {seen:?}");
    }
    assert!(seen.contains(&"x-client-own"), "{seen:?}");
    assert!(seen.contains(&"x-gateway-destination-endpoint"), "{seen:?}");
    assert_eq!(r.header("x-sim-server"), Some(servers[0].address.as_str()));
}

#[test]
fn a_streamed_completion_arrives_token_by_token() {
    let itl_ms = 40;
    let tokens = 10;
    let servers = VllmSimServer::pool(
        1,
        &[
            "--model",
            MODEL,
            "--time-to-first-token",
            "10ms",
            "--inter-token-latency",
            &format!("{itl_ms}ms"),
        ],
    );
    let envoy = start(&servers, 2);
    let r = http::post_json(
        &envoy.listen,
        "/v1/completions",
        &completion("stream me", tokens, true),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r
        .header("content-type")
        .unwrap_or("")
        .contains("text/event-stream"));
    let text = r.text();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let data_pieces: Vec<_> = r
        .pieces
        .iter()
        .filter(|(_, d)| d.starts_with(b"data: {"))
        .collect();
    assert!(
        data_pieces.len() >= 2,
        "expected several chunks, got {}",
        r.pieces.len()
    );
    let first = data_pieces.first().unwrap().0;
    let last = r.pieces.last().unwrap().0;
    // The tokens are produced over (tokens-1) x ITL; if the gateway buffered the stream,
    // everything would arrive at once.
    let spread = last.duration_since(first);
    let produced_over = Duration::from_millis(itl_ms * u64::from(tokens - 1));
    assert!(
        spread >= produced_over / 2,
        "first chunk only {spread:?} before the last; tokens were produced over {produced_over:?}"
    );
}

#[test]
fn scheduling_metrics_appear_in_envoys_prometheus_output_with_labels() {
    let servers = VllmSimServer::pool(1, &["--model", MODEL]);
    let envoy = start(&servers, 2);
    for _ in 0..3 {
        let r = http::post_json(
            &envoy.listen,
            "/v1/completions",
            &completion("hi", 1, false),
        )
        .unwrap();
        assert_eq!(r.status, 200);
    }
    http::post_json(&envoy.listen, "/v1/completions", "{").unwrap();
    let prom = envoy.prometheus();
    let has = |line: &str| prom.lines().any(|l| l == line);
    assert!(
        has(&format!(
            "inference_extension_scheduler_attempts_total{{status=\"success\",target_model_name=\"{MODEL}\",\
             pod_name=\"127.0.0.1\",namespace=\"\",port=\"{}\"}} 3",
            servers[0].address.rsplit(':').next().unwrap()
        )),
        "{prom}"
    );
    assert!(
        has(&format!(
            "inference_objective_running_requests{{model_name=\"{MODEL}\"}} 0"
        )),
        "{prom}"
    );
    assert!(
        prom.lines().any(
            |l| l.starts_with("inference_objective_request_error_total{")
                && l.contains("error_code=\"BadRequest\"")
                && l.ends_with(" 1")
        ),
        "{prom}"
    );
}
