//! The HTTP server: one listener and one engine per data-parallel rank (on
//! consecutive ports), an engine task that runs the engine in real time, and
//! hyper connections with TCP_NODELAY so streamed chunks leave at once.
//!
//! `routes` dispatches every path and serves completions, chat, models, health,
//! metrics, LoRA and admin; `apis` serves the other APIs of [`crate::api`].

mod apis;
mod routes;

use crate::api::conversations::Conversations;
use crate::api::sse::Routed;
use crate::api::tokenize::Vocabulary;
use crate::engine::{Engine, EngineConfig, EventKind, RequestId};
use crate::failures::FailureConfig;
use crate::metrics::MetricsOptions;
use crate::rng::Rng;
use crate::time::{Clock, RealClock};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// A LoRA adapter loaded at start (`--lora-modules`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoraModule {
    pub name: String,
    pub path: String,
}

/// Everything the server needs. See [`crate::cli`] for the flags.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub host: IpAddr,
    /// First rank's port; 0 = ephemeral for every rank.
    pub port: u16,
    /// Names the model answers to; the first is the one displayed.
    pub served_model_names: Vec<String>,
    /// Value of the `x-sim-server` header; default `ip:port`.
    pub server_name: Option<String>,
    /// Engine settings; `engine.model` is set from `served_model_names`.
    pub engine: EngineConfig,
    pub data_parallel_size: usize,
    /// `/health/ready` answers 503 (and inference requests 503) for this long.
    pub startup_duration: Duration,
    pub failures: FailureConfig,
    pub metrics: MetricsOptions,
    pub lora_modules: Vec<LoraModule>,
    pub max_request_body_bytes: usize,
    /// `--kv-events-config` (events on); `None`: no KV events.
    pub kv_events: Option<crate::kv_events::KvEventsConfig>,
    /// `--tokenizer DIR`: a real model's tokenizer and chat template; `None`: the
    /// stand-in tokenizer.
    pub tokenizer: Option<std::sync::Arc<crate::model_tokenizer::ModelTokenizer>>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 8000,
            served_model_names: vec!["sim-model".into()],
            server_name: None,
            engine: EngineConfig::default(),
            data_parallel_size: 1,
            startup_duration: Duration::ZERO,
            failures: FailureConfig::default(),
            metrics: MetricsOptions::default(),
            lora_modules: Vec::new(),
            max_request_body_bytes: 4 << 20,
            kv_events: None,
            tokenizer: None,
        }
    }
}

/// A running server; dropping it stops every rank.
pub struct Server {
    ranks: Vec<(SocketAddr, String)>,
    kv_events: Vec<crate::kv_events::PublisherAddrs>,
    tasks: Vec<JoinHandle<()>>,
}

impl Server {
    /// Listening addresses, one per rank.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.ranks.iter().map(|(a, _)| *a).collect()
    }

    /// `x-sim-server` names, one per rank.
    pub fn names(&self) -> Vec<String> {
        self.ranks.iter().map(|(_, n)| n.clone()).collect()
    }

    /// The KV-event publishers' endpoints, one per rank (empty without
    /// `--kv-events-config`).
    pub fn kv_event_addrs(&self) -> &[crate::kv_events::PublisherAddrs] {
        &self.kv_events
    }

    /// Stops every rank.
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Binds every rank and starts serving. Must be called inside a tokio runtime.
pub async fn start(config: ServerConfig) -> io::Result<Server> {
    let ranks = config.data_parallel_size.max(1);
    let mut server = Server {
        ranks: Vec::new(),
        kv_events: Vec::new(),
        tasks: Vec::new(),
    };
    for index in 0..ranks {
        let port = if config.port == 0 {
            0
        } else {
            config
                .port
                .checked_add(index as u16)
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "port out of range"))?
        };
        let listener = TcpListener::bind(SocketAddr::new(config.host, port)).await?;
        let addr = listener.local_addr()?;
        let name = match (&config.server_name, ranks) {
            (Some(n), 1) => n.clone(),
            (Some(n), _) => format!("{n}-{index}"),
            (None, _) => addr.to_string(),
        };
        let mut rank = Rank::new(&config, index, addr, name.clone())?;
        if let Some(kv) = &config.kv_events {
            let publisher =
                crate::kv_events::Publisher::start(kv, index, config.engine.block_size).await?;
            lock(&rank.core).engine.enable_kv_events();
            server.kv_events.push(publisher.addrs().clone());
            rank.kv_events = Some(publisher);
        }
        let rank = Arc::new(rank);
        server.tasks.push(tokio::spawn(engine_loop(rank.clone())));
        server.tasks.push(tokio::spawn(accept_loop(listener, rank)));
        server.ranks.push((addr, name));
    }
    Ok(server)
}

/// Where a request's events go.
pub(crate) struct Sink {
    tx: UnboundedSender<Routed>,
    choice: usize,
}

/// The engine and the senders of the requests in it.
pub(crate) struct Core {
    engine: Engine,
    sinks: HashMap<RequestId, Sink>,
}

/// Settings changed at run time through `/admin/config`.
pub(crate) struct Control {
    failures: FailureConfig,
    rng: Rng,
}

/// One data-parallel rank: a listener and an engine.
pub(crate) struct Rank {
    name: hyper::header::HeaderValue,
    port: hyper::header::HeaderValue,
    model: String,
    aliases: Vec<String>,
    max_model_len: usize,
    max_num_seqs: usize,
    core: Mutex<Core>,
    wake: Notify,
    clock: RealClock,
    ready_at: Instant,
    control: Mutex<Control>,
    metrics: MetricsOptions,
    max_body: usize,
    created: u64,
    next_request: AtomicU64,
    /// `/v1/conversations` of this rank.
    conversations: Mutex<Conversations>,
    /// Pieces seen by `/tokenize`, for `/detokenize`.
    vocabulary: Mutex<Vocabulary>,
    /// The KV-event publisher (`--kv-events-config`).
    kv_events: Option<crate::kv_events::Publisher>,
    tokenizer: Option<std::sync::Arc<crate::model_tokenizer::ModelTokenizer>>,
}

impl Rank {
    fn new(
        config: &ServerConfig,
        index: usize,
        addr: SocketAddr,
        name: String,
    ) -> io::Result<Self> {
        let model = config
            .served_model_names
            .first()
            .cloned()
            .unwrap_or_else(|| "sim-model".into());
        let mut engine_config = config.engine.clone();
        engine_config.model = model.clone();
        engine_config.seed = engine_config.seed.wrapping_add(index as u64);
        let mut engine = Engine::new(engine_config);
        for lora in &config.lora_modules {
            engine
                .load_lora(&lora.name, &lora.path)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        }
        let header = |s: &str| {
            hyper::header::HeaderValue::from_str(s)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "invalid server name"))
        };
        let clock = RealClock::new();
        Ok(Rank {
            name: header(&name)?,
            port: header(&addr.port().to_string())?,
            aliases: config.served_model_names.clone(),
            max_model_len: config.engine.max_model_len,
            max_num_seqs: config.engine.max_num_seqs,
            model,
            core: Mutex::new(Core {
                engine,
                sinks: HashMap::new(),
            }),
            wake: Notify::new(),
            ready_at: clock.epoch() + config.startup_duration,
            clock,
            control: Mutex::new(Control {
                failures: config.failures.clone(),
                rng: Rng::new(config.engine.seed ^ 0x5eed_fa11 ^ index as u64),
            }),
            metrics: config.metrics.clone(),
            max_body: config.max_request_body_bytes,
            created: unix_time().as_secs(),
            next_request: AtomicU64::new(1),
            conversations: Mutex::new(Conversations::new(
                conversation_salt(&name, unix_time()),
                CONVERSATIONS_KEPT,
            )),
            vocabulary: Mutex::new(Vocabulary::default()),
            kv_events: None,
            tokenizer: config.tokenizer.clone(),
        })
    }

    /// `POST /reset_prefix_cache`: drops the unused cached blocks and publishes
    /// `AllBlocksCleared` at once. Returns the blocks dropped.
    pub(crate) fn reset_prefix_cache(&self) -> usize {
        let (dropped, events) = {
            let mut core = lock(&self.core);
            let dropped = core.engine.reset_prefix_cache();
            (dropped, core.engine.take_kv_events())
        };
        if let Some(publisher) = &self.kv_events {
            publisher.publish(events);
        }
        dropped
    }

    fn is_ready(&self) -> bool {
        Instant::now() >= self.ready_at
    }
}

/// Conversations a rank keeps (the oldest are forgotten beyond).
const CONVERSATIONS_KEPT: usize = 100_000;

/// What makes a rank's conversation ids its own: its name and start time.
fn conversation_salt(name: &str, started: Duration) -> u64 {
    name.bytes().fold(started.as_nanos() as u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Locks a mutex, ignoring poisoning (a panicked holder left consistent data
/// as far as this simulator is concerned).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn unix_time() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

async fn accept_loop(listener: TcpListener, rank: Arc<Rank>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(_) => {
                // Out of file descriptors or similar: back off briefly.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let rank = rank.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| routes::handle(rank.clone(), req));
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Runs the engine in real time: step, wait until the step's end, deliver its
/// events, repeat; sleep while idle until a request arrives.
async fn engine_loop(rank: Arc<Rank>) {
    enum Next {
        Idle,
        WaitUntil(Duration),
        Ran(crate::engine::Step),
    }
    // Steps in a row that scheduled nothing although the engine asked for them.
    let mut empty_steps = 0u32;
    loop {
        let (now, next) = {
            let mut core = lock(&rank.core);
            // Read the clock under the lock, so no submission is later than `now`.
            let now = rank.clock.now();
            let next = match core.engine.next_step_at() {
                None => Next::Idle,
                Some(t) if t > now => Next::WaitUntil(t),
                Some(_) if empty_steps >= 2 => Next::WaitUntil(now + Duration::from_millis(1)),
                Some(_) => match core.engine.step(now) {
                    Some(step) => Next::Ran(step),
                    None => {
                        empty_steps += 1;
                        continue;
                    }
                },
            };
            (now, next)
        };
        empty_steps = 0;
        match next {
            Next::Idle => rank.wake.notified().await,
            Next::WaitUntil(t) => {
                let deadline = tokio::time::Instant::from_std(rank.clock.instant_at(t));
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => {}
                    _ = rank.wake.notified() => {}
                }
            }
            Next::Ran(step) => {
                if step.ends_at > now {
                    let deadline =
                        tokio::time::Instant::from_std(rank.clock.instant_at(step.ends_at));
                    tokio::time::sleep_until(deadline).await;
                }
                // The step's cache changes go out before its tokens, as vLLM publishes
                // them from the step that made them.
                if let Some(publisher) = &rank.kv_events {
                    publisher.publish(step.kv_events);
                }
                deliver(&rank, step.events);
                tokio::task::yield_now().await;
            }
        }
    }
}

/// Sends a step's events to their requests; aborts requests whose client left.
fn deliver(rank: &Rank, events: Vec<crate::engine::Event>) {
    let now = rank.clock.now();
    let mut core = lock(&rank.core);
    for event in events {
        let finished = matches!(event.kind, EventKind::Finished(_));
        let Some(sink) = core.sinks.get(&event.request) else {
            continue;
        };
        let sent = sink
            .tx
            .send(Routed {
                choice: sink.choice,
                kind: event.kind,
            })
            .is_ok();
        if finished || !sent {
            core.sinks.remove(&event.request);
        }
        if !sent && !finished {
            core.engine.abort(event.request, now);
        }
    }
}
