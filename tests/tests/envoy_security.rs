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
