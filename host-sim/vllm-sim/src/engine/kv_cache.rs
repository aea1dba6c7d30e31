//! The KV cache: `capacity` blocks of `block_size` tokens, with prefix caching.
//!
//! * Full prompt blocks are identified by a hash chained over the block's
//!   tokens and its parent's hash (seeded with the model or LoRA name), so a
//!   block only matches when its whole prefix matches.
//! * Blocks referenced by running requests are pinned. When no request
//!   references a cached block any more it stays resident but unused, and is
//!   evicted least-recently-used first when space is needed.
//! * Blocks that are not (yet) shareable — the last partial block of a prompt,
//!   blocks of output tokens, prompt blocks whose prefill has not finished —
//!   are "private": counted, pinned, never matched.
//! * Usage = pinned blocks / capacity (unused cached blocks do not count), as
//!   in vLLM and llm-d-inference-sim.
//! * With events on ([`KvCache::record_events`]), every block that becomes cached
//!   and every eviction is recorded as a [`KvEvent`], as vLLM's block pool does for
//!   its KV-event publisher; the engine hands them out per step.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};

#[derive(Clone, Copy, Debug)]
struct Block {
    refs: u32,
    /// Position in the LRU order while `refs == 0`.
    tick: u64,
}

/// A change of the set of cached blocks, in vLLM's terms (`BlockStored`,
/// `BlockRemoved`, `AllBlocksCleared`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// A full block became cached (shareable).
    Stored {
        hash: u64,
        /// The previous block of the same prefix; `None` for a first block.
        parent: Option<u64>,
        /// The block's `block_size` token ids.
        tokens: Vec<u32>,
        /// The LoRA adapter the block was computed with.
        lora: Option<String>,
    },
    /// A cached block was evicted.
    Removed { hash: u64 },
    /// Every cached block not in use was dropped (prefix-cache reset).
    Cleared,
}

#[derive(Debug)]
pub struct KvCache {
    block_size: usize,
    capacity: usize,
    cached: HashMap<u64, Block>,
    /// Unused cached blocks, oldest first.
    lru: BTreeMap<u64, u64>,
    pinned_cached: usize,
    private: usize,
    tick: u64,
    evictions: u64,
    /// Recorded events, when on; drained by [`KvCache::take_events`].
    events: Option<Vec<KvEvent>>,
}

impl KvCache {
    pub fn new(capacity: usize, block_size: usize) -> Self {
        KvCache {
            block_size: block_size.max(1),
            capacity,
            cached: HashMap::new(),
            lru: BTreeMap::new(),
            pinned_cached: 0,
            private: 0,
            tick: 0,
            evictions: 0,
            events: None,
        }
    }

    /// Starts recording [`KvEvent`]s.
    pub fn record_events(&mut self) {
        self.events.get_or_insert_with(Vec::new);
    }

    /// The events recorded since the last call (empty when not recording).
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn record(&mut self, event: KvEvent) {
        if let Some(events) = self.events.as_mut() {
            events.push(event);
        }
    }

    /// Drops every cached block no request uses (vLLM's `reset_prefix_cache`, which
    /// vLLM only allows when no block is in use; here pinned blocks stay). Returns the
    /// number of blocks dropped; records `Cleared` when events are on.
    pub fn reset_prefix_cache(&mut self) -> usize {
        let dropped = self.lru.len();
        for (_, hash) in std::mem::take(&mut self.lru) {
            self.cached.remove(&hash);
        }
        self.record(KvEvent::Cleared);
        dropped
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Blocks referenced by requests.
    pub fn pinned(&self) -> usize {
        self.pinned_cached + self.private
    }

    /// Cached blocks no request references (evictable).
    pub fn unused_cached(&self) -> usize {
        self.lru.len()
    }

    /// Blocks evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// KV-cache usage, 0..1.
    pub fn usage(&self) -> f64 {
        if self.capacity == 0 {
            return 0.0;
        }
        self.pinned() as f64 / self.capacity as f64
    }

    /// Blocks that could be given out now (free plus evictable).
    pub fn available(&self) -> usize {
        self.capacity.saturating_sub(self.pinned())
    }

    /// Hashes of the full blocks of `tokens`, chained from `seed`.
    pub fn block_hashes(&self, seed: u64, tokens: &[u32]) -> Vec<u64> {
        let mut parent = seed;
        tokens
            .chunks_exact(self.block_size)
            .map(|block| {
                let mut h = FNV64_OFFSET;
                for byte in parent.to_le_bytes() {
                    h = (h ^ u64::from(byte)).wrapping_mul(FNV64_PRIME);
                }
                for t in block {
                    for byte in t.to_le_bytes() {
                        h = (h ^ u64::from(byte)).wrapping_mul(FNV64_PRIME);
                    }
                }
                parent = h;
                h
            })
            .collect()
    }

    /// How many leading blocks of `hashes` are resident.
    pub fn lookup(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.cached.contains_key(h))
            .count()
    }

    /// How many of `hashes` are resident and pinned by some request.
    pub fn pinned_among(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .filter(|h| self.cached.get(h).is_some_and(|b| b.refs > 0))
            .count()
    }

    /// Pins resident blocks (cache hits). Every hash must be resident
    /// (check with [`lookup`](Self::lookup) first); others are ignored.
    pub fn pin(&mut self, hashes: &[u64]) {
        for h in hashes {
            if let Some(block) = self.cached.get_mut(h) {
                if block.refs == 0 {
                    self.lru.remove(&block.tick);
                    self.pinned_cached += 1;
                }
                block.refs += 1;
            }
        }
    }

    /// Unpins blocks; the last reference makes a block unused. Pass them in
    /// prompt order: the tail is made unused first, so it is evicted first.
    pub fn unpin(&mut self, hashes: &[u64]) {
        for h in hashes.iter().rev() {
            if let Some(block) = self.cached.get_mut(h) {
                block.refs = block.refs.saturating_sub(1);
                if block.refs == 0 {
                    self.tick += 1;
                    block.tick = self.tick;
                    self.lru.insert(self.tick, *h);
                    self.pinned_cached -= 1;
                }
            }
        }
    }

    /// Takes `n` private blocks, evicting unused cached blocks if needed.
    /// Returns false (and takes nothing) if they do not fit.
    pub fn allocate(&mut self, n: usize) -> bool {
        if n > self.available() {
            return false;
        }
        while self.pinned() + self.lru.len() + n > self.capacity {
            let Some((_, hash)) = self.lru.pop_first() else {
                return false;
            };
            self.cached.remove(&hash);
            self.evictions += 1;
            self.record(KvEvent::Removed { hash });
        }
        self.private += n;
        true
    }

    /// Gives back `n` private blocks.
    pub fn release(&mut self, n: usize) {
        self.private = self.private.saturating_sub(n);
    }

    /// Turns one private block, now fully computed, into the shareable cached
    /// block `hash` (pinned by its owner). If another request already cached
    /// the same block, the owner pins that one and the private block is freed.
    /// `stored` describes the block for a `Stored` event (parent hash, tokens,
    /// LoRA); it is only called when events are on and the block is new.
    pub fn promote(
        &mut self,
        hash: u64,
        stored: impl FnOnce() -> (Option<u64>, Vec<u32>, Option<String>),
    ) {
        self.release(1);
        match self.cached.entry(hash) {
            Entry::Occupied(_) => self.pin(&[hash]),
            Entry::Vacant(slot) => {
                slot.insert(Block { refs: 1, tick: 0 });
                self.pinned_cached += 1;
                if self.events.is_some() {
                    let (parent, tokens, lora) = stored();
                    self.record(KvEvent::Stored {
                        hash,
                        parent,
                        tokens,
                        lora,
                    });
                }
            }
        }
    }
}

const FNV64_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV64_PRIME: u64 = 0x0000_0100_0000_01b3;

/// A 64-bit seed for block hashes from a model or LoRA name.
pub fn name_seed(name: &str) -> u64 {
    name.bytes().fold(FNV64_OFFSET, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(FNV64_PRIME)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_cached_after_promotion_and_evicted_lru_when_unused() {
        let mut kv = KvCache::new(5, 2);
        let a = kv.block_hashes(1, &[1, 2, 3, 4]);
        let b = kv.block_hashes(1, &[9, 9, 8, 8]);
        assert_eq!(a.len(), 2);
        assert_eq!(kv.lookup(&a), 0);

        assert!(kv.allocate(2));
        for h in &a {
            kv.promote(*h, || (None, Vec::new(), None));
        }
        assert_eq!(kv.pinned(), 2);
        assert_eq!(kv.lookup(&a), 2);
        kv.unpin(&a);
        assert_eq!(kv.pinned(), 0);
        assert_eq!(kv.unused_cached(), 2);
        assert_eq!(kv.usage(), 0.0);

        // Filling the cache with other blocks evicts `a`'s tail block first.
        assert!(kv.allocate(2));
        for h in &b {
            kv.promote(*h, || (None, Vec::new(), None));
        }
        assert!(kv.allocate(1));
        assert_eq!(kv.evictions(), 0);
        assert!(kv.allocate(1));
        assert_eq!(kv.evictions(), 1);
        assert_eq!(kv.lookup(&a), 1, "the head block survives longer");
        assert!(kv.allocate(1));
        assert_eq!(kv.evictions(), 2);
        assert_eq!(kv.usage(), 1.0);
        assert!(!kv.allocate(1), "everything is pinned");
    }

    #[test]
    fn hashes_chain_over_prefixes() {
        let kv = KvCache::new(10, 2);
        let x = kv.block_hashes(7, &[1, 2, 3, 4, 5]);
        let y = kv.block_hashes(7, &[1, 2, 3, 5]);
        let z = kv.block_hashes(8, &[1, 2, 3, 4]);
        assert_eq!(x.len(), 2);
        assert_eq!(x[0], y[0]);
        assert_ne!(x[1], y[1]);
        assert_ne!(x[0], z[0], "the seed (model) is part of the key");
    }

    #[test]
    fn duplicate_promotion_shares_the_block() {
        let mut kv = KvCache::new(4, 2);
        let a = kv.block_hashes(1, &[1, 2]);
        assert!(kv.allocate(1));
        assert!(kv.allocate(1));
        kv.promote(a[0], || (None, Vec::new(), None));
        kv.promote(a[0], || (None, Vec::new(), None));
        assert_eq!(kv.pinned(), 1);
        kv.unpin(&a);
        assert_eq!(kv.pinned(), 1);
        kv.unpin(&a);
        assert_eq!(kv.pinned(), 0);
        assert_eq!(kv.unused_cached(), 1);
    }

    #[test]
    fn events_report_stores_evictions_and_resets() {
        let mut kv = KvCache::new(2, 2);
        kv.record_events();
        let a = kv.block_hashes(1, &[1, 2, 3, 4]);
        assert!(kv.allocate(2));
        kv.promote(a[0], || (None, vec![1, 2], None));
        kv.promote(a[1], || (Some(a[0]), vec![3, 4], Some("lora".into())));
        assert_eq!(
            kv.take_events(),
            vec![
                KvEvent::Stored {
                    hash: a[0],
                    parent: None,
                    tokens: vec![1, 2],
                    lora: None
                },
                KvEvent::Stored {
                    hash: a[1],
                    parent: Some(a[0]),
                    tokens: vec![3, 4],
                    lora: Some("lora".into())
                },
            ]
        );
        assert!(kv.take_events().is_empty(), "drained");
        // A second request caching the same block is no new event.
        assert!(kv.allocate(0));
        kv.unpin(&a);
        // Needing one block evicts the tail block (unused longest).
        assert!(kv.allocate(1));
        assert_eq!(kv.take_events(), vec![KvEvent::Removed { hash: a[1] }]);
        kv.release(1);
        assert_eq!(kv.reset_prefix_cache(), 1);
        assert_eq!(kv.take_events(), vec![KvEvent::Cleared]);
        assert_eq!(kv.lookup(&a), 0);
    }

    #[test]
    fn no_events_unless_recording() {
        let mut kv = KvCache::new(1, 1);
        assert!(kv.allocate(1));
        kv.promote(7, || unreachable!("not recording"));
        assert!(kv.take_events().is_empty());
    }
}
