//! The relay against vllm-sim over real ZMQ sockets: blocks a request cached appear
//! under the token-derived keys, an eviction removes them, a restarted relay recovers
//! the state through replay, and a server that stops is marked stale.

use kv_relay::cli::Config;
use kv_relay::keys;
use kv_relay::subscriber::{Liveness, Source};
use serde_json::Value;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vllm_sim::kv_events::KvEventsConfig;
use vllm_sim::server::{self, ServerConfig};

async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    let status = out[9..12].parse().expect("status");
    let body = out
        .split_once("\r\n\r\n")
        .map(|x| x.1)
        .unwrap_or("")
        .to_string();
    (status, body)
}

async fn sim() -> server::Server {
    let mut c = ServerConfig {
        port: 0,
        ..ServerConfig::default()
    };
    c.engine.latency = vllm_sim::engine::latency::LatencyProfile::zero();
    c.engine.num_gpu_blocks = 8;
    c.kv_events = KvEventsConfig::parse(
        r#"{"enable_kv_cache_events":true,"endpoint":"tcp://127.0.0.1:0","replay_endpoint":"tcp://127.0.0.1:0"}"#,
    )
    .unwrap();
    server::start(c).await.expect("vllm-sim starts")
}

async fn relay(sim: &server::Server) -> kv_relay::Running {
    let kv = &sim.kv_event_addrs()[0];
    kv_relay::start(Config {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        sources: vec![Source {
            endpoint: sim.addrs()[0].to_string(),
            model: "sim-model".into(),
            events: kv.events.clone(),
            replay: kv.replay.clone(),
            topic: String::new(),
        }],
        max_blocks: 1000,
        log_capacity: 1000,
        liveness: Liveness {
            probe_every: Duration::from_millis(100),
            stale_after: Duration::from_millis(600),
            replay_timeout: Duration::from_millis(300),
        },
        tokenizer: None,
        chat_template: None,
        text_block_bytes: 64,
    })
    .await
    .expect("relay starts")
}

/// The prompt's block keys as the filter computes them (16-token blocks).
fn prompt_keys(prompt: &str) -> Vec<u64> {
    let tokens = vllm_sim::tokenizer::encode(prompt);
    let mut prev = keys::root("sim-model");
    tokens
        .chunks_exact(16)
        .map(|c| {
            prev = keys::block_key(prev, c);
            prev
        })
        .collect()
}

async fn state(relay: SocketAddr) -> Value {
    let (status, body) = http(relay, "GET", "/v1/kv/state", "").await;
    assert_eq!(status, 200);
    serde_json::from_str(&body).expect("json")
}

/// Waits until `check` holds for the relay's snapshot of the first server.
async fn until(relay: SocketAddr, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = state(relay).await;
        if check(&s["servers"][0]) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {s}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn holds(server: &Value, key: u64) -> bool {
    server["add"]
        .as_array()
        .is_some_and(|a| a.iter().any(|k| k.as_u64() == Some(key)))
}

async fn complete(sim: &server::Server, prompt: &str) {
    let body = serde_json::json!({"model": "sim-model", "prompt": prompt, "max_tokens": 1});
    let (status, _) = http(sim.addrs()[0], "POST", "/v1/completions", &body.to_string()).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn stores_evictions_replay_and_staleness() {
    let sim = sim().await;
    let r = relay(&sim).await;
    until(r.addr, "the stream to be live", |s| s["stale"] == false).await;

    let a = "abcd".repeat(50);
    complete(&sim, &a).await;
    let ka = prompt_keys(&a);
    assert_eq!(ka.len(), 3);
    let s = until(r.addr, "A's blocks", |s| ka.iter().all(|k| holds(s, *k))).await;
    assert_eq!(s["servers"][0]["blockSize"], 16);
    assert_eq!(s["servers"][0]["endpoint"], sim.addrs()[0].to_string());

    // B needs 7 of the 8 blocks: A's blocks are evicted, and the relay forgets them.
    let b = "wxyz".repeat(100);
    complete(&sim, &b).await;
    let kb = prompt_keys(&b);
    until(r.addr, "A evicted, B stored", |s| {
        !holds(s, ka[2]) && kb.iter().all(|k| holds(s, *k))
    })
    .await;

    // A new relay (a restart) joins mid-stream and recovers the state by replay.
    drop(r);
    let r = relay(&sim).await;
    let s = until(r.addr, "state recovered by replay", |s| {
        kb.iter().all(|k| holds(s, *k)) && s["stale"] == false
    })
    .await;
    assert!(
        !holds(&s["servers"][0], ka[2]),
        "the replayed eviction applies too"
    );

    // Deltas: nothing changed since this version.
    let (epoch, version) = (s["epoch"].as_u64().unwrap(), s["version"].as_u64().unwrap());
    let (_, body) = http(
        r.addr,
        "GET",
        &format!("/v1/kv/state?epoch={epoch}&since={version}"),
        "",
    )
    .await;
    let d: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(d["full"], false);
    assert_eq!(d["servers"][0]["add"], serde_json::json!([]));

    // The server goes away: its stream is marked stale.
    drop(sim);
    until(r.addr, "stale after the server stopped", |s| {
        s["stale"] == true
    })
    .await;
    let (_, metrics) = http(r.addr, "GET", "/metrics", "").await;
    assert!(metrics.contains("kv_relay_stale{endpoint="), "{metrics}");
}
