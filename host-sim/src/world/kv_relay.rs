//! `kv-relay` in virtual time: the servers' KV-cache events
//! ([`Upstream::take_kv_events`](super::upstream::Upstream::take_kv_events), each engine
//! step's `BlockStored` / `BlockRemoved` / `AllBlocksCleared`) applied to the relay's own
//! state ([`kv_relay::state::Relay`], the code the `kv-relay` binary runs) and served to the
//! filter's `GET /v1/kv/state[?epoch&since]` callouts on the relay's cluster.
//!
//! * Each batch goes through vLLM's wire format: encoded as `vllm-sim` publishes it
//!   (`vllm_sim::kv_events::wire`), decoded as the relay decodes it (`kv_relay::wire`).
//! * A batch is applied [`KvRelayConfig::lag`] after the step that produced it ended (the
//!   ZMQ hop and the relay's own work). Sequence numbers have no gaps here: the relay's
//!   replay and reconnect paths are not exercised (`kv-relay`'s own tests cover them).
//! * A server is registered (and live) from its first published batch, as the relay's
//!   joining replay would make it; an endpoint that goes away
//!   ([`Control::RemoveEndpoint`](crate::Control::RemoveEndpoint)) is marked stale at once
//!   (the real relay waits for its `--stale-after`).
//! * The state is applied lazily, when a callout asks: the answer is what the relay would
//!   hold at that virtual time.

use super::clock::{Nanos, EPOCH_NANOS, MS, SEC};
use super::upstream::KvPublished;
use kv_relay::state::{client_version, Relay, TextKeys};
use kv_relay::wire::{decode_batch, Batch};
use std::collections::{BTreeMap, HashMap};

/// Settings of the world's relay.
#[derive(Debug, Clone)]
pub struct KvRelayConfig {
    /// The Envoy cluster the filter calls (`relayCluster`).
    pub cluster: String,
    /// From the end of an engine step to its events being in the relay's state.
    pub lag: Nanos,
    /// `--max-blocks-per-server`.
    pub max_blocks: usize,
    /// `--log-capacity`.
    pub log_capacity: usize,
    /// `--tokenizer`: text keys from this model's token bytes; `None`: token-id keys.
    pub text: Option<TextKeys>,
}

impl KvRelayConfig {
    /// The relay behind `cluster`, with a 5 ms lag and the binary's default bounds.
    pub fn new(cluster: &str) -> KvRelayConfig {
        KvRelayConfig {
            cluster: cluster.to_string(),
            lag: 5 * MS,
            max_blocks: 1_000_000,
            log_capacity: 1_000_000,
            text: None,
        }
    }

    /// Publishing text keys (`kv-relay --tokenizer`).
    pub fn text(mut self, text: TextKeys) -> Self {
        self.text = Some(text);
        self
    }

    /// With this event lag.
    pub fn lag(mut self, lag: Nanos) -> Self {
        self.lag = lag;
        self
    }
}

/// The relay's state in the world.
pub struct WorldRelay {
    cfg: KvRelayConfig,
    relay: Relay,
    /// Relay server index by endpoint address.
    servers: HashMap<String, usize>,
    /// Batches published and not applied yet, by (due time, order): server, its seq, batch.
    pending: BTreeMap<(Nanos, u64), (usize, u64, Batch)>,
    /// The next sequence number per server.
    seq: Vec<u64>,
    order: u64,
    /// Batches applied, and those that did not decode (a wire mismatch: a bug).
    pub applied: u64,
    pub decode_errors: u64,
}

impl WorldRelay {
    pub fn new(cfg: KvRelayConfig) -> WorldRelay {
        WorldRelay {
            relay: match &cfg.text {
                Some(t) => Relay::new(1, cfg.max_blocks, cfg.log_capacity).with_text(t.clone()),
                None => Relay::new(1, cfg.max_blocks, cfg.log_capacity),
            },
            cfg,
            servers: HashMap::new(),
            pending: BTreeMap::new(),
            seq: Vec::new(),
            order: 0,
            applied: 0,
            decode_errors: 0,
        }
    }

    /// The cluster it answers on.
    pub fn cluster(&self) -> &str {
        &self.cfg.cluster
    }

    /// Registers the server at `addr` serving `model` (live, holding nothing) unless
    /// known; returns its index. A server is otherwise registered by its first batch.
    pub fn register(&mut self, addr: &str, model: &str) -> usize {
        match self.servers.get(addr) {
            Some(&s) => s,
            None => {
                let s = self.relay.add_server(addr, model);
                self.relay.set_stale(s, false);
                self.servers.insert(addr.to_string(), s);
                self.seq.push(0);
                s
            }
        }
    }

    /// Takes what the server at `addr` published (its batches are applied after the lag).
    pub fn collect(&mut self, addr: &str, published: KvPublished) {
        let s = self.register(addr, &published.model);
        for (at, events) in published.batches {
            let ts = (EPOCH_NANOS + at) as f64 / SEC as f64;
            let payload =
                vllm_sim::kv_events::wire::encode_batch(ts, &events, published.block_size, 0);
            let Ok(batch) = decode_batch(&payload) else {
                self.decode_errors += 1;
                continue;
            };
            let seq = self.seq[s];
            self.seq[s] += 1;
            self.order += 1;
            self.pending
                .insert((at + self.cfg.lag, self.order), (s, seq, batch));
        }
    }

    /// The server at `addr` was replaced by a fresh one (its publisher's sequence numbers
    /// start over): the relay wipes what it held, as on a sequence reset.
    pub fn restarted(&mut self, addr: &str) {
        if let Some(&s) = self.servers.get(addr) {
            // Batches of the old server still in flight are dropped with it.
            self.pending.retain(|_, (p, _, _)| *p != s);
            self.relay.clear(s);
            self.seq[s] = 0;
        }
    }

    /// Marks the server at `addr` stale (its endpoint went away) or live.
    pub fn set_up(&mut self, addr: &str, up: bool) {
        if let Some(&s) = self.servers.get(addr) {
            self.relay.set_stale(s, !up);
        }
    }

    /// Applies every batch due at or before `now`.
    fn apply_due(&mut self, now: Nanos) {
        while let Some(entry) = self.pending.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let (s, seq, batch) = entry.remove();
            self.relay.apply(s, seq, &batch);
            self.applied += 1;
        }
    }

    /// The answer to `GET <path>` at `now`: status and JSON body.
    pub fn answer(&mut self, now: Nanos, path: &str) -> (u16, String) {
        self.apply_due(now);
        let (route, query) = path.split_once('?').unwrap_or((path, ""));
        if route != "/v1/kv/state" {
            return (404, "not found\n".into());
        }
        match client_version(Some(query)) {
            Ok(client) => (200, self.relay.view(client).to_string()),
            Err(e) => (
                400,
                serde_json::json!({"error": {"message": e, "type": "invalid_request_error"}})
                    .to_string(),
            ),
        }
    }

    /// The relay's state now (after applying what is due).
    pub fn state(&mut self, now: Nanos) -> &Relay {
        self.apply_due(now);
        &self.relay
    }
}
