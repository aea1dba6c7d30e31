//! This VM's copy of the approximate prefix index.
//!
//! `holders: hash → endpoints` answers a match in one lookup per block; each endpoint has
//! an LRU of its hashes with a fixed capacity (set when the endpoint is first seen: the
//! engine's `num_gpu_blocks` with autoTune, else `lruCapacityPerServer`), whose evictions
//! remove the endpoint from `holders`. Every worker holds the same content: picks made
//! anywhere reach every index through [`super::shared`].

use super::holders::Holders;
use hashbrown::hash_map::Entry;
use hashbrown::HashMap;
use std::collections::VecDeque;

/// How well a candidate's cache covers a request's prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixMatch {
    /// Leading blocks held by the endpoint.
    pub matched: u32,
    /// Blocks of the request.
    pub total: u32,
    /// Block size in tokens.
    pub block_size_tokens: u32,
}

impl PrefixMatch {
    /// `matched / total`, 0 without blocks.
    pub fn ratio(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            f64::from(self.matched) / f64::from(self.total)
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Lru {
    pub(super) capacity: usize,
    /// Insertions so far (the stamp of the next one).
    pub(super) clock: u64,
    /// Blocks held (each block's stamp is in its [`Holders`] entry).
    pub(super) len: usize,
    /// Insertion order (oldest first), with stale duplicates skipped lazily.
    pub(super) order: VecDeque<(u64, u64)>,
}

/// The per-VM prefix index.
#[derive(Debug, Default)]
pub struct PrefixIndex {
    /// Each endpoint's LRU (its position in `lrus`), by its key (`crate::endpoint::key`).
    pub(super) ids: HashMap<u64, u32>,
    pub(super) lrus: Vec<Lru>,
    /// Every block held anywhere: its holders and its stamp in each one's LRU.
    pub(super) blocks: HashMap<u64, Holders>,
    /// What the servers report holding (KV events through `kv-relay`), when
    /// `precise-prefix-cache-scorer` is configured; empty otherwise.
    pub precise: super::precise::PreciseState,
}

/// What popping the front of an LRU's order queue found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Popped {
    /// A live entry, now evicted.
    Live,
    /// A stale duplicate of an entry refreshed since (nothing evicted).
    Stale,
    /// Nothing (an empty queue or an unknown endpoint).
    Empty,
}

impl PrefixIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    fn id(&mut self, endpoint: &str, capacity: usize) -> u32 {
        let key = crate::endpoint::key(endpoint);
        if let Some(id) = self.ids.get(&key) {
            return *id;
        }
        let id = u32::try_from(self.lrus.len()).unwrap_or(u32::MAX);
        self.ids.insert(key, id);
        self.lrus.push(Lru {
            capacity: capacity.max(1),
            ..Lru::default()
        });
        id
    }

    /// Records that `endpoint` now holds `hashes` (its LRU has `capacity` entries if new).
    pub fn insert(&mut self, endpoint: &str, hashes: &[u64], capacity: usize) {
        let id = self.id(endpoint, capacity);
        for &h in hashes {
            let Some(lru) = self.lrus.get_mut(id as usize) else {
                return;
            };
            let holders = self.blocks.entry(h).or_default();
            // A block inserted within the last quarter of the capacity is not refreshed:
            // it is far from eviction, and skipping keeps re-sent prompts cheap. (Eviction
            // order can differ from exact LRU by at most capacity/4 positions.)
            let fresh_window = (lru.capacity / 4) as u64;
            if holders
                .stamp(id)
                .is_some_and(|s| lru.clock - s < fresh_window)
            {
                continue;
            }
            lru.clock += 1;
            if holders.set(id, lru.clock) {
                lru.len += 1;
            }
            lru.order.push_back((h, lru.clock));
            let full = lru.len > lru.capacity;
            let bloated = lru.order.len() > 2 * lru.capacity + 64;
            if full {
                while self.pop_oldest(id) == Popped::Stale {}
            }
            if bloated {
                // Drop stale duplicates so the order queue stays bounded.
                if let Some(lru) = self.lrus.get_mut(id as usize) {
                    let blocks = &self.blocks;
                    lru.order
                        .retain(|(h, s)| blocks.get(h).and_then(|b| b.stamp(id)) == Some(*s));
                }
            }
        }
    }

    /// Pops the front of `id`'s order queue: a live entry is removed from the LRU and from
    /// the block's holders.
    pub(super) fn pop_oldest(&mut self, id: u32) -> Popped {
        let Some(lru) = self.lrus.get_mut(id as usize) else {
            return Popped::Empty;
        };
        let Some((hash, stamp)) = lru.order.pop_front() else {
            return Popped::Empty;
        };
        let Entry::Occupied(mut block) = self.blocks.entry(hash) else {
            return Popped::Stale;
        };
        if !block.get_mut().remove_if(id, stamp) {
            return Popped::Stale;
        }
        if block.get().is_empty() {
            block.remove();
        }
        lru.len = lru.len.saturating_sub(1);
        Popped::Live
    }

    /// The stamp of `hash` in endpoint `id`'s LRU, when it holds it.
    pub(super) fn stamp(&self, id: u32, hash: u64) -> Option<u64> {
        self.blocks.get(&hash)?.stamp(id)
    }

    /// For each candidate address, how many leading blocks of `hashes` it holds: the walk
    /// stops at the first block nobody holds, and every holder of a block gets +1.
    pub fn matches<'a>(
        &self,
        hashes: &[u64],
        candidates: impl Iterator<Item = &'a str>,
        block_size_tokens: u32,
    ) -> Vec<PrefixMatch> {
        self.matches_by_key(
            hashes,
            candidates.map(crate::endpoint::key),
            block_size_tokens,
        )
    }

    /// [`PrefixIndex::matches`] for candidates given by their keys (`crate::endpoint::key`).
    pub fn matches_by_key(
        &self,
        hashes: &[u64],
        candidates: impl Iterator<Item = u64>,
        block_size_tokens: u32,
    ) -> Vec<PrefixMatch> {
        let total = u32::try_from(hashes.len()).unwrap_or(u32::MAX);
        let mut counts: Vec<u32> = Vec::new();
        for h in hashes {
            match self.blocks.get(h) {
                Some(holders) if !holders.is_empty() => {
                    if counts.is_empty() {
                        counts = vec![0; self.lrus.len()];
                    }
                    for id in holders.ids() {
                        if let Some(c) = counts.get_mut(id as usize) {
                            *c += 1;
                        }
                    }
                }
                _ => break,
            }
        }
        let unmatched = PrefixMatch {
            matched: 0,
            total,
            block_size_tokens,
        };
        if counts.is_empty() {
            // Not even the first block is held anywhere: no endpoint to look up.
            return candidates.map(|_| unmatched).collect();
        }
        candidates
            .map(|key| PrefixMatch {
                matched: self
                    .ids
                    .get(&key)
                    .and_then(|id| counts.get(*id as usize))
                    .copied()
                    .unwrap_or(0),
                ..unmatched
            })
            .collect()
    }

    /// Entries over every endpoint's LRU (`inference_extension_prefix_indexer_size`).
    pub fn size(&self) -> usize {
        self.lrus.iter().map(|l| l.len).sum()
    }

    /// Whether `endpoint` holds block `hash`.
    pub fn holds(&self, endpoint: &str, hash: u64) -> bool {
        self.ids
            .get(&crate::endpoint::key(endpoint))
            .is_some_and(|id| self.stamp(*id, hash).is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn matches_count_leading_blocks_per_endpoint() {
        let mut ix = PrefixIndex::new();
        ix.insert("a", &[1, 2, 3], 100);
        ix.insert("b", &[1], 100);
        let m = ix.matches(&[1, 2, 3, 4], ["a", "b", "c"].into_iter(), 16);
        assert_eq!(m.iter().map(|m| m.matched).collect::<Vec<_>>(), [3, 1, 0]);
        assert_eq!(m[0].total, 4);
        assert!((m[0].ratio() - 0.75).abs() < 1e-12);
        // The walk stops at the first block nobody holds.
        let m = ix.matches(&[9, 1, 2], ["a"].into_iter(), 16);
        assert_eq!(m[0].matched, 0);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn recent_blocks_are_not_refreshed_but_old_ones_are() {
        let mut ix = PrefixIndex::new();
        // Capacity 8: blocks inserted within the last 2 insertions are not refreshed.
        ix.insert("a", &[1, 2, 3, 4, 5, 6, 7, 8], 8);
        ix.insert("a", &[8], 8); // recent: no refresh
        ix.insert("a", &[1], 8); // oldest: refreshed, so 2 is now the oldest
        ix.insert("a", &[9], 8);
        assert!(ix.holds("a", 1) && !ix.holds("a", 2) && ix.holds("a", 8));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_lru_evicts_the_oldest_blocks_at_capacity() {
        let mut ix = PrefixIndex::new();
        ix.insert("a", &[1, 2, 3], 3);
        ix.insert("a", &[1], 3); // refresh 1: now 2 is the oldest
        ix.insert("a", &[4], 3);
        assert!(ix.holds("a", 1));
        assert!(!ix.holds("a", 2));
        assert!(ix.holds("a", 3) && ix.holds("a", 4));
        assert_eq!(ix.size(), 3);
        // An evicted block no longer matches for that endpoint.
        let m = ix.matches(&[2], ["a"].into_iter(), 16);
        assert_eq!(m[0].matched, 0);
        // Many refreshes keep the bookkeeping bounded.
        for _ in 0..10_000 {
            ix.insert("a", &[1, 3, 4], 3);
        }
        assert_eq!(ix.size(), 3);
        assert!(ix.lrus[0].order.len() <= 2 * 3 + 64 + 1);
    }
}
