//! Passive health through a real Envoy (2 workers): a model server that dies is ejected
//! after its connection failures (Envoy's own 503s), so the requests after them are all
//! served by the live one. Scraping is off, so only passive health can notice (with it
//! on, a failed scrape also takes the endpoint out: `envoy_scheduler.rs`).

use serde_json::json;
use tests::envoy::Envoy;
use tests::http;
use tests::openai::MODEL;
use tests::vllm_sim_server::VllmSimServer;

fn statuses(envoy: &Envoy, n: usize) -> Vec<u16> {
    (0..n)
        .map(|i| {
            let body = json!({"model": MODEL, "prompt": format!("hello {i}"), "max_tokens": 2})
                .to_string();
            http::post_json(&envoy.listen, "/v1/completions", &body)
                .expect("request")
                .status
        })
        .collect()
}

fn ejections(envoy: &Envoy) -> u64 {
    envoy
        .prometheus()
        .lines()
        .filter(|l| l.starts_with("inference_extension_passive_health_ejections_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn start(pool: serde_json::Value, servers: &[VllmSimServer]) -> Envoy {
    // Sequential requests find both servers idle: the picker breaks the tie at random.
    let config = json!({
        "plugins": [{"type": "queue-scorer"}, {"type": "max-score-picker"}],
        "dataLayer": {"sources": []},
        "pool": pool
    });
    Envoy::start(&config, &VllmSimServer::addresses(servers), 2)
}

#[test]
fn a_dead_server_is_ejected_after_five_connection_failures() {
    let mut servers = VllmSimServer::pool(2, &["--model", MODEL]);
    // A long first ejection, so a slow machine cannot see it end within the test.
    let envoy = start(
        json!({"passiveHealth": {"baseEjectionTime": "30s"}}),
        &servers,
    );
    assert!(statuses(&envoy, 4).iter().all(|s| *s == 200));
    drop(servers.pop()); // killed: connections refused from now on
                         // Sequential requests: the dead server gets about half until its fifth failure.
    let got = statuses(&envoy, 30);
    let failed: Vec<usize> = (0..got.len()).filter(|&i| got[i] != 200).collect();
    assert_eq!(failed.len(), 5, "{got:?}");
    assert!(got.iter().all(|s| *s == 200 || *s == 503), "{got:?}");
    let last = failed[4];
    assert!(
        got[last + 1..].iter().all(|s| *s == 200),
        "served by the live server once ejected: {got:?}"
    );
    // The counter reaches the admin API at Envoy's next stats flush.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while ejections(&envoy) < 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(ejections(&envoy), 1);
}

/// Envoy as the Istio and Envoy Gateway manifests set it up: the pool cluster balanced by
/// `override_host` on `x-gateway-destination-endpoint` (primary, then fallbacks) and a
/// route retry on connection failures (`render.py --override-host`).
fn start_with_retries(servers: &[VllmSimServer]) -> Envoy {
    let dir = tests::scratch_dir("override-host");
    let config = dir.join("filter.json");
    let filter = json!({
        "plugins": [{"type": "queue-scorer"}, {"type": "max-score-picker"}],
        "dataLayer": {"sources": []},
        "pool": {"passiveHealth": {"baseEjectionTime": "30s"}}
    });
    std::fs::write(&config, filter.to_string()).expect("write the filter config");
    Envoy::launch(
        &config,
        &VllmSimServer::addresses(servers),
        2,
        &["--override-host".to_string()],
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn with_retries_on_the_fallbacks_a_dead_server_costs_clients_nothing_and_is_ejected() {
    let mut servers = VllmSimServer::pool(2, &["--model", MODEL]);
    let live = servers[0].address.clone();
    let envoy = start_with_retries(&servers);
    assert!(statuses(&envoy, 4).iter().all(|s| *s == 200));
    drop(servers.pop()); // killed: connections refused from now on
                         // Every request the picker sends to the dead server is retried on the next endpoint
                         // of its list: no client sees an error.
    let got = statuses(&envoy, 30);
    assert!(got.iter().all(|s| *s == 200), "{got:?}");
    // The filter saw each refusal (the answer came from another endpoint than its pick),
    // so the dead server is ejected as if it had answered 5xx.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while ejections(&envoy) < 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(ejections(&envoy), 1);
    // Nothing is left counted on the dead server: the live one takes everything.
    let served: Vec<String> = (0..10)
        .map(|i| {
            let body = json!({"model": MODEL, "prompt": format!("after {i}"), "max_tokens": 2})
                .to_string();
            let r = http::post_json(&envoy.listen, "/v1/completions", &body).expect("request");
            assert_eq!(r.status, 200);
            r.header("x-gateway-destination-endpoint-served")
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert!(served.iter().all(|s| *s == live), "{served:?}");
}

#[test]
fn with_passive_health_off_a_dead_server_keeps_failing_requests() {
    let mut servers = VllmSimServer::pool(2, &["--model", MODEL]);
    let envoy = start(
        json!({"passiveHealth": {"consecutiveFailures": 0}}),
        &servers,
    );
    drop(servers.pop());
    let got = statuses(&envoy, 30);
    let failed = got.iter().filter(|s| **s != 200).count();
    assert!(failed > 5, "{got:?}");
}
