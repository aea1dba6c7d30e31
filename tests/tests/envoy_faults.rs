//! Faults around the filter, through a real Envoy 1.40 (2 workers): a model server whose
//! `/metrics` hangs, Envoy's admin API (endpoint discovery) becoming unreachable or
//! hanging, and the filter's configuration replaced (through extension config discovery,
//! as Istio's WasmPlugin does) while requests wait in its queue. In each, every request
//! is still answered 200, once, by a server that can serve it; the filter never waits on
//! the broken callout. (A VM crash under load, and clients
//! leaving while parked, are in host-sim: `host-sim/tests/flow_control_failures.rs`.)

use serde_json::json;
use std::collections::BTreeMap;
use tests::envoy::Envoy;
use tests::fault_proxy::{FaultProxy, Mode};
use tests::http;
use tests::openai::completion;
use tests::vllm_sim_server::VllmSimServer;
use tests::{eventually, free_port, scratch_dir};

/// Sends `n` requests; who served each, or the first answer that was not a 200.
fn try_serve(envoy: &Envoy, n: usize, tag: &str) -> Result<BTreeMap<String, usize>, String> {
    let mut seen = BTreeMap::new();
    for i in 0..n {
        let r = http::post_json(
            &envoy.listen,
            "/v1/completions",
            &completion(&format!("{tag} {i}"), 2, false),
        )
        .map_err(|e| format!("{tag} {i}: {e}"))?;
        if r.status != 200 {
            return Err(format!("{tag} {i}: {} {}", r.status, r.text()));
        }
        *seen
            .entry(r.header("x-sim-server").unwrap_or("?").to_string())
            .or_insert(0) += 1;
    }
    Ok(seen)
}

/// Like [`try_serve`], every request must be a 200.
fn serve(envoy: &Envoy, n: usize, tag: &str) -> BTreeMap<String, usize> {
    try_serve(envoy, n, tag).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_server_whose_metrics_hang_does_not_stall_routing() {
    let sims = VllmSimServer::fast_pool(2);
    let (a, b) = (sims[0].address.as_str(), sims[1].address.as_str());
    // b is reached through a proxy whose /metrics hangs from the start.
    let proxy = FaultProxy::start(b, Some("/metrics"));
    proxy.set(Mode::Hang);
    let config = json!({"plugins": [{"type": "metrics-data-source",
        "parameters": {"refreshInterval": "50ms", "timeout": "300ms"}}]});
    let envoy = Envoy::start(&config, &[a, &proxy.address], 2);
    // Never scraped, b is not a candidate: everything goes to a, and nothing waits on b.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let seen = serve(&envoy, 20, "hanging metrics");
    assert_eq!(seen.get(a), Some(&20), "{seen:?}");
    // Its scrapes answer again: b joins.
    proxy.set(Mode::Pass);
    assert!(
        eventually(10, || serve(&envoy, 10, "recovered").contains_key(b)),
        "b never served after its metrics recovered"
    );
    // They hang again mid-run: every request is still served.
    proxy.set(Mode::Hang);
    let seen = serve(&envoy, 40, "hanging again");
    assert_eq!(seen.values().sum::<usize>(), 40, "{seen:?}");
}

#[test]
fn discovery_keeps_its_last_list_while_the_admin_api_is_down_or_hangs() {
    let sims = VllmSimServer::fast_pool(2);
    let addrs = VllmSimServer::addresses(&sims);
    let admin_port = free_port();
    let admin = FaultProxy::start(&format!("127.0.0.1:{admin_port}"), None);
    let dir = scratch_dir("faults");
    let config = dir.join("filter.json");
    std::fs::write(
        &config,
        json!({"pool": {"discovery": {"cluster": "model-servers", "adminCluster": "admin-proxy",
                                      "refreshInterval": "100ms"}},
               "plugins": [{"type": "metrics-data-source",
                            "parameters": {"timeout": "300ms"}}]})
        .to_string(),
    )
    .expect("write config");
    let extra = [
        "--admin-port".to_string(),
        admin_port.to_string(),
        "--cluster".to_string(),
        format!("model-servers={}", addrs.join(",")),
        "--cluster".to_string(),
        format!("admin-proxy={}", admin.address),
    ];
    let envoy = Envoy::launch(&config, &[], 2, &extra).expect("envoy");
    let both = |tag: &str| try_serve(&envoy, 20, tag).is_ok_and(|seen| seen.len() == 2);
    assert!(
        eventually(10, || both("discovered")),
        "discovery never found both servers:\n{}",
        envoy.log_text()
    );
    for (mode, tag) in [(Mode::Refuse, "admin refused"), (Mode::Hang, "admin hangs")] {
        admin.set(mode);
        // Many refresh periods, callout timeouts included.
        std::thread::sleep(std::time::Duration::from_millis(1_500));
        let seen = serve(&envoy, 30, tag);
        assert_eq!(
            seen.len(),
            2,
            "{tag}: the pool lost its discovered endpoints: {seen:?}"
        );
    }
    admin.set(Mode::Pass);
    assert!(eventually(10, || both("admin back")));
}

/// Renders `config` into the extension-config file `ecds` that Envoy watches (as Istio's
/// WasmPlugin delivers it): the running Envoy takes the new configuration.
fn push_config(config: &serde_json::Value, dir: &std::path::Path, ecds: &std::path::Path) {
    let path = dir.join(format!("filter-{}.json", free_port()));
    std::fs::write(&path, config.to_string()).expect("write config");
    let out = std::process::Command::new("python3")
        .arg(tests::paths::render())
        .arg("--wasm")
        .arg(tests::paths::wasm())
        .arg("--config")
        .arg(&path)
        .arg("--ecds")
        .arg(ecds)
        .output()
        .expect("render.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_configuration_update_while_requests_wait_serves_each_of_them_once() {
    // One slow server taking one request at a time: the others wait in the gateway.
    let sim = VllmSimServer::start(&[
        "--time-to-first-token",
        "200ms",
        "--inter-token-latency",
        "30ms",
    ]);
    let base = |rewrites: serde_json::Value| {
        json!({"featureGates": ["flowControl"],
               "plugins": [{"type": "concurrency-detector",
                            "parameters": {"maxConcurrency": 1, "concurrencyMode": "requests"}}],
               "saturationDetector": {"pluginRef": "concurrency-detector"},
               "flowControl": {"defaultRequestTTL": "60s"},
               "pool": {"endpoints": [sim.address], "modelRewrites": rewrites}})
    };
    let dir = scratch_dir("ecds");
    let ecds = dir.join("epp.yaml");
    let first = dir.join("first.json");
    std::fs::write(&first, base(json!([])).to_string()).expect("write config");
    let extra = ["--ecds".to_string(), ecds.display().to_string()];
    let envoy = Envoy::launch(&first, &[&sim.address], 2, &extra).expect("envoy");
    let alias = || {
        http::post_json(
            &envoy.listen,
            "/v1/completions",
            &json!({"model": "alias", "prompt": "which model", "max_tokens": 1}).to_string(),
        )
        .map(|r| r.status)
        .unwrap_or(0)
    };
    assert_eq!(
        alias(),
        404,
        "the first configuration has no rewrite of `alias`"
    );
    let served_before = sim_requests(&sim.address);

    // Eight requests of about half a second each; seven wait.
    let listen = envoy.listen.clone();
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let listen = listen.clone();
            std::thread::spawn(move || {
                http::post_json(
                    &listen,
                    "/v1/completions",
                    &completion(&format!("parked {i}"), 10, false),
                )
                .map(|r| r.status)
                .unwrap_or(0)
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(700));
    // The new configuration: `alias` becomes the server's model.
    push_config(
        &base(json!([{"name": "alias", "modelName": "alias",
                       "targets": [{"modelName": "sim-model", "weight": 1}]}])),
        &dir,
        &ecds,
    );
    let statuses: Vec<u16> = clients
        .into_iter()
        .map(|c| c.join().expect("client"))
        .collect();
    assert_eq!(
        statuses,
        vec![200; 8],
        "a waiting request was lost in the update"
    );
    // The update took effect for new requests.
    assert!(
        eventually(10, || alias() == 200),
        "the new configuration never applied:\n{}",
        envoy.log_text()
    );
    // Each waiting request reached the server exactly once, and so did the one alias
    // probe answered 200 (the 404s never succeed).
    let served = sim_requests(&sim.address) - served_before;
    assert_eq!(
        served, 9.0,
        "the server completed {served} requests for 8 clients and one probe"
    );
}

/// Requests the server completed (`vllm:request_success_total`, all labels).
fn sim_requests(addr: &str) -> f64 {
    let text = http::get(addr, "/metrics")
        .map(|r| r.text())
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("vllm:request_success_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
