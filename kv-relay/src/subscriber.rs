//! One server's event stream: a SUB socket for live batches, a DEALER socket for
//! replays, and the liveness check.
//!
//! * Sequence numbers: the next expected is `last + 1`. A higher one is a gap: the
//!   missing batches are replayed (`[start_seq]` → `[seq, payload]…, [-1, ""]`), then
//!   the live batch is applied. A lower one means the publisher restarted: the
//!   server's state is wiped and replayed from 0. Joining (first batch, or the relay's
//!   own start) replays from 0 too, so a restarted relay recovers what the server's
//!   replay buffer still holds.
//! * Liveness: vLLM sends nothing while its cache does not change, so silence alone
//!   is not death. After `probe_every` of silence a replay from `last + 1` is asked
//!   (it also fetches anything missed); an answer counts as heard. Not heard for
//!   `stale_after` (or the socket disconnected, without a replay endpoint) → stale.
//!   Without a replay endpoint a reconnect wipes the server's state (what happened
//!   meanwhile is unknown).

use crate::state::Relay;
use crate::wire;
use bytes::Bytes;
use futures::StreamExt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use zeromq::{DealerSocket, Socket, SocketEvent, SocketRecv, SocketSend, SubSocket, ZmqMessage};

/// Where one server's events come from.
#[derive(Clone, Debug, PartialEq)]
pub struct Source {
    /// The server's HTTP address as the gateway names the endpoint (`ip:port`).
    pub endpoint: String,
    /// The served model name.
    pub model: String,
    /// The PUB socket to connect to, e.g. `tcp://10.0.0.5:5557`.
    pub events: String,
    /// vLLM's `replay_endpoint`, e.g. `tcp://10.0.0.5:5558`.
    pub replay: Option<String>,
    /// Topic prefix to subscribe to ("" = all).
    pub topic: String,
}

/// Timing of the liveness check.
#[derive(Clone, Copy, Debug)]
pub struct Liveness {
    pub probe_every: Duration,
    pub stale_after: Duration,
    pub replay_timeout: Duration,
}

pub(crate) fn lock(m: &Mutex<Relay>) -> MutexGuard<'_, Relay> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Stream {
    index: usize,
    source: Source,
    relay: Arc<Mutex<Relay>>,
    dealer: Option<DealerSocket>,
    heard: Instant,
}

/// Follows server `index`'s stream forever (until the task is aborted).
pub async fn run(index: usize, source: Source, relay: Arc<Mutex<Relay>>, live: Liveness) {
    let mut s = Stream {
        index,
        source,
        relay,
        dealer: None,
        heard: Instant::now(),
    };
    loop {
        let mut sub = SubSocket::new();
        let mut monitor = sub.monitor();
        if sub.connect(&s.source.events).await.is_err()
            || sub.subscribe(&s.source.topic).await.is_err()
        {
            lock(&s.relay).set_stale(index, true);
            tokio::time::sleep(live.probe_every).await;
            continue;
        }
        // Joining: whatever the server's replay buffer holds.
        if s.source.replay.is_some() {
            let from = lock(&s.relay).servers[index].last_seq.map_or(0, |l| l + 1);
            if s.replay(from, live.replay_timeout).await {
                lock(&s.relay).set_stale(index, false);
            }
        } else {
            lock(&s.relay).set_stale(index, false);
        }
        let mut tick = tokio::time::interval(live.probe_every);
        loop {
            tokio::select! {
                m = sub.recv() => {
                    let Ok(m) = m else { break };
                    s.heard = Instant::now();
                    lock(&s.relay).set_stale(index, false);
                    s.live(m.into_vec(), live.replay_timeout).await;
                }
                ev = monitor.next() => match ev {
                    Some(SocketEvent::Disconnected(_)) if s.source.replay.is_none() => {
                        lock(&s.relay).set_stale(index, true);
                    }
                    Some(SocketEvent::Connected(..)) if s.source.replay.is_none() => {
                        let mut r = lock(&s.relay);
                        if r.servers[index].stale {
                            r.clear(index);
                            r.servers[index].last_seq = None;
                            r.set_stale(index, false);
                        }
                    }
                    _ => {}
                },
                _ = tick.tick() => {
                    let silent = s.heard.elapsed();
                    if silent >= live.probe_every && s.source.replay.is_some() {
                        let from = lock(&s.relay).servers[index].last_seq.map_or(0, |l| l + 1);
                        if s.replay(from, live.replay_timeout).await {
                            lock(&s.relay).set_stale(index, false);
                        }
                    }
                    if s.heard.elapsed() >= live.stale_after && s.source.replay.is_some() {
                        lock(&s.relay).set_stale(index, true);
                    }
                }
            }
        }
    }
}

impl Stream {
    /// A live message `[topic, seq, payload]`.
    async fn live(&mut self, frames: Vec<Bytes>, timeout: Duration) {
        let [_topic, seq, payload] = frames.as_slice() else {
            lock(&self.relay).servers[self.index].stats.decode_errors += 1;
            return;
        };
        let Some(seq) = wire::seq(seq) else {
            lock(&self.relay).servers[self.index].stats.decode_errors += 1;
            return;
        };
        let last = lock(&self.relay).servers[self.index].last_seq;
        match last {
            Some(l) if seq == l + 1 => {}
            Some(l) if seq <= l => {
                if seq == l {
                    return; // a duplicate
                }
                // The publisher restarted (its numbering began again).
                {
                    let mut r = lock(&self.relay);
                    r.servers[self.index].stats.resets += 1;
                    r.clear(self.index);
                    r.servers[self.index].last_seq = None;
                }
                if self.source.replay.is_some() && self.replay(0, timeout).await {
                    return;
                }
            }
            Some(l) => {
                lock(&self.relay).servers[self.index].stats.gaps += 1;
                if self.source.replay.is_some() && self.replay(l + 1, timeout).await {
                    let now = lock(&self.relay).servers[self.index].last_seq;
                    if now.is_some_and(|n| n >= seq) {
                        return;
                    }
                }
            }
            None => {}
        }
        self.apply(seq, payload);
    }

    fn apply(&self, seq: u64, payload: &[u8]) {
        apply(&self.relay, self.index, seq, payload);
    }

    /// Asks for every buffered batch from `from` and applies the new ones. True when
    /// the end marker arrived in time (the server is alive).
    async fn replay(&mut self, from: u64, timeout: Duration) -> bool {
        let Some(endpoint) = self.source.replay.clone() else {
            return false;
        };
        let ok = tokio::time::timeout(timeout, self.replay_inner(&endpoint, from)).await;
        if !matches!(ok, Ok(true)) {
            // A half-read answer or a dead peer: start over with a new socket.
            self.dealer = None;
            return false;
        }
        lock(&self.relay).servers[self.index].stats.replays += 1;
        self.heard = Instant::now();
        true
    }

    async fn replay_inner(&mut self, endpoint: &str, from: u64) -> bool {
        let (relay, index) = (self.relay.clone(), self.index);
        if self.dealer.is_none() {
            let mut d = DealerSocket::new();
            if d.connect(endpoint).await.is_err() {
                return false;
            }
            self.dealer = Some(d);
        }
        let Some(dealer) = self.dealer.as_mut() else {
            return false;
        };
        let Ok(request) = ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&from.to_be_bytes()),
        ]) else {
            return false;
        };
        if dealer.send(request).await.is_err() {
            return false;
        }
        loop {
            let Ok(m) = dealer.recv().await else {
                return false;
            };
            let frames = m.into_vec();
            // ["", seq, payload]
            let [_, seq, payload] = frames.as_slice() else {
                continue;
            };
            let Some(seq) = wire::seq(seq) else {
                continue;
            };
            if seq == wire::END_SEQ {
                return true;
            }
            let last = lock(&relay).servers[index].last_seq;
            if last.is_none_or(|l| seq > l) {
                apply(&relay, index, seq, payload);
            }
        }
    }
}

/// Decodes and applies one batch; an undecodable one is counted and skipped.
fn apply(relay: &Mutex<Relay>, index: usize, seq: u64, payload: &[u8]) {
    let mut r = lock(relay);
    match wire::decode_batch(payload) {
        Ok(batch) => r.apply(index, seq, &batch),
        Err(_) => {
            if let Some(sv) = r.servers.get_mut(index) {
                sv.stats.decode_errors += 1;
                sv.last_seq = Some(seq);
            }
        }
    }
}
