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
