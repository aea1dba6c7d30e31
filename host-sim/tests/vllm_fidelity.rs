//! `VllmUpstream` answers with the bytes the real `vllm-sim` HTTP server sends: the same
//! requests, one after the other, to a server on loopback and to the adapter in virtual
//! time, with the same seed, give the same statuses, headers and bodies (the response
//! `id` and `created` fields, which carry the wall-clock time, aside).

use host_sim::vllm_sim::engine::EngineConfig;
use host_sim::vllm_sim::server::{self, ServerConfig};
use host_sim::world::upstream::{Emit, UpstreamRequest};
use host_sim::{Nanos, Upstream, VllmConfig, SEC};

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

/// One request to the real server (`tests::http`: its own connection, body de-chunked).
fn http(addr: &str, method: &str, path: &str, body: &str) -> Response {
    let r = tests::http::request(
        addr,
        method,
        path,
        &[("content-type", "application/json")],
        body.as_bytes(),
    )
    .expect("request");
    Response {
        status: r.status,
        body: r.text(),
        headers: r.headers,
    }
}

/// What the adapter sends for one request started at `at` (drained to the end).
fn adapter(
    u: &mut impl Upstream,
    at: Nanos,
    id: u64,
    method: &str,
    path: &str,
    body: &str,
) -> Response {
    u.start(
        at,
        id,
        &UpstreamRequest {
            method: method.into(),
            path: path.into(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.as_bytes().to_vec(),
        },
    );
    let mut r = Response {
        status: 0,
        headers: Vec::new(),
        body: String::new(),
    };
    for _ in 0..100_000 {
        let Some(t) = u.next_wake() else { break };
        let mut out = Vec::new();
        u.poll(t, &mut out);
        for e in out {
            match e {
                Emit::Head {
                    status, headers, ..
                } => {
                    r.status = status;
                    r.headers = headers;
                }
                Emit::Data { bytes, .. } => r.body.push_str(std::str::from_utf8(&bytes).unwrap()),
                Emit::End { .. } => {}
            }
        }
    }
    r
}

/// Ids and `created` carry wall-clock time; everything else must match.
fn normalize(body: &str) -> String {
    let id = regex::Regex::new(r#""id":"(chatcmpl|cmpl)-[0-9a-f]{32}""#).unwrap();
    let created = regex::Regex::new(r#""created":\d+"#).unwrap();
    let body = id.replace_all(body, r#""id":"$1-X""#);
    created.replace_all(&body, r#""created":0"#).into_owned()
}

fn comparable(headers: &[(String, String)]) -> Vec<(String, String)> {
    let mut h: Vec<(String, String)> = headers
        .iter()
        // Hop-by-hop and wall-clock headers, and the HTTP server's echo of the request's
        // headers (a test aid of the real server only).
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "date" | "transfer-encoding" | "connection" | "x-sim-request-headers"
            )
        })
        .cloned()
        .collect();
    h.sort();
    h
}

#[test]
fn the_adapter_sends_what_the_http_server_sends() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let engine = EngineConfig {
        seed: 42,
        max_num_seqs: 4,
        ..EngineConfig::default()
    };
    let srv = rt
        .block_on(server::start(ServerConfig {
            port: 0,
            engine: EngineConfig {
                latency: host_sim::vllm_sim::engine::latency::LatencyProfile::zero(),
                ..engine.clone()
            },
            ..ServerConfig::default()
        }))
        .expect("server starts");
    let addr = srv.addrs()[0].to_string();
    let mut u = VllmConfig::new(&addr)
        .profile("zero")
        .seed(42)
        .max_num_seqs(4)
        .build();

    let prefix: String = (0..40).map(|i| format!("word{i:02} ")).collect();
    let cases: Vec<(&str, &str, String)> = vec![
        (
            "POST",
            "/v1/completions",
            format!(
                r#"{{"model":"sim-model","prompt":"{prefix}one","max_tokens":12,"stream":true,"stream_options":{{"include_usage":true}}}}"#
            ),
        ),
        (
            "POST",
            "/v1/completions",
            format!(r#"{{"prompt":"{prefix}two","max_tokens":7}}"#),
        ),
        (
            "POST",
            "/v1/chat/completions",
            format!(
                r#"{{"messages":[{{"role":"system","content":"{prefix}"}},{{"role":"user","content":"hi"}}],"max_tokens":9,"stream":true,"stream_options":{{"include_usage":true,"continuous_usage_stats":true}}}}"#
            ),
        ),
        (
            "POST",
            "/v1/chat/completions",
            format!(
                r#"{{"messages":[{{"role":"system","content":"{prefix}"}},{{"role":"user","content":"again"}}],"max_completion_tokens":5,"ignore_eos":true}}"#
            ),
        ),
        (
            "POST",
            "/v1/completions",
            r#"{"prompt":["a b c d","e f g h"],"max_tokens":3}"#.to_string(),
        ),
        ("POST", "/v1/completions", "{broken".to_string()),
        (
            "POST",
            "/v1/completions",
            r#"{"model":"nope","prompt":"x"}"#.to_string(),
        ),
        (
            "POST",
            "/v1/chat/completions",
            r#"{"messages":[]}"#.to_string(),
        ),
        ("GET", "/v1/unknown", String::new()),
        ("GET", "/health", String::new()),
    ];
    for (i, (method, path, body)) in cases.iter().enumerate() {
        let real = http(&addr, method, path, body);
        let sim = adapter(&mut u, (i as Nanos + 1) * SEC, i as u64, method, path, body);
        assert_eq!(sim.status, real.status, "case {i}: {body}");
        assert_eq!(
            comparable(&sim.headers),
            comparable(&real.headers),
            "case {i}"
        );
        assert_eq!(normalize(&sim.body), normalize(&real.body), "case {i}");
        if i == 3 {
            // The second chat reused the first's system prompt on both sides.
            assert!(real.body.contains(r#""cached_tokens":64"#), "{}", real.body);
        }
    }
    drop(srv);
}
