//! The ZMQ side of vLLM's `ZmqEventPublisher`:
//!
//! * a PUB socket sends each batch as `[topic, seq (8 B big-endian), payload]`, `seq`
//!   counting batches from 0;
//! * the last `buffer_steps` batches are kept; a ROUTER socket (`replay_endpoint`)
//!   answers a request `[identity, "", start_seq (8 B BE)]` with
//!   `[identity, "", seq, payload]` for every kept batch with `seq >= start_seq`, then
//!   `[identity, "", -1 (8 B BE), ""]`. A DEALER client sends `["", start_seq]` and
//!   receives `["", seq, payload]` frames.

use super::config::KvEventsConfig;
use super::wire;
use crate::engine::kv_cache::KvEvent;
use bytes::Bytes;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// Where a rank's publisher listens (with the port resolved when it was 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublisherAddrs {
    /// The PUB socket's bound endpoint, or the endpoint it connects to.
    pub events: String,
    /// The replay ROUTER socket's bound endpoint.
    pub replay: Option<String>,
}

/// A running publisher for one engine (one data-parallel rank). Dropping it stops it.
pub struct Publisher {
    tx: mpsc::Sender<Vec<KvEvent>>,
    addrs: PublisherAddrs,
    dropped: AtomicU64,
    tasks: Vec<JoinHandle<()>>,
}

type Buffer = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

fn zmq_err(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("kv events: {what}: {e}"))
}

/// vLLM's rule: bind when the endpoint is a wildcard or local transport, else connect.
fn binds(endpoint: &str) -> bool {
    endpoint.contains('*')
        || endpoint.contains("::")
        || endpoint.starts_with("ipc://")
        || endpoint.starts_with("inproc://")
}

/// `tcp://*:P` → `tcp://0.0.0.0:P` (the ZMQ crate wants an address).
fn bind_address(endpoint: &str) -> String {
    endpoint.replacen("://*:", "://0.0.0.0:", 1)
}

impl Publisher {
    /// Opens the sockets of data-parallel rank `rank` (ports offset by the rank) and
    /// starts sending. Must be called inside a tokio runtime.
    pub async fn start(
        config: &KvEventsConfig,
        rank: usize,
        block_size: usize,
    ) -> io::Result<Self> {
        let endpoint =
            KvEventsConfig::endpoint_for_rank(&config.endpoint, rank).map_err(io::Error::other)?;
        let mut publisher = PubSocket::new();
        // Connecting (to a central subscriber) happens in the send task: as with ZMQ, the
        // server starts whether or not the peer is there yet.
        let connect_to = !(binds(&endpoint) || endpoint.ends_with(":0"));
        let events_addr = if connect_to {
            endpoint.clone()
        } else {
            publisher
                .bind(&bind_address(&endpoint))
                .await
                .map_err(|e| zmq_err(&format!("bind {endpoint}"), e))?
                .to_string()
        };
        let buffer: Buffer = Arc::new(Mutex::new(VecDeque::new()));
        let mut tasks = Vec::new();
        let replay_addr = match &config.replay_endpoint {
            Some(replay) => {
                let replay =
                    KvEventsConfig::endpoint_for_rank(replay, rank).map_err(io::Error::other)?;
                let mut router = RouterSocket::new();
                let addr = router
                    .bind(&bind_address(&replay))
                    .await
                    .map_err(|e| zmq_err(&format!("bind {replay}"), e))?
                    .to_string();
                tasks.push(tokio::spawn(serve_replay(router, buffer.clone())));
                Some(addr)
            }
            None => None,
        };
        let (tx, rx) = mpsc::channel(config.max_queue_size);
        let topic = Bytes::from(config.topic.clone().into_bytes());
        tasks.push(tokio::spawn(send_batches(
            publisher,
            rx,
            buffer,
            Sender {
                topic,
                keep: config.buffer_steps,
                block_size,
                rank,
                connect_to: connect_to.then(|| endpoint.clone()),
            },
        )));
        Ok(Publisher {
            tx,
            addrs: PublisherAddrs {
                events: events_addr,
                replay: replay_addr,
            },
            dropped: AtomicU64::new(0),
            tasks,
        })
    }

    /// Queues one step's events as one batch (nothing for an empty step). A full queue
    /// drops the batch and counts it ([`dropped`](Self::dropped)), as vLLM's bounded
    /// queue does; sequence numbers are given on sending, so no gap shows it.
    pub fn publish(&self, events: Vec<KvEvent>) {
        if events.is_empty() {
            return;
        }
        if self.tx.try_send(events).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Batches dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    pub fn addrs(&self) -> &PublisherAddrs {
        &self.addrs
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

struct Sender {
    topic: Bytes,
    keep: usize,
    block_size: usize,
    rank: usize,
    /// Connect mode: the endpoint to connect to (retried until it answers).
    connect_to: Option<String>,
}

async fn send_batches(
    mut socket: PubSocket,
    mut rx: mpsc::Receiver<Vec<KvEvent>>,
    buffer: Buffer,
    s: Sender,
) {
    if let Some(endpoint) = &s.connect_to {
        while socket.connect(endpoint).await.is_err() {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    }
    let mut seq: u64 = 0;
    while let Some(events) = rx.recv().await {
        let ts = crate::server::unix_time().as_secs_f64();
        let payload = Bytes::from(wire::encode_batch(ts, &events, s.block_size, s.rank));
        let frames = vec![
            s.topic.clone(),
            Bytes::copy_from_slice(&wire::seq_frame(seq)),
            payload.clone(),
        ];
        if let Ok(message) = ZmqMessage::try_from(frames) {
            // A PUB socket drops for absent subscribers; an error here is a closed socket.
            let _ = socket.send(message).await;
        }
        {
            let mut kept = crate::server::lock(&buffer);
            if kept.len() >= s.keep {
                kept.pop_front();
            }
            kept.push_back((seq, payload));
        }
        seq += 1;
    }
}

async fn serve_replay(mut router: RouterSocket, buffer: Buffer) {
    loop {
        let Ok(request) = router.recv().await else {
            return;
        };
        let frames = request.into_vec();
        // [identity, "", start_seq]; anything else is ignored, as vLLM does.
        let [identity, empty, start] = frames.as_slice() else {
            continue;
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
            continue;
        };
        let start = u64::from_be_bytes(start);
        let batches: Vec<(u64, Bytes)> = crate::server::lock(&buffer)
            .iter()
            .filter(|(seq, _)| *seq >= start)
            .cloned()
            .collect();
        let reply = |seq: Bytes, payload: Bytes| {
            ZmqMessage::try_from(vec![identity.clone(), empty.clone(), seq, payload])
        };
        for (seq, payload) in batches {
            if let Ok(m) = reply(Bytes::copy_from_slice(&wire::seq_frame(seq)), payload) {
                if router.send(m).await.is_err() {
                    break;
                }
            }
        }
        if let Ok(m) = reply(Bytes::copy_from_slice(&wire::END_SEQ), Bytes::new()) {
            let _ = router.send(m).await;
        }
    }
}
