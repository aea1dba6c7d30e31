//! The adversarial suite through a real Envoy (2 workers, the filter with flow control on,
//! 3 `vllm-sim` servers): seeded hostile requests in batches, one class per batch then
//! all classes mixed (sizes up to the body limit, encodings and control characters,
//! duplicate and escaped JSON keys, every header the gateway reads, every method and
//! path, slow and abandoned bodies, abandoned streams, chunked bodies, HTTP/2), while
//! well-formed requests run. After each batch, once idle: every well-formed request
//! answered correctly and no slower than the quiet p99 plus the stall bound; every
//! hostile request answered (or closed) within the answer bound and never with 500/502;
//! Envoy's RSS and stat count within their bounds of the warm values; no Wasm VM
//! replaced; nothing counted running or queued; no stat name or Prometheus line with
//! client text outside a bounded label. (`tests::adversarial` has the generator and the
//! checks.)
//!
//! This is the bounded slice `scripts/test` runs (one pass over the classes, 24 requests
//! each, about a minute). `scripts/fuzz envoy [SECONDS]` runs the same campaign longer
//! with a new seed; `ADVERSARIAL_SEED`, `ADVERSARIAL_SECONDS`, `ADVERSARIAL_PER_BATCH`
//! set it here. A failing batch's requests are written to `target/adversarial-findings/`.

use serde_json::json;
use std::time::Duration;
use tests::adversarial::{self, Bounds, Settings};
use tests::envoy::Envoy;
use tests::vllm_sim_server::VllmSimServer;
use tests::{free_port, paths, scratch_dir};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn hostile_requests_leave_the_gateway_serving_bounded_and_unforged() {
    let seed = env("ADVERSARIAL_SEED", 35);
    let seconds = env("ADVERSARIAL_SECONDS", 0);
    let per_batch = env("ADVERSARIAL_PER_BATCH", 24) as usize;
    let servers = VllmSimServer::fast_pool(3);
    let metrics_port = free_port();
    let body_limit = 4 * 1024 * 1024;
    let config = json!({
        "featureGates": ["flowControl"],
        "plugins": [{"type": "concurrency-detector", "parameters": {"maxConcurrency": 256}}],
        "saturationDetector": {"pluginRef": "concurrency-detector"},
        "pool": {
            "maxRequestBodyBytes": body_limit,
            "metricsEndpoint": {"port": metrics_port},
            "objectives": [{"name": "premium", "priority": 10}, {"name": "batch", "priority": -1}]
        }
    });
    let dir = scratch_dir("adversarial");
    let path = dir.join("filter.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let endpoints = VllmSimServer::addresses(&servers);
    let envoy = Envoy::launch(&path, &endpoints, 2, &[]).unwrap_or_else(|e| panic!("{e}"));
    let metrics = format!("127.0.0.1:{metrics_port}");
    let mut addresses: Vec<String> = endpoints.iter().map(|s| s.to_string()).collect();
    addresses.push(envoy.admin.clone());

    let one_pass = adversarial::gen::Class::ALL.len() + 1;
    let settings = Settings {
        seed,
        batches: if seconds == 0 { one_pass } else { usize::MAX },
        budget: Duration::from_secs(if seconds == 0 { 600 } else { seconds }),
        per_batch,
        senders: 6,
        clients: 4,
        bounds: Bounds::default(),
        body_limit,
        findings_dir: paths::root().join("target/adversarial-findings"),
    };
    let report = adversarial::run(&envoy, Some(&metrics), addresses, &settings);
    eprintln!("{}", report.summary());
    assert!(report.sent() >= one_pass.min(settings.batches) * per_batch / 2);
    assert!(report.well_formed > 0, "no well-formed request ran");
    let failures = report.failures();
    assert!(
        failures.is_empty(),
        "{} findings (replay: ADVERSARIAL_SEED={seed}; requests in target/adversarial-findings/):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
