//! A real tokenizer and chat template end to end: vllm-sim tokenizes with a model
//! directory's `tokenizer.json` and renders chats with its Jinja template (so its KV
//! events carry that model's token ids), the relay loads the same directory and
//! publishes text keys, and the filter's own code (`tokenizer: relay`) computes the keys
//! of the request without a tokenizer: a prompt stored on server A is credited to A and
//! not to B, and A's reported eviction removes the credit.
//!
//! The model directory is built by the test (`common`); `KV_RELAY_MODEL_DIR=DIR` runs the
//! same against a real model's files instead (e.g. Qwen3's, README "Precise prefix cache").

mod common;

use epp_filter::prefix::precise::{PreciseConfig, PreciseState};
use kv_relay::cli::Config;
use kv_relay::subscriber::{Liveness, Source};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vllm_sim::kv_events::KvEventsConfig;
use vllm_sim::model_tokenizer::ModelTokenizer;
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

async fn sim(model: &Arc<ModelTokenizer>) -> server::Server {
    let mut c = ServerConfig {
        port: 0,
        tokenizer: Some(model.clone()),
        ..ServerConfig::default()
    };
    c.engine.latency = vllm_sim::engine::latency::LatencyProfile::zero();
    c.engine.num_gpu_blocks = 16;
    c.kv_events = KvEventsConfig::parse(
        r#"{"enable_kv_cache_events":true,"endpoint":"tcp://127.0.0.1:0","replay_endpoint":"tcp://127.0.0.1:0"}"#,
    )
    .unwrap();
    server::start(c).await.expect("vllm-sim starts")
}

fn source(sim: &server::Server) -> Source {
    let kv = &sim.kv_event_addrs()[0];
    Source {
        endpoint: sim.addrs()[0].to_string(),
        model: "sim-model".into(),
        events: kv.events.clone(),
        replay: kv.replay.clone(),
        topic: String::new(),
    }
}

struct Filter {
    cfg: PreciseConfig,
    state: PreciseState,
}

impl Filter {
    fn new() -> Self {
        let cfg = PreciseConfig::from_parameters(&json!({"tokenizer": "relay"}), "p").unwrap();
        Filter {
            cfg,
            state: PreciseState::default(),
        }
    }

    async fn poll(&mut self, relay: SocketAddr) {
        let (status, body) = http(relay, "GET", "/v1/kv/state", "").await;
        assert_eq!(status, 200);
        self.state
            .apply(body.as_bytes(), 1, &self.cfg)
            .expect("applies");
    }

    /// `(matched, total)` text blocks per server for a chat (`messages`) or a completion.
    fn matched(
        &self,
        chat: Option<&[(&str, &str)]>,
        prompt: &str,
        servers: &[String],
    ) -> Vec<(u32, u32)> {
        let text = self
            .cfg
            .server_text(&self.state, chat.map(|m| m.iter().copied()), prompt)
            .expect("the learnt template shape renders the chat")
            .unwrap_or_else(|| prompt.to_string());
        self.state
            .matches(
                &self.cfg,
                "sim-model",
                &text,
                servers.iter().map(String::as_str),
                1,
            )
            .0
            .into_iter()
            .map(|m| {
                m.map(|m| (m.matched, m.total))
                    .expect("both servers are live")
            })
            .collect()
    }
}

async fn until(
    filter: &mut Filter,
    relay: SocketAddr,
    what: &str,
    check: impl Fn(&Filter) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        filter.poll(relay).await;
        if check(filter) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_real_tokenizer_and_chat_template_through_the_relay() {
    let real = std::env::var_os("KV_RELAY_MODEL_DIR").map(std::path::PathBuf::from);
    let dir = real
        .clone()
        .unwrap_or_else(|| common::model_dir("text-keys"));
    let model = Arc::new(ModelTokenizer::load(&dir).expect("vllm-sim loads the model directory"));
    let (a, b) = (sim(&model).await, sim(&model).await);
    let relay = kv_relay::start(Config {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        sources: vec![source(&a), source(&b)],
        max_blocks: 1000,
        log_capacity: 1000,
        liveness: Liveness {
            probe_every: Duration::from_millis(100),
            stale_after: Duration::from_millis(600),
            replay_timeout: Duration::from_millis(300),
        },
        tokenizer: Some(dir.clone()),
        chat_template: None,
        text_block_bytes: 64,
    })
    .await
    .expect("the relay loads the model directory");
    let servers = vec![a.addrs()[0].to_string(), b.addrs()[0].to_string()];
    let mut f = Filter::new();

    // The relay publishes how to key text: the BOS the tokenizer adds to completions,
    // and the template's shape (a Llama-3.1-style template, contents trimmed).
    f.poll(relay.addr).await;
    let (_, body) = http(relay.addr, "GET", "/v1/kv/state", "").await;
    let published: Value = serde_json::from_str(&body).unwrap();
    assert!(published["text"]["chat"].is_object(), "{published}");
    if real.is_none() {
        assert_eq!(published["text"]["completionPrefix"], common::BOS);
        assert_eq!(published["text"]["chat"]["trim"], true, "{published}");
    }

    // A chat stored on A: credited to A (all but the tail of its last, partial token
    // block), not to B.
    let chat = [
        ("system", "  You are a helpful assistant. Answer the question as briefly as you can.\n"),
        ("user", "What is the capital of France? The quick brown fox jumps over the lazy dog while the cat sleeps in the sun."),
    ];
    let body = json!({"model": "sim-model", "max_tokens": 1,
        "messages": chat.iter().map(|(r, c)| json!({"role": r, "content": c})).collect::<Vec<_>>()});
    let (status, _) = http(
        a.addrs()[0],
        "POST",
        "/v1/chat/completions",
        &body.to_string(),
    )
    .await;
    assert_eq!(status, 200);
    until(&mut f, relay.addr, "A's chat blocks", |f| {
        f.matched(Some(&chat), "", &servers)[0].0 > 0
    })
    .await;
    let m = f.matched(Some(&chat), "", &servers);
    let (matched, total) = m[0];
    assert!(total >= 4, "{m:?}");
    assert!(
        matched + 2 >= total,
        "A holds all but the last partial blocks: {m:?}"
    );
    assert_eq!(m[1].0, 0, "B holds nothing of it");

    // A completion stored on B (the tokenizer adds the BOS: the filter prepends its text).
    let prompt = "Prefix caching keeps the key and value tensors of a prompt's leading tokens. A gateway routes each request to the model server that holds most of its prefix.";
    let body = json!({"model": "sim-model", "max_tokens": 1, "prompt": prompt});
    let (status, _) = http(b.addrs()[0], "POST", "/v1/completions", &body.to_string()).await;
    assert_eq!(status, 200);
    until(&mut f, relay.addr, "B's completion blocks", |f| {
        let m = f.matched(None, prompt, &servers);
        m[1].0 > 0 && m[1].0 + 2 >= m[1].1
    })
    .await;
    assert_eq!(f.matched(None, prompt, &servers)[0].0, 0);

    // A needs all 16 of its blocks for another prompt (token ids): the chat's blocks are
    // evicted, A reports it, and the filter stops crediting A.
    let ids: Vec<u32> = (100..355).collect();
    let body = json!({"model": "sim-model", "max_tokens": 1, "prompt": ids});
    let (status, _) = http(a.addrs()[0], "POST", "/v1/completions", &body.to_string()).await;
    assert_eq!(status, 200);
    until(&mut f, relay.addr, "A's eviction", |f| {
        f.matched(Some(&chat), "", &servers)[0].0 == 0
    })
    .await;
    if real.is_none() {
        let _ = std::fs::remove_dir_all(dir);
    }
}
