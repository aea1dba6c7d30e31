//! `kv-relay`: follows vLLM's KV-cache events and serves each server's cached blocks
//! to the gateway filter (which cannot open a ZMQ socket) over plain HTTP.
//!
//! * [`wire`] — decoding vLLM's msgpack event batches and frames;
//! * [`keys`] — the relay's own block keys from token ids, or text keys from their bytes
//!   (the filter computes the same);
//! * [`model`] — a model's tokenizer (token bytes) and [`chat`] — its chat template's
//!   shape, for text keys;
//! * [`state`] — per-server blocks, the change log, deltas and snapshots;
//! * [`subscriber`] — one server's stream: sequence gaps, replay, liveness;
//! * [`http`] — `GET /v1/kv/state`, `/metrics`, `/health`;
//! * [`cli`] — flags.

pub mod chat;
pub mod cli;
pub mod http;
pub mod keys;
pub mod model;
pub mod state;
pub mod subscriber;
pub mod wire;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::task::JoinHandle;

/// A running relay; dropping it stops it.
pub struct Running {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<state::Relay>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts the relay (inside a tokio runtime): one task per source, and the HTTP server.
pub async fn start(config: cli::Config) -> std::io::Result<Running> {
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    let epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let mut relay = state::Relay::new(epoch, config.max_blocks, config.log_capacity);
    if let Some(dir) = &config.tokenizer {
        let model = model::Model::load(dir, config.chat_template.as_deref()).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("--tokenizer: {e}"),
            )
        })?;
        relay = relay.with_text(state::TextKeys {
            model: Arc::new(model),
            block: config.text_block_bytes,
        });
    }
    let state = Arc::new(Mutex::new(relay));
    let mut tasks = Vec::new();
    for source in config.sources {
        let index = subscriber::lock(&state).add_server(&source.endpoint, &source.model);
        tasks.push(tokio::spawn(subscriber::run(
            index,
            source,
            state.clone(),
            config.liveness,
        )));
    }
    tasks.push(tokio::spawn(http::serve(listener, state.clone())));
    Ok(Running { addr, state, tasks })
}
