//! SLO-aware routing end to end through a real Envoy 1.40 (2 workers) in front of
//! `vllm-sim`: the predictor learns from the streams Envoy relays (every worker's), its
//! health and the observed/predicted latency metrics reach `/stats/prometheus` (with the
//! reference's `_gauge` variants and the prediction's duration) and the filter's own
//! metrics endpoint (with the llm-d router's names), and an SLO that nothing can meet is
//! counted as violated while the request is still served.

use serde_json::json;
use tests::envoy::Envoy;
use tests::eventually;
use tests::free_port;
use tests::http;
use tests::openai::completion;
use tests::vllm_sim_server::VllmSimServer;

/// The sum of the series of `name` (any labels) in a Prometheus text.
fn sum(prom: &str, name: &str) -> f64 {
    prom.lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn the_predictor_learns_from_the_streams_envoy_relays_and_exports_its_metrics() {
    let servers = VllmSimServer::fast_pool(2);
    let port = free_port();
    let config = json!({
        "pool": {"metricsEndpoint": {"port": port}},
        "plugins": [
            {"type": "predicted-latency-producer", "parameters": {"streamingMode": true}},
            {"type": "slo-headroom-tier-filter"},
            {"type": "latency-scorer"},
            {"type": "weighted-random-picker"}
        ]
    });
    let envoy = Envoy::start(&config, &VllmSimServer::addresses(&servers), 2);
    let relaxed = [
        ("x-llm-d-slo-ttft-ms", "5000"),
        ("x-llm-d-slo-tpot-ms", "500"),
    ];
    for i in 0..70 {
        let prompt = format!("question {i}: tell me something about the number {i}");
        let r = http::request(
            &envoy.listen,
            "POST",
            "/v1/completions",
            &relaxed,
            completion(&prompt, 8, true).as_bytes(),
        )
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // Samples reach the trainer within a tick (100 ms); gauges and histograms are
    // flushed every second. Every request gives a TTFT; a TPOT needs two body chunks,
    // and Envoy may relay a fast stream's tokens in one read.
    let learnt = eventually(10, || {
        let p = envoy.prometheus();
        sum(&p, "inference_extension_latency_predictor_samples") >= 70.0 + 35.0
            && sum(&p, "inference_objective_request_ttft_seconds_count") >= 70.0
    });
    let prom = envoy.prometheus();
    assert!(
        learnt,
        "{}",
        prom.lines()
            .filter(|l| l.contains("latency") || l.contains("ttft"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(sum(&prom, "inference_objective_request_tpot_seconds_count") >= 35.0);
    // Predictions were used once the model was ready (50 samples).
    assert!(
        sum(
            &prom,
            "inference_objective_request_predicted_ttft_seconds_count"
        ) >= 10.0
    );
    assert_eq!(
        sum(
            &prom,
            "inference_objective_request_ttft_slo_violation_total"
        ),
        0.0
    );
    // The `_gauge` variants hold the last request's latencies (Envoy: microseconds; the
    // predicted TPOT needs 50 TPOT samples, which these short streams may not give), and
    // the prediction's duration is timed on a sample of the decisions (1 in 16 per
    // worker, the first included).
    for gauge in [
        "inference_objective_request_ttft_seconds_gauge",
        "inference_objective_request_predicted_ttft_seconds_gauge",
        "inference_objective_request_tpot_seconds_gauge",
    ] {
        let v = sum(&prom, gauge);
        assert!(v > 0.0 && v < 2.0 * 5e6, "{gauge} {v}");
    }
    for h in [
        "inference_objective_request_ttft_prediction_duration_seconds_count",
        "inference_objective_request_tpot_prediction_duration_seconds_count",
    ] {
        assert!(sum(&prom, h) >= 1.0, "{h}");
    }
    // The filter's endpoint: seconds, and both generations of names.
    let mut own = String::new();
    eventually(5, || {
        own = http::get(&format!("127.0.0.1:{port}"), "/metrics")
            .expect("scrape")
            .text();
        sum(
            &own,
            "llm_d_epp_request_tpot_prediction_duration_seconds_count",
        ) >= 1.0
    });
    for gauge in [
        "inference_objective_request_predicted_ttft_seconds_gauge",
        "inference_objective_request_tpot_seconds_gauge",
    ] {
        let v = sum(&own, gauge);
        assert!(v > 0.0 && v < 10.0, "{gauge} {v} in\n{own}");
    }
    for h in [
        "inference_objective_request_ttft_prediction_duration_seconds_count",
        "llm_d_epp_request_tpot_prediction_duration_seconds_count",
    ] {
        assert!(sum(&own, h) >= 1.0, "{h} in\n{own}");
    }
    // The last timed prediction's duration (microseconds; 0 when under one).
    for gauge in [
        "inference_objective_request_ttft_prediction_duration_seconds_gauge",
        "inference_objective_request_tpot_prediction_duration_seconds_gauge",
    ] {
        assert!(
            own.lines().any(|l| l.starts_with(gauge)),
            "{gauge} in\n{own}"
        );
        assert!(sum(&own, gauge) < 0.01, "{gauge} {}", sum(&own, gauge));
    }

    // An SLO nothing can meet: still served (priority 0 is not sheddable), counted as
    // violated.
    let r = http::request(
        &envoy.listen,
        "POST",
        "/v1/completions",
        &[("x-slo-ttft-ms", "0.001")],
        completion("impossible", 4, true).as_bytes(),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        eventually(5, || sum(
            &envoy.prometheus(),
            "inference_objective_request_ttft_slo_violation_total"
        ) == 1.0),
        "no TTFT SLO violation counted"
    );
    // The reference's one family, by type.
    assert_eq!(
        sum(
            &envoy.prometheus(),
            "inference_objective_request_slo_violation_total"
        ),
        1.0
    );
}
