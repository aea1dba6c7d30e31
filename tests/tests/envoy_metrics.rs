//! End to end through a real Envoy 1.40 (2 workers) with the filter's own metrics endpoint
//! (`pool.metricsEndpoint`): the reference's names (`inference_*` and the llm-d router's
//! `llm_d_epp_*`), in the reference's units, one series per pool whatever the number of
//! workers, served on its own port only.

use serde_json::json;
use std::time::{Duration, Instant};
use tests::envoy::Envoy;
use tests::free_port;
use tests::http;
use tests::openai::{completion, MODEL};
use tests::vllm_sim_server::VllmSimServer;

/// The value of the sample `series` (name and labels exactly as exposed), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Scrapes until `ready` holds for the text (workers publish every 500 ms), or 10 s.
fn scrape_until(addr: &str, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = http::get(addr, "/metrics").expect("scrape");
        assert_eq!(r.status, 200, "{}", r.text());
        let text = r.text();
        if ready(&text) || Instant::now() > deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_filter_serves_its_metrics_in_the_reference_names_and_units() {
    let servers = VllmSimServer::pool(2, &["--model", MODEL, "--time-to-first-token", "5ms"]);
    let port = free_port();
    let config = json!({
        "pool": {
            "name": "llama-pool",
            "metricsEndpoint": {"port": port},
            "modelRewrites": [{"name": "pin", "modelName": "alias",
                               "targets": [{"modelName": MODEL}]}]
        }
    });
    let envoy = Envoy::start(&config, &VllmSimServer::addresses(&servers), 2);
    let metrics = format!("127.0.0.1:{port}");

    const N: usize = 24;
    for i in 0..N {
        let mut body: serde_json::Value =
            serde_json::from_str(&completion(&format!("prompt {i}"), 4, false)).expect("json");
        if i % 2 == 1 {
            body["model"] = json!("alias");
        }
        let headers = [
            ("content-type", "application/json"),
            ("x-gateway-inference-fairness-id", "tenant-a"),
        ];
        let r = http::request(
            &envoy.listen,
            "POST",
            "/v1/completions",
            &headers,
            body.to_string().as_bytes(),
        )
        .expect("request");
        assert_eq!(r.status, 200, "{}", r.text());
    }

    let total = |t: &str, model: &str| {
        sample(
            t,
            &format!(
                "inference_objective_request_total{{model_name=\"{model}\",target_model_name=\"{MODEL}\"}}"
            ),
        )
    };
    let text = scrape_until(&metrics, |t| {
        total(t, MODEL) == Some((N / 2) as f64)
            && total(t, "alias") == Some((N / 2) as f64)
            && sample(t, "inference_pool_ready_pods{name=\"llama-pool\"}") == Some(2.0)
    });
    // One series per (model, target) over both workers; the rewritten requests carry the
    // target they were sent as, and the llm-d twin says the same.
    assert_eq!(total(&text, MODEL), Some((N / 2) as f64), "{text}");
    assert_eq!(total(&text, "alias"), Some((N / 2) as f64), "{text}");
    assert_eq!(
        sample(
            &text,
            &format!(
                "llm_d_epp_request_total{{model_name=\"alias\",target_model_name=\"{MODEL}\"}}"
            )
        ),
        Some((N / 2) as f64)
    );
    assert_eq!(
        sample(
            &text,
            &format!(
                "inference_extension_model_rewrite_decisions_total{{model_rewrite_name=\"pin\",\
                 model_name=\"alias\",target_model=\"{MODEL}\"}}"
            )
        ),
        Some((N / 2) as f64)
    );
    // Nothing is running any more, in either generation's gauge.
    assert_eq!(
        sample(
            &text,
            &format!("inference_objective_running_requests{{model_name=\"{MODEL}\"}}")
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &text,
            &format!(
                "llm_d_epp_request_running{{model_name=\"alias\",target_model_name=\"{MODEL}\",\
                 fairness_id=\"tenant-a\",priority=\"0\"}}"
            )
        ),
        Some(0.0)
    );
    // Durations are in seconds: N scheduling decisions took far less than a second in all.
    let count = sample(
        &text,
        "inference_extension_scheduler_e2e_duration_seconds_count",
    );
    let sum = sample(
        &text,
        "inference_extension_scheduler_e2e_duration_seconds_sum",
    );
    assert_eq!(count, Some(N as f64), "{text}");
    assert!(sum.is_some_and(|s| s > 0.0 && s < 1.0), "sum {sum:?}");
    assert_eq!(
        sample(
            &text,
            "inference_extension_scheduler_e2e_duration_seconds_bucket{le=\"+Inf\"}"
        ),
        Some(N as f64)
    );
    // Request sizes in bytes, one observation per request.
    assert_eq!(
        sample(
            &text,
            &format!(
                "inference_objective_request_sizes_count{{model_name=\"{MODEL}\",target_model_name=\"{MODEL}\"}}"
            )
        ),
        Some((N / 2) as f64)
    );
    // Pool gauges are fractions and averages, not percent or rounded integers.
    let kv = sample(
        &text,
        "inference_pool_average_kv_cache_utilization{name=\"llama-pool\"}",
    );
    assert!(kv.is_some_and(|v| (0.0..=1.0).contains(&v)), "kv {kv:?}");
    let saturation = sample(
        &text,
        "llm_d_epp_flow_control_pool_saturation{inference_pool=\"llama-pool\",stage=\"effective\"}",
    );
    assert!(
        saturation.is_some_and(|v| (0.0..1.0).contains(&v)),
        "an idle pool reads below 1: {saturation:?}"
    );
    assert_eq!(
        sample(
            &text,
            "llm_d_epp_flow_control_stale_endpoints{detector=\"utilization-detector\"}"
        ),
        Some(0.0)
    );
    assert!(text.contains("# TYPE inference_extension_scheduler_e2e_duration_seconds histogram\n"));

    // Only the metrics path, only on the metrics port.
    let other = http::get(&metrics, "/v1/models").expect("other path");
    assert_eq!(other.status, 404);
    let via_inference = http::get(&envoy.listen, "/metrics").expect("inference listener");
    assert!(
        !via_inference
            .text()
            .contains("inference_objective_request_total"),
        "the inference listener must not serve the gateway's metrics"
    );
}
