//! Flow control end to end through a real Envoy (2 workers): priority order, 429 at
//! capacity, 503 at the queue TTL, and the flow-control metrics in /stats/prometheus.
//!
//! The pool is one `vllm-sim` that takes about half a second per request, behind a
//! `concurrency-detector` allowing one request in flight, so every request beyond the
//! first waits in the gateway.

use serde_json::{json, Value};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tests::envoy::Envoy;
use tests::http::{self, Response};
use tests::openai::MODEL;
use tests::vllm_sim_server::VllmSimServer;

fn config(flow_control: Value) -> Value {
    json!({
        "featureGates": ["flowControl"],
        "plugins": [
            {"type": "concurrency-detector", "parameters": {"maxConcurrency": 1}},
            {"type": "round-robin-fairness-policy"}
        ],
        "saturationDetector": {"pluginRef": "concurrency-detector"},
        "flowControl": flow_control,
        "pool": {"objectives": [
            {"name": "premium", "priority": 100},
            {"name": "best-effort", "priority": -10}
        ]}
    })
}

/// One server of [`MODEL`] that takes about half a second per request.
fn slow_servers() -> Vec<VllmSimServer> {
    VllmSimServer::pool(
        1,
        &[
            "--model",
            MODEL,
            "--time-to-first-token",
            "20ms",
            "--inter-token-latency",
            "50ms",
        ],
    )
}

fn send(envoy: &Envoy, objective: &str, tenant: &str) -> Response {
    let body = json!({"model": MODEL, "prompt": "hello", "max_tokens": 10, "ignore_eos": true})
        .to_string();
    http::request(
        &envoy.listen,
        "POST",
        "/v1/completions",
        &[
            ("content-type", "application/json"),
            ("x-gateway-inference-objective", objective),
            ("x-gateway-inference-fairness-id", tenant),
        ],
        body.as_bytes(),
    )
    .expect("request")
}

/// Waits until the gateway holds `n` requests in its queues (all flows).
fn wait_queued(envoy: &Envoy, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let queued: u64 = envoy
            .prometheus()
            .lines()
            .filter(|l| l.starts_with("inference_extension_flow_control_queue_size{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        if queued >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {queued} of {n} requests queued"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn premium_requests_overtake_best_effort_ones_queued_before_them() {
    let servers = slow_servers();
    let envoy = Envoy::start(&config(json!({})), &[&servers[0].address], 2);
    let finished: Mutex<Vec<&str>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        s.spawn(|| assert_eq!(send(&envoy, "standard", "filler").status, 200));
        wait_queued(&envoy, 0);
        std::thread::sleep(Duration::from_millis(100)); // the filler holds the only slot
        for i in 0..3 {
            let finished = &finished;
            let envoy = &envoy;
            s.spawn(move || {
                let r = send(envoy, "best-effort", &format!("batch-{i}"));
                assert_eq!(r.status, 200, "{}", r.text());
                finished.lock().unwrap().push("best-effort");
            });
        }
        wait_queued(&envoy, 3);
        for i in 0..3 {
            let finished = &finished;
            let envoy = &envoy;
            s.spawn(move || {
                let r = send(envoy, "premium", &format!("vip-{i}"));
                assert_eq!(r.status, 200, "{}", r.text());
                finished.lock().unwrap().push("premium");
            });
        }
    });
    let order = finished.into_inner().unwrap();
    assert_eq!(
        order,
        [
            "premium",
            "premium",
            "premium",
            "best-effort",
            "best-effort",
            "best-effort"
        ]
    );
}

#[test]
fn a_full_queue_answers_429_and_says_which_limit() {
    let servers = slow_servers();
    let envoy = Envoy::start(
        &config(json!({"maxRequests": 2})),
        &[&servers[0].address],
        2,
    );
    std::thread::scope(|s| {
        s.spawn(|| assert_eq!(send(&envoy, "standard", "a").status, 200));
        std::thread::sleep(Duration::from_millis(100));
        for _ in 0..2 {
            s.spawn(|| assert_eq!(send(&envoy, "standard", "a").status, 200));
        }
        wait_queued(&envoy, 2);
        let r = send(&envoy, "premium", "b");
        assert_eq!(r.status, 429, "{}", r.text());
        let message = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(message.contains("flowControl.maxRequests"), "{message}");
        // Batch clients back off on these (the llm-d router's header and value).
        assert_eq!(
            r.header("x-llm-d-request-dropped-reason"),
            Some("rejected-saturated")
        );
        assert_eq!(r.header("retry-after"), Some("1"));
    });
}

#[test]
fn a_request_waiting_past_its_ttl_gets_503() {
    let servers = slow_servers();
    let envoy = Envoy::start(
        &config(json!({"defaultRequestTTL": "200ms"})),
        &[&servers[0].address],
        2,
    );
    std::thread::scope(|s| {
        s.spawn(|| assert_eq!(send(&envoy, "standard", "a").status, 200));
        std::thread::sleep(Duration::from_millis(100));
        let started = Instant::now();
        let r = send(&envoy, "standard", "b");
        let waited = started.elapsed();
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("timed out in queue"));
        assert_eq!(
            r.header("x-llm-d-request-dropped-reason"),
            Some("rejected-ttl-expired")
        );
        assert_eq!(r.header("retry-after"), Some("1"));
        assert!(
            waited >= Duration::from_millis(190),
            "answered after {waited:?}"
        );
        assert!(
            waited < Duration::from_millis(450),
            "answered after {waited:?}"
        );
    });
    // Once the queue is empty the gauges are back to zero, and the outcomes are counted
    // (histograms appear at Envoy's next stats flush).
    let ttl_outcome = |prom: &str| {
        prom.lines().any(|l| {
            l.starts_with("inference_extension_flow_control_request_queue_duration_seconds_count{")
                && l.contains("outcome=\"EvictedTTL\"")
                && l.contains("fairness_id=\"b\"")
                && l.ends_with(" 1")
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut prom = envoy.prometheus();
    while !ttl_outcome(&prom) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        prom = envoy.prometheus();
    }
    let gauge = |tenant: &str| {
        prom.lines()
            .find(|l| {
                l.starts_with("inference_extension_flow_control_queue_size{")
                    && l.contains(&format!("fairness_id=\"{tenant}\""))
            })
            .map(|l| l.rsplit(' ').next().unwrap().to_string())
    };
    assert_eq!(gauge("b").as_deref(), Some("0"), "{prom}");
    assert!(ttl_outcome(&prom), "{prom}");
    assert!(
        prom.contains(
            "inference_extension_flow_control_pool_saturation{inference_pool=\"default-pool\"}"
        ),
        "{prom}"
    );
}

#[test]
fn without_the_gate_sheddable_requests_get_429_while_the_pool_is_saturated() {
    let servers = slow_servers();
    let mut legacy = config(json!({}));
    legacy.as_object_mut().unwrap().remove("featureGates");
    legacy.as_object_mut().unwrap().remove("flowControl");
    let envoy = Envoy::start(&legacy, &[&servers[0].address], 2);
    // Idle pool: a sheddable request passes.
    assert_eq!(send(&envoy, "best-effort", "a").status, 200);
    std::thread::scope(|s| {
        s.spawn(|| assert_eq!(send(&envoy, "standard", "a").status, 200));
        std::thread::sleep(Duration::from_millis(150)); // it holds the only slot
        let r = send(&envoy, "best-effort", "b");
        assert_eq!(r.status, 429, "{}", r.text());
        assert!(r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("sheddable"));
        assert_eq!(
            r.header("x-llm-d-request-dropped-reason"),
            Some("rejected-saturated")
        );
        // Requests of priority >= 0 are never shed by legacy admission.
        assert_eq!(send(&envoy, "premium", "c").status, 200);
    });
}

#[test]
fn scale_from_zero_requests_wait_for_an_endpoint_to_become_ready() {
    // The pool's only endpoint is not running yet: with the default utilization
    // detector it has no fresh metrics, the pool reads saturated, and requests wait.
    let port = tests::free_port();
    let address = format!("127.0.0.1:{port}");
    let cfg = json!({
        "featureGates": ["flowControl"],
        "flowControl": {"defaultRequestTTL": "20s"},
    });
    let envoy = Envoy::start(&cfg, &[&address], 2);
    std::thread::scope(|s| {
        let waiting = s.spawn(|| send(&envoy, "standard", "a"));
        wait_queued(&envoy, 1);
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            !waiting.is_finished(),
            "the request waits while no endpoint is ready"
        );
        // The endpoint comes up; its first scrape makes the pool ready.
        let started = Instant::now();
        let _server = VllmSimServer::start_on(port, &["--model", MODEL]);
        let r = waiting.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-sim-server"), Some(address.as_str()));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "served {:?} after the endpoint came up",
            started.elapsed()
        );
    });
}
