//! The scheduler and data layer end to end through a real Envoy 1.40 (2 workers) in front
//! of `vllm-sim` servers: metrics scraped and exported, prefix affinity across workers,
//! failed endpoints leaving the pool, discovery from Envoy's admin API, the subset hint,
//! YAML configuration and refused configurations.

use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;
use tests::envoy::Envoy;
use tests::eventually;
use tests::http;
use tests::openai::{completion, MODEL};
use tests::scratch_dir;
use tests::vllm_sim_server::VllmSimServer;

fn served_by(envoy: &Envoy, prompt: &str) -> String {
    let r = http::post_json(
        &envoy.listen,
        "/v1/completions",
        &completion(prompt, 2, false),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("x-sim-server").expect("x-sim-server").to_string()
}

fn metric_line<'a>(prom: &'a str, name: &str, labels: &[(&str, &str)]) -> Option<&'a str> {
    prom.lines().find(|l| {
        { l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")) }
            .then_some(())
            .is_some()
            && labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
            && l.split(['{', ' ']).next() == Some(name)
    })
}

fn value(line: &str) -> f64 {
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn pool_and_scheduler_metrics_appear_in_prometheus_with_their_labels() {
    let servers = VllmSimServer::fast_pool(2);
    let envoy = Envoy::start(
        &json!({"pool": {"name": "llama-pool"}}),
        &VllmSimServer::addresses(&servers),
        2,
    );
    let prompt = "Tell me about the weather in a city by the sea. ".repeat(8);
    for _ in 0..4 {
        served_by(&envoy, &prompt);
    }
    let mut prom = String::new();
    let ready = eventually(10, || {
        prom = envoy.prometheus();
        metric_line(
            &prom,
            "inference_pool_ready_pods",
            &[("name", "llama-pool")],
        )
        .is_some_and(|l| value(l) == 2.0)
    });
    assert!(ready, "{prom}");
    for (name, labels) in [
        (
            "inference_pool_average_kv_cache_utilization",
            vec![("name", "llama-pool")],
        ),
        (
            "inference_pool_average_queue_size",
            vec![("name", "llama-pool")],
        ),
        (
            "inference_pool_average_running_requests",
            vec![("name", "llama-pool")],
        ),
        (
            "inference_pool_per_pod_queue_size",
            vec![
                ("name", "llama-pool"),
                ("model_server_pod", servers[0].address.as_str()),
            ],
        ),
        (
            "inference_pool_per_pod_queue_size",
            vec![
                ("name", "llama-pool"),
                ("model_server_pod", servers[1].address.as_str()),
            ],
        ),
        ("inference_extension_prefix_indexer_size", vec![]),
    ] {
        assert!(
            metric_line(&prom, name, &labels).is_some(),
            "{name} {labels:?} missing:\n{prom}"
        );
    }
    let info = metric_line(
        &prom,
        "inference_extension_info",
        &[("commit", env!("CARGO_PKG_VERSION"))],
    )
    .unwrap_or_else(|| panic!("{prom}"));
    assert!(info.contains("build_ref=\""), "{info}");
    assert_eq!(value(info), 1.0, "every VM sets 1, none adds: {info}");
    assert!(
        value(metric_line(&prom, "inference_extension_prefix_indexer_size", &[]).unwrap()) >= 1.0,
        "{prom}"
    );
    let count = |name: &str, labels: &[(&str, &str)]| {
        metric_line(&prom, &format!("{name}_count"), labels).map(value)
    };
    assert_eq!(
        count("inference_extension_scheduler_e2e_duration_seconds", &[]),
        Some(4.0),
        "{prom}"
    );
    assert_eq!(
        count("inference_extension_prefix_indexer_hit_ratio", &[]),
        Some(4.0),
        "{prom}"
    );
    assert_eq!(
        count("inference_extension_prefix_indexer_hit_bytes", &[]),
        Some(4.0),
        "{prom}"
    );
    // Plugins are timed on one decision in 16 per worker, starting with its first: of
    // these 4 decisions, the first of each worker that made one.
    let timed = count(
        "inference_extension_plugin_duration_seconds",
        &[
            ("extension_point", "Scorer"),
            ("plugin_type", "queue-scorer"),
            ("plugin_name", "queue-scorer"),
        ],
    );
    assert!(
        timed.is_some_and(|n| (1.0..=2.0).contains(&n)),
        "{timed:?} {prom}"
    );
    // One series per endpoint (pod_name, namespace, port), as the reference.
    let attempts: Vec<&str> = prom
        .lines()
        .filter(|l| {
            l.starts_with(&format!(
                "inference_extension_scheduler_attempts_total{{status=\"success\",target_model_name=\"{MODEL}\",pod_name=\"127.0.0.1\",namespace=\"\",port=\""
            ))
        })
        .collect();
    assert_eq!(
        attempts.iter().map(|l| value(l)).sum::<f64>(),
        4.0,
        "{prom}"
    );
    assert_eq!(
        metric_line(
            &prom,
            "inference_objective_running_requests",
            &[("model_name", MODEL)]
        )
        .map(value),
        Some(0.0)
    );
}

#[test]
fn a_repeated_prompt_follows_its_prefix_cache_across_workers() {
    let servers = VllmSimServer::fast_pool(3);
    let envoy = Envoy::start(&json!({}), &VllmSimServer::addresses(&servers), 2);
    // Each request is a new connection, so they land on both workers; the index learned
    // by whichever worker routed the first one steers every later one.
    let prompt = "System: you are a meticulous assistant. Context: ".repeat(10);
    let first = served_by(&envoy, &prompt);
    for i in 0..12 {
        assert_eq!(served_by(&envoy, &prompt), first, "request {i}");
    }
    // Different conversations still spread over the pool.
    let mut seen: HashMap<String, usize> = HashMap::new();
    for i in 0..30 {
        *seen
            .entry(served_by(
                &envoy,
                &format!("{i} another conversation entirely {i}").repeat(6),
            ))
            .or_default() += 1;
    }
    assert!(seen.len() >= 2, "{seen:?}");
}

#[test]
fn an_endpoint_that_stops_answering_leaves_the_candidates() {
    let mut servers = VllmSimServer::fast_pool(2);
    let envoy = Envoy::start(&json!({}), &VllmSimServer::addresses(&servers), 2);
    // Both serve at first.
    assert!(eventually(10, || {
        let p = envoy.prometheus();
        metric_line(&p, "inference_pool_ready_pods", &[]).is_some_and(|l| value(l) == 2.0)
    }));
    let dead = servers.remove(0);
    let alive = servers[0].address.clone();
    drop(dead);
    std::thread::sleep(Duration::from_millis(500));
    for i in 0..20 {
        let r = http::post_json(
            &envoy.listen,
            "/v1/completions",
            &completion(&format!("after {i}"), 2, false),
        )
        .unwrap();
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        assert_eq!(r.header("x-sim-server"), Some(alive.as_str()));
    }
    // The pool gauge counts only endpoints that answer.
    assert!(eventually(10, || {
        let p = envoy.prometheus();
        metric_line(&p, "inference_pool_ready_pods", &[]).is_some_and(|l| value(l) == 1.0)
    }));
}

#[test]
fn endpoints_are_discovered_from_envoys_cluster_membership() {
    let servers = VllmSimServer::fast_pool(2);
    let dir = scratch_dir("discovery");
    let config = dir.join("filter.json");
    std::fs::write(
        &config,
        json!({"pool": {"discovery": {"cluster": "model-servers", "refreshInterval": "100ms"}}})
            .to_string(),
    )
    .unwrap();
    let cluster = format!(
        "model-servers={}",
        VllmSimServer::addresses(&servers).join(",")
    );
    let envoy = Envoy::launch(&config, &[], 2, &["--cluster".to_string(), cluster]).unwrap();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let found = eventually(10, || {
        let r = http::post_json(
            &envoy.listen,
            "/v1/completions",
            &completion("hello", 2, false),
        )
        .unwrap();
        r.status == 200
    });
    assert!(
        found,
        "no request was served from discovered endpoints:\n{}",
        envoy.log_text()
    );
    for i in 0..30 {
        *seen
            .entry(served_by(&envoy, &format!("discovered {i}")))
            .or_default() += 1;
    }
    for s in &servers {
        assert!(
            seen.contains_key(&s.address),
            "{} never served: {seen:?}",
            s.address
        );
    }
}

#[test]
fn the_subset_hint_restricts_the_candidates() {
    let servers = VllmSimServer::fast_pool(3);
    let envoy = Envoy::start(&json!({}), &VllmSimServer::addresses(&servers), 2);
    for _ in 0..6 {
        let r = http::request(
            &envoy.listen,
            "POST",
            "/v1/completions",
            &[
                ("content-type", "application/json"),
                ("x-gateway-destination-endpoint-subset", &servers[2].address),
            ],
            completion("subset", 2, false).as_bytes(),
        )
        .unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-sim-server"), Some(servers[2].address.as_str()));
    }
    // A hint naming no pool member: 503 with a JSON error.
    let r = http::request(
        &envoy.listen,
        "POST",
        "/v1/completions",
        &[
            ("content-type", "application/json"),
            ("x-gateway-destination-endpoint-subset", "10.255.255.1:9"),
        ],
        completion("nowhere", 2, false).as_bytes(),
    )
    .unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["type"], "service_unavailable");
}

#[test]
fn a_yaml_configuration_as_in_the_reference_docs_loads() {
    let servers = VllmSimServer::fast_pool(2);
    let dir = scratch_dir("yaml");
    let path = dir.join("epp.yaml");
    std::fs::write(
        &path,
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\n\
         kind: EndpointPickerConfig\n\
         plugins:\n\
         - type: queue-scorer\n\
         - type: kv-cache-utilization-scorer\n\
         - type: prefix-cache-scorer\n\
         - type: max-score-picker\n\
         schedulingProfiles:\n\
         - name: default\n\
         \x20 plugins:\n\
         \x20 - pluginRef: queue-scorer\n\
         \x20   weight: 1\n\
         \x20 - pluginRef: kv-cache-utilization-scorer\n\
         \x20   weight: 1\n\
         \x20 - pluginRef: prefix-cache-scorer\n\
         \x20   weight: 5\n",
    )
    .unwrap();
    let envoy = Envoy::launch(&path, &VllmSimServer::addresses(&servers), 2, &[]).unwrap();
    served_by(&envoy, "yaml works");
}

#[test]
fn an_invalid_configuration_is_refused_and_envoy_says_why() {
    let servers = VllmSimServer::fast_pool(1);
    let dir = scratch_dir("bad");
    let path = dir.join("filter.json");
    std::fs::write(
        &path,
        json!({"plugins": [{"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"}, {"type": "foo-scorer"}]}).to_string(),
    )
    .unwrap();
    let err = match Envoy::launch(&path, &VllmSimServer::addresses(&servers), 1, &[]) {
        Ok(_) => panic!("Envoy started with an invalid configuration"),
        Err(e) => e,
    };
    assert!(
        err.contains("plugins[2].type") && err.contains("unknown plugin type \"foo-scorer\""),
        "{err}"
    );
    // The YAML path validates before Envoy starts, with the same message.
    let yaml = dir.join("bad.yaml");
    std::fs::write(&yaml, "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: nope\n").unwrap();
    let err = match Envoy::launch(&yaml, &VllmSimServer::addresses(&servers), 1, &[]) {
        Ok(_) => panic!("an invalid YAML configuration was accepted"),
        Err(e) => e,
    };
    assert!(
        err.contains("schedulingProfiles[0].plugins[0].pluginRef")
            && err.contains("unknown pluginRef \"nope\""),
        "{err}"
    );
}

#[test]
fn fallback_endpoints_ride_in_the_destination_header_and_the_primary_serves() {
    let servers = VllmSimServer::fast_pool(3);
    let envoy = Envoy::start(
        &json!({"plugins": [{"type": "queue-scorer"}, {"type": "max-score-picker", "parameters": {"maxNumOfEndpoints": 3}}]}),
        &VllmSimServer::addresses(&servers),
        2,
    );
    // A client cannot pick the primary either.
    let r = http::request(
        &envoy.listen,
        "POST",
        "/v1/completions",
        &[
            ("content-type", "application/json"),
            ("x-gateway-destination-endpoint-primary", "10.255.255.1:9"),
        ],
        completion("fb", 2, false).as_bytes(),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    for i in 0..6 {
        let r = http::post_json(
            &envoy.listen,
            "/v1/completions",
            &completion(&format!("fb {i}"), 2, false),
        )
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let served = r.header("x-gateway-destination-endpoint-served").unwrap();
        assert_eq!(Some(served), r.header("x-sim-server"));
    }
}

#[test]
fn model_rewrites_send_the_target_model_and_answer_with_the_clients_name() {
    let servers = VllmSimServer::fast_pool(1);
    let envoy = Envoy::start(
        &json!({"pool": {"modelRewrites": [{"name": "alias", "modelName": "friendly-name",
            "targets": [{"modelName": MODEL, "weight": 1}]}],
            "trustHeaders": {"modelRewrite": true}}}),
        &VllmSimServer::addresses(&servers),
        2,
    );
    let body = json!({"model": "friendly-name", "prompt": "hi", "max_tokens": 2}).to_string();
    let r = http::post_json(&envoy.listen, "/v1/completions", &body).unwrap();
    assert_eq!(r.status, 200, "the server knows only {MODEL}: {}", r.text());
    assert_eq!(r.json()["model"], "friendly-name", "{}", r.text());
    // The rewrite header works too where it is trusted; without any rewrite the server
    // refuses the name.
    let other = json!({"model": "unknown-name", "prompt": "hi", "max_tokens": 2}).to_string();
    let r = http::request(
        &envoy.listen,
        "POST",
        "/v1/completions",
        &[
            ("content-type", "application/json"),
            ("x-gateway-model-name-rewrite", MODEL),
        ],
        other.as_bytes(),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let r = http::post_json(&envoy.listen, "/v1/completions", &other).unwrap();
    assert_eq!(r.status, 404, "{}", r.text());
}

#[test]
fn a_request_the_filters_leave_no_endpoint_for_gets_429_or_with_fail_open_a_healthy_one() {
    let servers = VllmSimServer::fast_pool(2);
    let filtered_out = json!({"plugins": [
        {"type": "label-selector-filter", "parameters": {"matchLabels": {"zone": "nowhere"}}},
        {"type": "queue-scorer"}]});
    // Fail closed (the default): the reference's 429 ("failed to find target endpoint"),
    // with a JSON error naming the profile.
    let envoy = Envoy::start(&filtered_out, &VllmSimServer::addresses(&servers), 1);
    let r = http::post_json(
        &envoy.listen,
        "/v1/completions",
        &completion("closed", 2, false),
    )
    .unwrap();
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        message.starts_with("failed to find target endpoint") && message.contains("default"),
        "{message}"
    );
    drop(envoy);
    // Fail open: served anyway.
    let mut open = filtered_out.clone();
    open["pool"] = json!({"failOpen": true});
    let envoy = Envoy::start(&open, &VllmSimServer::addresses(&servers), 1);
    let r = http::post_json(
        &envoy.listen,
        "/v1/completions",
        &completion("open", 2, false),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_session_token_keeps_a_conversation_on_its_endpoint() {
    let servers = VllmSimServer::fast_pool(3);
    let envoy = Envoy::start(
        &json!({"plugins": [{"type": "session-affinity-scorer"}, {"type": "max-score-picker"}]}),
        &VllmSimServer::addresses(&servers),
        2,
    );
    let r = http::post_json(
        &envoy.listen,
        "/v1/completions",
        &completion("turn 0", 2, false),
    )
    .unwrap();
    assert_eq!(r.status, 200);
    let token = r
        .header("x-session-token")
        .expect("x-session-token")
        .to_string();
    let first = r.header("x-sim-server").unwrap().to_string();
    for i in 1..10 {
        let r = http::request(
            &envoy.listen,
            "POST",
            "/v1/completions",
            &[
                ("content-type", "application/json"),
                ("x-session-token", &token),
            ],
            completion(&format!("turn {i}"), 2, false).as_bytes(),
        )
        .unwrap();
        assert_eq!(r.header("x-sim-server"), Some(first.as_str()), "turn {i}");
    }
    // Without the token, ties are broken at random: more than one endpoint serves.
    let mut seen = std::collections::HashSet::new();
    for i in 0..20 {
        seen.insert(served_by(&envoy, &format!("anonymous {i}")));
    }
    assert!(seen.len() >= 2, "{seen:?}");
}
