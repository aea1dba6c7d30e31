//! The relay's state: each server's cached blocks under the relay's own keys
//! ([`crate::keys`]), and a bounded log of changes, served as deltas or a snapshot.
//!
//! * `BlockStored` re-keys every block from its token ids, chained from the parent's
//!   key (looked up by vLLM's parent hash) or from the model's root; vLLM's hash → key
//!   is kept only to apply `BlockRemoved`. A stored block whose parent the relay never
//!   saw cannot be keyed and is counted (`unkeyed`).
//! * A key held under several vLLM hashes (data-parallel ranks, several media) is
//!   reference-counted: it is added on its first holder and removed with its last.
//! * Each server keeps at most `max_blocks` vLLM hashes; beyond, the oldest stored
//!   is forgotten (counted in `forgotten`).
//! * Every change gets the next `version`; the log keeps the last `log_capacity`.
//!   A client asking `since=v` of the same `epoch` gets the changes after `v` when the
//!   log still holds them, else a full snapshot.
//! * With a model's tokenizer ([`Relay::with_text`]) the keys are text keys instead:
//!   each block's token ids turn back into bytes, and a block owns the text blocks its
//!   bytes complete ([`keys::TextChain`]); removing it removes them.

use crate::keys::{self, TextChain};
use crate::model::Model;
use crate::wire::{Batch, Event};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet, VecDeque};

/// What the relay knows of one model server.
#[derive(Debug)]
pub struct Server {
    /// The server's address as the gateway knows the endpoint (`ip:port`).
    pub endpoint: String,
    /// The served model name (the key chain's root when an event names no LoRA).
    pub model: String,
    block_size: u32,
    blocks: HashMap<u64, Held>,
    refs: HashMap<u64, u32>,
    order: VecDeque<(u64, u64)>,
    stamp: u64,
    /// The last sequence number applied.
    pub last_seq: Option<u64>,
    /// The stream stopped (no event and no answer to the replay probe) or disconnected.
    pub stale: bool,
    pub stats: Stats,
}

/// Counters of one server's stream.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Stats {
    pub batches: u64,
    pub gaps: u64,
    pub replays: u64,
    pub resets: u64,
    pub unkeyed: u64,
    pub forgotten: u64,
    pub decode_errors: u64,
}

/// A block the server holds: the keys it owns, where the key chain stands after it.
#[derive(Debug, Clone)]
struct Held {
    owned: Box<[u64]>,
    next: TextChain,
    stamp: u64,
}

/// Text keys: the servers' model and the text block size.
#[derive(Debug, Clone)]
pub struct TextKeys {
    pub model: std::sync::Arc<Model>,
    /// Bytes per text block.
    pub block: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Change {
    Add(u64),
    Remove(u64),
    Clear,
}

/// Every server's state and the change log.
#[derive(Debug)]
pub struct Relay {
    epoch: u64,
    version: u64,
    pub servers: Vec<Server>,
    log: VecDeque<(u64, usize, Change)>,
    log_capacity: usize,
    max_blocks: usize,
    text: Option<TextKeys>,
}

impl Relay {
    /// `epoch` distinguishes this run (a restarted relay forces clients to a snapshot).
    pub fn new(epoch: u64, max_blocks: usize, log_capacity: usize) -> Self {
        Relay {
            epoch,
            version: 0,
            servers: Vec::new(),
            log: VecDeque::new(),
            log_capacity: log_capacity.max(1),
            max_blocks: max_blocks.max(1),
            text: None,
        }
    }

    /// Keys blocks by text blocks of `text.block` bytes of `text.model`'s token bytes.
    pub fn with_text(mut self, text: TextKeys) -> Self {
        self.text = Some(TextKeys {
            block: text.block.max(1),
            ..text
        });
        self
    }

    /// Adds a server (stale until its stream is heard); returns its index.
    pub fn add_server(&mut self, endpoint: &str, model: &str) -> usize {
        self.servers.push(Server {
            endpoint: endpoint.to_string(),
            model: model.to_string(),
            block_size: 0,
            blocks: HashMap::new(),
            refs: HashMap::new(),
            order: VecDeque::new(),
            stamp: 0,
            last_seq: None,
            stale: true,
            stats: Stats::default(),
        });
        self.servers.len() - 1
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    fn push(&mut self, server: usize, change: Change) {
        self.version += 1;
        if self.log.len() >= self.log_capacity {
            self.log.pop_front();
        }
        self.log.push_back((self.version, server, change));
    }

    /// Applies one batch of server `s` (its sequence number already checked).
    pub fn apply(&mut self, s: usize, seq: u64, batch: &Batch) {
        let Some(server) = self.servers.get_mut(s) else {
            return;
        };
        server.last_seq = Some(seq);
        server.stats.batches += 1;
        for event in &batch.events {
            match event {
                Event::Stored {
                    hashes,
                    parent,
                    tokens,
                    block_size,
                    lora_name,
                    ..
                } => self.store(
                    s,
                    hashes,
                    *parent,
                    tokens,
                    *block_size,
                    lora_name.as_deref(),
                ),
                Event::Removed { hashes, .. } => {
                    for h in hashes {
                        self.remove(s, *h);
                    }
                }
                Event::Cleared => self.clear(s),
            }
        }
    }

    fn store(
        &mut self,
        s: usize,
        hashes: &[u64],
        parent: Option<u64>,
        tokens: &[u32],
        block_size: u32,
        lora: Option<&str>,
    ) {
        let server = &mut self.servers[s];
        let text = &self.text;
        let bs = block_size as usize;
        let mut prev = match parent {
            None => TextChain::start(lora.unwrap_or(&server.model)),
            Some(p) => match server.blocks.get(&p) {
                Some(h) => h.next.clone(),
                None => {
                    server.stats.unkeyed += hashes.len() as u64;
                    return;
                }
            },
        };
        server.block_size = block_size;
        let mut added = Vec::new();
        let mut bytes = Vec::new();
        for (i, h) in hashes.iter().enumerate() {
            let Some(chunk) = tokens.get(i * bs..(i + 1) * bs) else {
                server.stats.unkeyed += (hashes.len() - i) as u64;
                break;
            };
            let (next, owned) = match text {
                None => {
                    let key = keys::block_key(prev.key, chunk);
                    let next = TextChain {
                        key,
                        carry: Box::default(),
                    };
                    (next, vec![key])
                }
                Some(t) => {
                    bytes.clear();
                    if !t.model.append(chunk, &mut bytes) {
                        server.stats.unkeyed += (hashes.len() - i) as u64;
                        break;
                    }
                    prev.extend(&bytes, t.block)
                }
            };
            prev = next.clone();
            if server.blocks.contains_key(h) {
                continue;
            }
            server.stamp += 1;
            let stamp = server.stamp;
            for key in &owned {
                let n = server.refs.entry(*key).or_insert(0);
                *n += 1;
                if *n == 1 {
                    added.push(*key);
                }
            }
            let owned = owned.into_boxed_slice();
            server.blocks.insert(*h, Held { owned, next, stamp });
            server.order.push_back((*h, stamp));
        }
        for key in added {
            self.push(s, Change::Add(key));
        }
        self.bound(s);
    }

    fn remove(&mut self, s: usize, hash: u64) {
        let server = &mut self.servers[s];
        let Some(held) = server.blocks.remove(&hash) else {
            return;
        };
        let mut gone = Vec::new();
        for key in held.owned.iter() {
            if let Some(n) = server.refs.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    server.refs.remove(key);
                    gone.push(*key);
                }
            }
        }
        for key in gone {
            self.push(s, Change::Remove(key));
        }
    }

    /// Forgets everything of server `s` (AllBlocksCleared, a publisher restart, or a
    /// reconnect after events were lost).
    pub fn clear(&mut self, s: usize) {
        let Some(server) = self.servers.get_mut(s) else {
            return;
        };
        server.blocks.clear();
        server.refs.clear();
        server.order.clear();
        self.push(s, Change::Clear);
    }

    fn bound(&mut self, s: usize) {
        let max = self.max_blocks;
        loop {
            let server = &mut self.servers[s];
            if server.blocks.len() <= max {
                // Drop stale order entries when they dominate.
                if server.order.len() > 2 * max {
                    let blocks = &server.blocks;
                    server
                        .order
                        .retain(|(h, st)| blocks.get(h).is_some_and(|b| b.stamp == *st));
                }
                return;
            }
            let Some((h, stamp)) = server.order.pop_front() else {
                return;
            };
            if server.blocks.get(&h).is_some_and(|b| b.stamp == stamp) {
                server.stats.forgotten += 1;
                self.remove(s, h);
            }
        }
    }

    /// Marks server `s` stale or live.
    pub fn set_stale(&mut self, s: usize, stale: bool) {
        if let Some(server) = self.servers.get_mut(s) {
            if server.stale != stale {
                server.stale = stale;
                // A version bump, so clients polling `since` see the flag change.
                self.version += 1;
            }
        }
    }

    /// Blocks server `s` holds (distinct keys).
    pub fn held(&self, s: usize) -> usize {
        self.servers.get(s).map_or(0, |x| x.refs.len())
    }

    /// Whether key `k` is held by server `s`.
    pub fn holds(&self, s: usize, key: u64) -> bool {
        self.servers
            .get(s)
            .is_some_and(|x| x.refs.contains_key(&key))
    }

    /// The state for a client that has `(epoch, since)`: deltas when possible, else a
    /// snapshot. See the README for the format.
    pub fn view(&self, client: Option<(u64, u64)>) -> Value {
        let oldest = self.log.front().map_or(self.version, |(v, _, _)| v - 1);
        let deltas = match client {
            Some((epoch, since))
                if epoch == self.epoch && since >= oldest && since <= self.version =>
            {
                Some(since)
            }
            _ => None,
        };
        let servers: Vec<Value> = match deltas {
            None => self
                .servers
                .iter()
                .map(|sv| {
                    let mut add: Vec<u64> = sv.refs.keys().copied().collect();
                    add.sort_unstable();
                    server_json(sv, true, &add, &[])
                })
                .collect(),
            Some(since) => {
                let mut per: Vec<(bool, HashSet<u64>, HashSet<u64>)> =
                    vec![(false, HashSet::new(), HashSet::new()); self.servers.len()];
                // Versions in the log increase: skip to the first after `since`.
                let first = self.log.partition_point(|(v, _, _)| *v <= since);
                for (_, s, change) in self.log.range(first..) {
                    let Some((clear, add, remove)) = per.get_mut(*s) else {
                        continue;
                    };
                    match change {
                        Change::Clear => {
                            *clear = true;
                            add.clear();
                            remove.clear();
                        }
                        Change::Add(k) => {
                            remove.remove(k);
                            add.insert(*k);
                        }
                        Change::Remove(k) => {
                            add.remove(k);
                            remove.insert(*k);
                        }
                    }
                }
                self.servers
                    .iter()
                    .zip(per)
                    .map(|(sv, (clear, add, remove))| {
                        let mut add: Vec<u64> = add.into_iter().collect();
                        let mut remove: Vec<u64> = remove.into_iter().collect();
                        add.sort_unstable();
                        remove.sort_unstable();
                        server_json(sv, clear, &add, &remove)
                    })
                    .collect()
            }
        };
        let mut out = json!({
            "epoch": self.epoch,
            "version": self.version,
            "full": deltas.is_none(),
            "servers": servers,
        });
        if let Some(t) = &self.text {
            out["text"] = text_json(t);
        }
        out
    }
}

/// `epoch` and `since` of a `GET /v1/kv/state` query string, when both are there and
/// numeric (the client for [`Relay::view`]); an error names a malformed one.
pub fn client_version(query: Option<&str>) -> Result<Option<(u64, u64)>, String> {
    let (mut epoch, mut since) = (None, None);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let n = || {
            v.parse::<u64>()
                .map_err(|_| format!("{k}: not an unsigned integer: {v:?}"))
        };
        match k {
            "epoch" => epoch = Some(n()?),
            "since" => since = Some(n()?),
            _ => {}
        }
    }
    Ok(epoch.zip(since))
}

/// How the filter computes text keys: the block size, what completions start with, the
/// chat template's shape (or why there is none).
fn text_json(t: &TextKeys) -> Value {
    let mut o = json!({
        "blockBytes": t.block,
        "completionPrefix": t.model.completion_prefix,
    });
    match &t.model.chat {
        Ok(shape) => o["chat"] = json!(shape),
        Err(why) => o["chatUnsupported"] = json!(why),
    }
    o
}

fn server_json(sv: &Server, clear: bool, add: &[u64], remove: &[u64]) -> Value {
    let mut o = json!({
        "endpoint": sv.endpoint,
        "blockSize": sv.block_size,
        "stale": sv.stale,
        "add": add,
        "remove": remove,
    });
    if clear {
        o["clear"] = Value::Bool(true);
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32]) -> Event {
        Event::Stored {
            hashes: hashes.to_vec(),
            parent,
            tokens: tokens.to_vec(),
            block_size: 2,
            lora_name: None,
            medium: Some("GPU".into()),
        }
    }

    fn batch(events: Vec<Event>) -> Batch {
        Batch {
            ts: 0.0,
            events,
            rank: Some(0),
        }
    }

    fn keys_of(tokens: &[u32]) -> Vec<u64> {
        let mut prev = keys::root("m");
        tokens
            .chunks(2)
            .map(|c| {
                prev = keys::block_key(prev, c);
                prev
            })
            .collect()
    }

    #[test]
    fn blocks_are_keyed_by_tokens_whatever_vllm_hashes() {
        let mut r = Relay::new(1, 100, 100);
        let s = r.add_server("10.0.0.1:8000", "m");
        // Two events: a first block, then its child named by vLLM's parent hash.
        r.apply(s, 0, &batch(vec![stored(&[900], None, &[1, 2])]));
        r.apply(
            s,
            1,
            &batch(vec![stored(&[901, 902], Some(900), &[3, 4, 5, 6])]),
        );
        let k = keys_of(&[1, 2, 3, 4, 5, 6]);
        assert!(k.iter().all(|k| r.holds(s, *k)));
        assert_eq!(r.held(s), 3);
        // Removal by vLLM's hash removes the right key.
        r.apply(
            s,
            2,
            &batch(vec![Event::Removed {
                hashes: vec![902],
                medium: None,
            }]),
        );
        assert!(!r.holds(s, k[2]));
        assert!(r.holds(s, k[1]));
        // A child of an unknown parent cannot be keyed.
        r.apply(s, 3, &batch(vec![stored(&[950], Some(777), &[7, 8])]));
        assert_eq!(r.servers[s].stats.unkeyed, 1);
        r.apply(s, 4, &batch(vec![Event::Cleared]));
        assert_eq!(r.held(s), 0);
    }

    #[test]
    fn a_key_held_twice_goes_with_its_last_holder() {
        let mut r = Relay::new(1, 100, 100);
        let s = r.add_server("a", "m");
        // Same tokens under two vLLM hashes (e.g. two DP ranks behind one endpoint).
        r.apply(
            s,
            0,
            &batch(vec![
                stored(&[1], None, &[1, 2]),
                stored(&[2], None, &[1, 2]),
            ]),
        );
        let k = keys_of(&[1, 2])[0];
        r.apply(
            s,
            1,
            &batch(vec![Event::Removed {
                hashes: vec![1],
                medium: None,
            }]),
        );
        assert!(r.holds(s, k));
        r.apply(
            s,
            2,
            &batch(vec![Event::Removed {
                hashes: vec![2],
                medium: None,
            }]),
        );
        assert!(!r.holds(s, k));
    }

    #[test]
    fn bounded_per_server_oldest_forgotten() {
        let mut r = Relay::new(1, 2, 100);
        let s = r.add_server("a", "m");
        for (i, t) in [[1, 1], [2, 2], [3, 3]].iter().enumerate() {
            r.apply(s, i as u64, &batch(vec![stored(&[i as u64], None, t)]));
        }
        assert_eq!(r.held(s), 2);
        assert_eq!(r.servers[s].stats.forgotten, 1);
        assert!(!r.holds(s, keys_of(&[1, 1])[0]));
    }

    #[test]
    fn deltas_since_a_version_and_snapshots_otherwise() {
        let mut r = Relay::new(7, 100, 3);
        let a = r.add_server("a:1", "m");
        let b = r.add_server("b:1", "m");
        r.apply(a, 0, &batch(vec![stored(&[1], None, &[1, 2])]));
        let v1 = r.version();
        let k = keys_of(&[1, 2, 3, 4]);
        r.apply(b, 0, &batch(vec![stored(&[5, 6], None, &[1, 2, 3, 4])]));
        r.apply(
            a,
            1,
            &batch(vec![Event::Removed {
                hashes: vec![1],
                medium: None,
            }]),
        );
        let d = r.view(Some((7, v1)));
        assert_eq!(d["full"], false);
        assert_eq!(d["servers"][0]["remove"], json!([k[0]]));
        assert_eq!(d["servers"][0]["add"], json!([]));
        let mut added = vec![k[0], k[1]];
        added.sort_unstable();
        assert_eq!(d["servers"][1]["add"], json!(added));
        assert_eq!(d["servers"][1]["blockSize"], 2);
        // Another epoch (a restarted relay), or a version the log no longer holds: snapshot.
        let full = r.view(Some((8, v1)));
        assert_eq!(full["full"], true);
        assert_eq!(full["servers"][0]["clear"], true);
        assert_eq!(full["servers"][0]["add"], json!([]));
        assert_eq!(full["servers"][1]["add"], json!(added));
        assert_eq!(
            r.view(Some((7, 0)))["full"],
            true,
            "log capacity 3 dropped version 1"
        );
        // Up to date: nothing to apply.
        let now = r.view(Some((7, r.version())));
        assert_eq!(now["full"], false);
        assert_eq!(now["servers"][1]["add"], json!([]));
        assert_eq!(now["servers"][0]["stale"], true, "not heard yet");
    }

    #[test]
    fn query_parsing() {
        assert_eq!(client_version(None).unwrap(), None);
        assert_eq!(
            client_version(Some("epoch=3&since=9")).unwrap(),
            Some((3, 9))
        );
        assert_eq!(client_version(Some("since=9")).unwrap(), None);
        assert!(client_version(Some("epoch=x&since=1")).is_err());
    }
}
