//! `precise-prefix-cache-scorer` end to end: vllm-sim servers publish KV events over ZMQ,
//! `kv-relay` follows them, the filter in a real Envoy polls the relay. An eviction a
//! server reports stops the picker from crediting it (where the approximate index still
//! would), and a relay that goes away makes the filter fall back without failing requests.

use kv_relay::cli::Config;
use kv_relay::subscriber::{Liveness, Source};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;
use tests::envoy::Envoy;
use tests::http::{self, Response};
use tests::openai::{completion, MODEL};
use tests::vllm_sim_server::VllmSimServer;
use tests::{eventually, free_port, scratch_dir};

/// The relay on its own runtime; stopped when dropped.
struct Relay {
    running: Option<kv_relay::Running>,
    runtime: tokio::runtime::Runtime,
}

impl Relay {
    fn start(sources: Vec<Source>) -> Relay {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let running = runtime
            .block_on(kv_relay::start(Config {
                listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                sources,
                max_blocks: 100_000,
                log_capacity: 100_000,
                liveness: Liveness {
                    probe_every: Duration::from_millis(200),
                    stale_after: Duration::from_secs(2),
                    replay_timeout: Duration::from_millis(500),
                },
                tokenizer: None,
                chat_template: None,
                text_block_bytes: 64,
            }))
            .expect("relay starts");
        Relay {
            running: Some(running),
            runtime,
        }
    }

    fn addr(&self) -> String {
        self.running.as_ref().expect("running").addr.to_string()
    }

    /// Whether the relay reports `endpoint` holding `key`.
    fn holds(&self, endpoint: &str, key: u64) -> bool {
        let Ok(r) = http::get(&self.addr(), "/v1/kv/state") else {
            return false;
        };
        let v: Value = r.json();
        v["servers"].as_array().into_iter().flatten().any(|s| {
            s["endpoint"] == endpoint
                && s["stale"] == false
                && s["add"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|k| k.as_u64() == Some(key)))
        })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _g = self.runtime.enter();
        self.running.take();
    }
}

/// A server publishing KV events on chosen ports: (server, its relay source).
fn server() -> (VllmSimServer, Source) {
    let (events, replay) = (free_port(), free_port());
    let kv = json!({
        "enable_kv_cache_events": true, "publisher": "zmq",
        // `*`: bind, as vLLM (a plain address would make it connect to a subscriber).
        "endpoint": format!("tcp://*:{events}"),
        "replay_endpoint": format!("tcp://*:{replay}"),
        "topic": "kv@sim@sim-model",
    })
    .to_string();
    let s = VllmSimServer::start(&[
        "--model",
        MODEL,
        "--time-to-first-token",
        "5ms",
        "--inter-token-latency",
        "2ms",
        "--num-gpu-blocks",
        "16",
        "--kv-events-config",
        &kv,
    ]);
    let source = Source {
        endpoint: s.address.clone(),
        model: MODEL.into(),
        events: format!("tcp://127.0.0.1:{events}"),
        replay: Some(format!("tcp://127.0.0.1:{replay}")),
        topic: String::new(),
    };
    (s, source)
}

/// The keys of `prompt`'s 16-token blocks, as the relay and the filter compute them.
fn block_keys(prompt: &str) -> Vec<u64> {
    let tokens = vllm_sim::tokenizer::encode(prompt);
    let mut prev = kv_relay::keys::root(MODEL);
    tokens
        .chunks_exact(16)
        .map(|c| {
            prev = kv_relay::keys::block_key(prev, c);
            prev
        })
        .collect()
}

fn served_by(r: &Response) -> String {
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("x-sim-server").expect("x-sim-server").to_string()
}

fn cached_tokens(r: &Response) -> u64 {
    r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

#[test]
fn reported_evictions_stop_the_credit_and_a_lost_relay_falls_back() {
    let (a, source_a) = server();
    let (b, source_b) = server();
    let relay = Relay::start(vec![source_a, source_b]);
    let config = json!({
        "plugins": [
            {"type": "precise-prefix-cache-scorer",
             "parameters": {"relayCluster": "kv-relay", "pollIntervalMs": 100, "staleAfterMs": 1500}},
            {"type": "max-score-picker"}
        ],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": "precise-prefix-cache-scorer"}, {"pluginRef": "max-score-picker"}
        ]}]
    });
    let dir = scratch_dir("kv-events");
    let path = dir.join("filter.json");
    std::fs::write(&path, config.to_string()).expect("write config");
    let endpoints = [a.address.as_str(), b.address.as_str()];
    let envoy = Envoy::launch(
        &path,
        &endpoints,
        2,
        &["--cluster".into(), format!("kv-relay={}", relay.addr())],
    )
    .unwrap_or_else(|e| panic!("{e}"));

    // P: 8 blocks of 16 tokens. The first pick is a tie; whoever gets it is X.
    let p = "The quick brown fox jumps over the lazy dog. ".repeat(12);
    let p = &p[..512];
    let keys = block_keys(p);
    assert_eq!(keys.len(), 8);
    let send = |prompt: &str| {
        http::post_json(
            &envoy.listen,
            "/v1/completions",
            &completion(prompt, 1, false),
        )
        .expect("request through Envoy")
    };
    let x = served_by(&send(p));
    let y = if x == a.address {
        b.address.clone()
    } else {
        a.address.clone()
    };
    assert!(
        eventually(10, || relay.holds(&x, keys[7])),
        "the relay sees X's blocks"
    );
    // Y caches P's first 3 blocks (a request sent to it directly, not through the gateway).
    let direct = http::post_json(&y, "/v1/completions", &completion(&p[..192], 1, false))
        .expect("direct request");
    assert_eq!(direct.status, 200);
    assert!(eventually(10, || relay.holds(&y, keys[2])));
    std::thread::sleep(Duration::from_millis(400)); // every VM has polled
    let again = send(p);
    assert_eq!(served_by(&again), x, "X holds all of P");
    assert!(cached_tokens(&again) >= 16 * 7);

    // X evicts P: a 248-token prompt sent to X directly needs all 16 blocks of its cache
    // (the head block of P, unused longest after its tail, goes last).
    let filler = "0123456789abcdef".repeat(62);
    let evict = http::post_json(&x, "/v1/completions", &completion(&filler, 1, false))
        .expect("direct request");
    assert_eq!(evict.status, 200, "{}", evict.text());
    assert!(
        eventually(10, || !relay.holds(&x, keys[0])),
        "the relay sees X's eviction"
    );
    std::thread::sleep(Duration::from_millis(1500));
    // The approximate index still credits X (the gateway sent P there twice); the
    // reported state says X holds nothing of P and Y its first 3 blocks.
    let after = send(p);
    assert_eq!(
        served_by(&after),
        y,
        "the evicted server is no longer credited"
    );
    assert!(
        cached_tokens(&after) >= 16 * 2,
        "Y really had P's head cached"
    );

    // The relay goes away: after staleAfterMs every server falls back to the approximate
    // index, and requests keep succeeding. A new prompt Q is then sent where the
    // approximate index learned it went (stale precise state knows nothing of Q: a coin
    // toss each time).
    drop(relay);
    std::thread::sleep(Duration::from_millis(1_800));
    let q = "Pack my box with five dozen liquor jugs. ".repeat(10);
    let first = served_by(&send(&q));
    for _ in 0..6 {
        assert_eq!(served_by(&send(&q)), first, "the approximate index answers");
    }
}
