//! The trust boundary for the headers that grant a share and a priority
//! (`pool.classification`), through a real Envoy (2 workers): by default a client's
//! `x-gateway-inference-*` headers are believed (the reference's behaviour); `none`
//! ignores them; `header` / `metadata` / `filterState` take the values an earlier Envoy
//! filter established (here `jwt_authn` with a local HS256 key, as Istio's
//! `RequestAuthentication` configures it, and `set_filter_state`); `allowed` limits the
//! objectives a request may claim.
//!
//! What the gateway decided is read from the flow-control admission metric, labelled by
//! fairness id and priority.

use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tests::envoy::Envoy;
use tests::http;
use tests::openai::MODEL;
use tests::scratch_dir;
use tests::vllm_sim_server::VllmSimServer;

/// `{"iss":"https://issuer.test","sub":"alice","tier":"premium"}`, HS256 with [`KEY`].
const ALICE_PREMIUM: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJpc3MiOiJodHRwczovL2lzc3Vlci50ZXN0Iiwic3ViIjoiYWxpY2UiLCJ0aWVyIjoicHJlbWl1bSJ9.FIHTNpAiS2mdOZT2ZnGUG1QEbaydX23vOsXMVoWeBBw";
/// `{"iss":"https://issuer.test","sub":"bob","tier":"standard"}`, HS256 with [`KEY`].
const BOB_STANDARD: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJpc3MiOiJodHRwczovL2lzc3Vlci50ZXN0Iiwic3ViIjoiYm9iIiwidGllciI6InN0YW5kYXJkIn0.iTpEwZEyprClqJm3T9SG_uOl4BqlsCJGrKR6tFAUTAw";
/// base64url of the shared secret `epp-test-secret-0123456789abcdef`.
const KEY: &str = "ZXBwLXRlc3Qtc2VjcmV0LTAxMjM0NTY3ODlhYmNkZWY";

/// `jwt_authn` requiring a token from the test issuer: `sub` → `x-tenant`, `tier` →
/// `x-tier` (Istio's `outputClaimToHeaders`), the payload in dynamic metadata.
fn jwt_authn() -> String {
    let jwks = json!({"keys": [{"kty": "oct", "alg": "HS256", "k": KEY}]}).to_string();
    format!(
        r#"          - name: envoy.filters.http.jwt_authn
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication
              providers:
                test:
                  issuer: https://issuer.test
                  local_jwks: {{inline_string: {jwks}}}
                  payload_in_metadata: payload
                  claim_to_headers:
                  - {{header_name: x-tenant, claim_name: sub}}
                  - {{header_name: x-tier, claim_name: tier}}
              rules:
              - match: {{prefix: /}}
                requires: {{provider_name: test}}
"#,
        jwks = serde_json::to_string(&jwks).unwrap()
    )
}

/// `set_filter_state`: the filter-state object `epp.tier` from the `x-tier` header.
fn set_filter_state() -> String {
    r#"          - name: envoy.filters.http.set_filter_state
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.set_filter_state.v3.Config
              on_request_headers:
              - object_key: epp.tier
                factory_key: envoy.string
                format_string: {text_format_source: {inline_string: "%REQ(x-tier)%"}}
"#
    .to_string()
}

/// Flow control on with room for everything (so every request is admitted and counted
/// under its flow), `premium` at 100 and `standard` at 0, and `classification`.
fn config(classification: Value) -> Value {
    json!({
        "featureGates": ["flowControl"],
        "plugins": [{"type": "concurrency-detector", "parameters": {"maxConcurrency": 100}}],
        "saturationDetector": {"pluginRef": "concurrency-detector"},
        "pool": {
            "objectives": [{"name": "premium", "priority": 100}, {"name": "standard", "priority": 0}],
            "classification": classification
        }
    })
}

fn start(classification: Value, pre_filter: Option<String>, server: &VllmSimServer) -> Envoy {
    let dir = scratch_dir("security");
    let path = dir.join("filter.json");
    std::fs::write(&path, config(classification).to_string()).unwrap();
    let mut extra = Vec::new();
    if let Some(f) = pre_filter {
        let p = dir.join("pre-filter.yaml");
        std::fs::write(&p, f).unwrap();
        extra = vec!["--pre-filter".to_string(), p.display().to_string()];
    }
    Envoy::launch(&path, &[&server.address], 2, &extra).unwrap_or_else(|e| panic!("{e}"))
}

/// A completion with `headers`; its status.
fn send(envoy: &Envoy, headers: &[(&str, &str)]) -> u16 {
    let body = json!({"model": MODEL, "prompt": "hello", "max_tokens": 2}).to_string();
    let mut h = vec![("content-type", "application/json")];
    h.extend_from_slice(headers);
    http::request(
        &envoy.listen,
        "POST",
        "/v1/completions",
        &h,
        body.as_bytes(),
    )
    .expect("request")
    .status
}

/// The (fairness id, priority) of every request flow control admitted, with counts, once
/// `total` are counted (histograms reach the admin API at Envoy's 1 s stats flush).
fn admitted(envoy: &Envoy, total: u64) -> Vec<(String, String, u64)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = admitted_now(envoy);
        if seen.iter().map(|(_, _, n)| n).sum::<u64>() >= total || Instant::now() > deadline {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn admitted_now(envoy: &Envoy) -> Vec<(String, String, u64)> {
    let label = |line: &str, name: &str| -> String {
        let key = format!("{name}=\"");
        line.split(&key)
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_default()
            .to_string()
    };
    let mut out: Vec<(String, String, u64)> = envoy
        .prometheus()
        .lines()
        .filter(|l| {
            l.starts_with(
                "inference_extension_flow_control_request_enqueue_duration_seconds_count{",
            )
        })
        .filter_map(|l| {
            let n: u64 = l.rsplit(' ').next()?.parse().ok()?;
            (n > 0).then(|| (label(l, "fairness_id"), label(l, "priority"), n))
        })
        .collect();
    out.sort();
    out
}

fn flows(list: &[(&str, &str, u64)]) -> Vec<(String, String, u64)> {
    list.iter()
        .map(|(f, p, n)| (f.to_string(), p.to_string(), *n))
        .collect()
}

const SPOOF: &[(&str, &str)] = &[
    ("x-gateway-inference-fairness-id", "someone-else"),
    ("x-gateway-inference-objective", "premium"),
];

#[test]
fn by_default_a_client_picks_its_tenant_and_priority() {
    let server = VllmSimServer::start(&["--model", MODEL]);
    let envoy = start(json!({}), None, &server);
    assert_eq!(send(&envoy, SPOOF), 200);
    assert_eq!(send(&envoy, &[]), 200);
    assert_eq!(
        admitted(&envoy, 2),
        flows(&[("default-flow", "0", 1), ("someone-else", "100", 1)])
    );
}

#[test]
fn from_none_ignores_the_client_and_uses_the_defaults() {
    let server = VllmSimServer::start(&["--model", MODEL]);
    let envoy = start(
        json!({
            "fairnessId": {"from": "none", "default": "everyone"},
            "objective": {"from": "none", "default": "standard"}
        }),
        None,
        &server,
    );
    assert_eq!(send(&envoy, SPOOF), 200);
    assert_eq!(
        send(&envoy, &[("x-llm-d-inference-objective", "premium")]),
        200
    );
    assert_eq!(admitted(&envoy, 2), flows(&[("everyone", "0", 2)]));
}

#[test]
fn from_a_header_set_by_jwt_authn_the_token_decides_and_client_headers_do_not() {
    let server = VllmSimServer::start(&["--model", MODEL]);
    let envoy = start(
        json!({
            "fairnessId": {"from": "header", "header": "x-tenant"},
            "objective": {"from": "header", "header": "x-tier", "default": "standard"}
        }),
        Some(jwt_authn()),
        &server,
    );
    let alice = format!("Bearer {ALICE_PREMIUM}");
    let bob = format!("Bearer {BOB_STANDARD}");
    // The gateway's own headers are ignored; a client's copy of the claim headers is
    // replaced by jwt_authn with the token's claims.
    let mut spoof = SPOOF.to_vec();
    spoof.extend([
        ("x-tenant", "mallory"),
        ("x-tier", "premium"),
        ("authorization", bob.as_str()),
    ]);
    assert_eq!(send(&envoy, &spoof), 200);
    assert_eq!(send(&envoy, &[("authorization", alice.as_str())]), 200);
    // Without a token jwt_authn refuses the request before the picker sees it.
    assert_eq!(send(&envoy, SPOOF), 401);
    assert_eq!(
        admitted(&envoy, 2),
        flows(&[("alice", "100", 1), ("bob", "0", 1)])
    );
}

#[test]
fn from_dynamic_metadata_with_an_allow_list_a_token_cannot_claim_more_than_allowed() {
    let server = VllmSimServer::start(&["--model", MODEL]);
    let envoy = start(
        json!({
            "fairnessId": {"from": "metadata", "metadata": {
                "namespace": "envoy.filters.http.jwt_authn", "path": ["payload", "sub"]}},
            "objective": {"from": "metadata", "metadata": {
                "namespace": "envoy.filters.http.jwt_authn", "path": ["payload", "tier"]},
                "default": "standard", "allowed": ["standard"]}
        }),
        Some(jwt_authn()),
        &server,
    );
    let alice = format!("Bearer {ALICE_PREMIUM}");
    let mut spoof = SPOOF.to_vec();
    spoof.push(("authorization", alice.as_str()));
    assert_eq!(send(&envoy, &spoof), 200);
    // alice's token says premium; only standard may be claimed.
    assert_eq!(admitted(&envoy, 1), flows(&[("alice", "0", 1)]));
}

#[test]
fn from_filter_state_the_object_an_earlier_filter_set_decides() {
    let server = VllmSimServer::start(&["--model", MODEL]);
    let envoy = start(
        json!({"objective": {"from": "filterState", "filterState": "epp.tier"}}),
        Some(set_filter_state()),
        &server,
    );
    assert_eq!(
        send(
            &envoy,
            &[
                ("x-tier", "premium"),
                ("x-gateway-inference-objective", "standard")
            ]
        ),
        200
    );
    assert_eq!(send(&envoy, &[]), 200);
    assert_eq!(
        admitted(&envoy, 2),
        flows(&[("default-flow", "0", 1), ("default-flow", "100", 1)])
    );
}

// ---------------------------------------------------------------------------------------
// Hostile clients: client-chosen strings bounded before they become stats, headers that
// steer the gateway obeyed only where trusted (`pool.trustHeaders`), tunnels never held,
// the restored model name JSON-encoded.
// ---------------------------------------------------------------------------------------

/// Envoy (2 workers) with the filter configured by `pool`, in front of `server`.
fn gateway(pool: Value, server: &VllmSimServer) -> Envoy {
    Envoy::start(&json!({ "pool": pool }), &[&server.address], 2)
}

/// A completion naming `model`, with `headers`.
fn complete(envoy: &Envoy, model: &str, stream: bool, headers: &[(&str, &str)]) -> http::Response {
    let body = json!({"model": model, "prompt": "hello", "max_tokens": 2, "stream": stream});
    let mut h = vec![("content-type", "application/json")];
    h.extend_from_slice(headers);
    http::request(
        &envoy.listen,
        "POST",
        "/v1/completions",
        &h,
        body.to_string().as_bytes(),
    )
    .expect("request")
}

/// Envoy's `/stats` text.
fn stats_text(envoy: &Envoy) -> String {
    http::get(&envoy.admin, "/stats")
        .expect("admin /stats")
        .text()
}

#[test]
fn a_new_model_name_of_256_kib_does_not_stall_the_other_requests() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let server = VllmSimServer::start(&["--model", MODEL]);
    let envoy = gateway(json!({}), &server);
    assert_eq!(complete(&envoy, MODEL, false, &[]).status, 200);
    // Hostile: 4 requests, each naming a new model of 256 KiB (every server answers 404).
    let done = Arc::new(AtomicBool::new(false));
    let hostile = {
        let (listen, done) = (envoy.listen.clone(), done.clone());
        std::thread::spawn(move || {
            let mut statuses = Vec::new();
            for i in 0..4 {
                let model = format!("{i}{}", "m".repeat(256 << 10));
                let body = json!({"model": model, "prompt": "x", "max_tokens": 1}).to_string();
                let r = http::post_json(&listen, "/v1/completions", &body).expect("hostile");
                statuses.push(r.status);
            }
            done.store(true, Ordering::SeqCst);
            statuses
        })
    };
    // Well-formed requests all the while: each is answered within a generous 1 s (before
    // the fix one such name held every worker for about 6 s).
    let mut latencies = Vec::new();
    while !done.load(Ordering::SeqCst) || latencies.len() < 5 {
        let t = Instant::now();
        let r = complete(&envoy, MODEL, false, &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        latencies.push(t.elapsed());
    }
    let statuses = hostile.join().unwrap();
    assert_eq!(
        statuses,
        vec![404; 4],
        "the hostile requests reach the server and get its 404"
    );
    let worst = latencies.iter().max().unwrap();
    assert!(
        *worst < Duration::from_secs(1),
        "a well-formed request waited {worst:?} while a hostile one was in flight ({latencies:?})"
    );
}

#[test]
fn a_model_name_cannot_forge_lines_in_envoys_stats() {
    let server = VllmSimServer::start(&["--model", MODEL]);
    let envoy = gateway(json!({}), &server);
    let forged = [
        "m\nwasm.epp.vm_reload: 999\nx",
        "m\0\nforged_family{a=\"b\"} 1\nforged_family 2\n",
        "m\r\nwasm.epp.vm_reload: 998\r\n",
    ];
    for model in forged {
        assert_eq!(complete(&envoy, model, false, &[]).status, 404);
    }
    let stats = stats_text(&envoy);
    for line in stats.lines() {
        assert!(
            !line.starts_with("wasm.epp.vm_reload: 99") && !line.starts_with("forged_family"),
            "a forged line in /stats: {line:?}"
        );
    }
    let prom = envoy.prometheus();
    for line in prom.lines() {
        assert!(
            !line.starts_with("forged_family") && !line.starts_with("wasm"),
            "a forged line in /stats/prometheus: {line:?}"
        );
    }
    // The names are kept, with the control characters replaced.
    assert!(
        prom.contains("model_name=\"m_wasm.epp.vm_reload: 999_x\""),
        "{}",
        prom.lines()
            .filter(|l| l.contains("model_name"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn a_clients_model_rewrite_header_is_ignored_unless_trusted() {
    let server = VllmSimServer::start(&["--model", MODEL]);
    let rewrite = [("x-gateway-model-name-rewrite", MODEL)];
    let twin = [("x-llm-d-model-name-rewrite", MODEL)];
    // Default: the body's model is what the server is asked for (and it serves no such model).
    let envoy = gateway(json!({}), &server);
    for h in [&rewrite, &twin] {
        let r = complete(&envoy, "forbidden-model", false, h);
        assert_eq!(
            r.status,
            404,
            "the client chose the model served: {}",
            r.text()
        );
    }
    drop(envoy);
    // Trusted (an earlier filter or the route sets it): obeyed, and the client's name
    // comes back in the response.
    let envoy = gateway(json!({"trustHeaders": {"modelRewrite": true}}), &server);
    for h in [&rewrite, &twin] {
        let r = complete(&envoy, "forbidden-model", false, h);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["model"], "forbidden-model");
    }
}

#[test]
fn the_subset_hint_is_obeyed_unless_turned_off() {
    let server = VllmSimServer::start(&["--model", MODEL]);
    let elsewhere = [("x-gateway-destination-endpoint-subset", "10.255.255.1:9")];
    let envoy = gateway(json!({}), &server);
    let r = complete(&envoy, MODEL, false, &elsewhere);
    assert_eq!(r.status, 503, "no pool member in the hint: {}", r.text());
    drop(envoy);
    let envoy = gateway(json!({"trustHeaders": {"subset": false}}), &server);
    let r = complete(&envoy, MODEL, false, &elsewhere);
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_bad_trust_switch_is_refused_at_load_naming_the_field() {
    let server = VllmSimServer::start(&["--model", MODEL]);
    let dir = scratch_dir("trust");
    let path = dir.join("filter.json");
    std::fs::write(
        &path,
        json!({"pool": {"trustHeaders": {"modelRewrite": "yes"}}}).to_string(),
    )
    .unwrap();
    let err = match Envoy::launch(&path, &[&server.address], 1, &[]) {
        Ok(_) => panic!("Envoy started with an invalid trust switch"),
        Err(e) => e,
    };
    assert!(
        err.contains("pool.trustHeaders.modelRewrite") && err.contains("must be true or false"),
        "{err}"
    );
}

#[test]
fn connect_is_answered_at_once() {
    use std::io::{Read, Write};
    let server = VllmSimServer::start(&["--model", MODEL]);
    let envoy = gateway(json!({}), &server);
    // CONNECT to the admin port through the listener: answered (Envoy's 404: no route
    // takes CONNECT), not held waiting for a body.
    let mut s = std::net::TcpStream::connect(&envoy.listen).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let head = format!("CONNECT {0} HTTP/1.1\r\nhost: {0}\r\n\r\n", envoy.admin);
    s.write_all(head.as_bytes()).unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 256];
    let n = s.read(&mut buf).unwrap_or(0);
    let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(
        answer.starts_with("HTTP/1.1 404"),
        "CONNECT got {answer:?} after {:?}",
        t.elapsed()
    );
    // The gateway still serves.
    assert_eq!(complete(&envoy, MODEL, false, &[]).status, 200);
}

#[test]
fn a_clients_envoy_routing_header_never_reaches_the_server() {
    let server = VllmSimServer::start(&["--model", MODEL]);
    let envoy = gateway(json!({}), &server);
    let r = complete(
        &envoy,
        MODEL,
        false,
        &[("x-envoy-original-dst-host", envoy.admin.as_str())],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // vllm-sim lists the x- headers it received.
    let seen = r.header("x-sim-request-headers").unwrap_or_default();
    assert!(
        seen.contains("x-gateway-destination-endpoint"),
        "the header list: {seen}"
    );
    assert!(
        !seen.split(',').any(|h| h == "x-envoy-original-dst-host"),
        "forwarded: {seen}"
    );
}

#[test]
fn the_restored_model_name_is_json_encoded_streamed_and_not() {
    let server = VllmSimServer::start(&["--model", MODEL]);
    let envoy = gateway(
        json!({"modelRewrites": [{"name": "all", "targets": [{"modelName": MODEL}]}]}),
        &server,
    );
    for model in [
        "x\",\"choices\":[],\"injected\":\"",
        "back\\slash",
        "quote\"d",
        "new\nline",
    ] {
        let r = complete(&envoy, model, false, &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["model"], model, "{}", r.text());
        assert!(v.get("injected").is_none(), "{}", r.text());
        assert!(
            v["choices"].as_array().is_some_and(|c| !c.is_empty()),
            "{v}"
        );
        let r = complete(&envoy, model, true, &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        let mut events = 0;
        for data in r.text().lines().filter_map(|l| l.strip_prefix("data: ")) {
            if data == "[DONE]" {
                continue;
            }
            let v: Value = serde_json::from_str(data)
                .unwrap_or_else(|e| panic!("a chunk is not JSON ({e}): {data}"));
            assert_eq!(v["model"], model, "{data}");
            assert!(v.get("injected").is_none(), "{data}");
            events += 1;
        }
        assert!(events >= 2, "{}", r.text());
    }
}

#[test]
fn junk_model_names_do_not_take_the_label_places_of_later_models() {
    let server = VllmSimServer::start(&["--model", MODEL]);
    // One worker, so that a flood bounded in time passes its 1,000 places.
    let envoy = Envoy::start(&json!({}), &[&server.address], 1);
    // 1,120 names no server serves, from 8 clients at once; every one gets the server's 404.
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let listen = envoy.listen.clone();
            std::thread::spawn(move || {
                for i in 0..140 {
                    let body =
                        json!({"model": format!("junk-{t}-{i}"), "prompt": "x", "max_tokens": 1});
                    let r = http::post_json(&listen, "/v1/completions", &body.to_string()).unwrap();
                    assert_eq!(r.status, 404);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // A model asked for afterwards has its own series (its first request, before any
    // answer, may count under `other`).
    const N: u64 = 12;
    for _ in 0..N {
        assert_eq!(complete(&envoy, MODEL, false, &[]).status, 200);
    }
    // (Envoy lists the tags in the order its `stats_tags` rules extract them.)
    let series = format!(
        "inference_objective_request_total{{target_model_name=\"{MODEL}\",model_name=\"{MODEL}\"}} "
    );
    let count = |prom: &str| -> u64 {
        prom.lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let mut prom = String::new();
    tests::eventually(5, || {
        prom = envoy.prometheus();
        count(&prom) >= N - 1
    });
    assert!(
        count(&prom) >= N - 1,
        "{MODEL} is not counted under its name: {}",
        prom.lines()
            .filter(|l| !l.contains("junk-") && l.contains("model"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The junk took at most its small budget of Envoy's places (100).
    let junk: std::collections::BTreeSet<&str> = prom
        .lines()
        .filter(|l| l.starts_with("inference_objective_request_total{"))
        .filter_map(|l| l.split("model_name=\"junk-").nth(1)?.split('"').next())
        .collect();
    assert!(junk.len() <= 100, "{} junk names have a stat", junk.len());
}

#[test]
fn a_trusted_rewrite_header_set_by_an_earlier_filter_overrides_the_clients() {
    // README's recipe: `header_mutation` before the picker owns the header.
    let server = VllmSimServer::start(&["--model", MODEL]);
    let dir = scratch_dir("trust-recipe");
    let path = dir.join("filter.json");
    std::fs::write(
        &path,
        json!({"pool": {"trustHeaders": {"modelRewrite": true}}}).to_string(),
    )
    .unwrap();
    let pre = dir.join("pre-filter.yaml");
    std::fs::write(
        &pre,
        format!(
            r#"          - name: envoy.filters.http.header_mutation
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
              mutations:
                request_mutations:
                - append:
                    header: {{key: x-gateway-model-name-rewrite, value: {MODEL}}}
                    append_action: OVERWRITE_IF_EXISTS_OR_ADD
                - remove: x-llm-d-model-name-rewrite
"#
        ),
    )
    .unwrap();
    let extra = vec!["--pre-filter".to_string(), pre.display().to_string()];
    let envoy =
        Envoy::launch(&path, &[&server.address], 2, &extra).unwrap_or_else(|e| panic!("{e}"));
    for h in [
        vec![("x-gateway-model-name-rewrite", "forbidden-model")],
        vec![("x-llm-d-model-name-rewrite", "forbidden-model")],
        vec![],
    ] {
        let r = complete(&envoy, "alias-of-the-route", false, &h);
        assert_eq!(r.status, 200, "{h:?}: {}", r.text());
        assert_eq!(r.json()["model"], "alias-of-the-route");
    }
}
