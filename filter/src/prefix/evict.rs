//! Corrections of the approximate index from what a server reported (see [`super::feedback`]):
//! where a block sits in an endpoint's LRU (its stamp), dropping everything an endpoint
//! evicted, and changing an endpoint's capacity (the LRU then drops its oldest entries).
//!
//! The index's LRU is ordered like the server's (least recently routed first), so when the
//! server no longer holds a block, it no longer holds anything routed to it before that
//! block either: [`PrefixIndex::evict_through`] drops all of those at once.

use super::index::{Popped, PrefixIndex};

impl PrefixIndex {
    /// The stamps (insertion positions in `endpoint`'s LRU) of `hashes`, in order, as long
    /// as the endpoint holds them (the result stops at the first it does not hold).
    pub fn stamps(&self, endpoint: &str, hashes: &[u64]) -> Vec<u64> {
        let Some(id) = self.lru_of(endpoint) else {
            return Vec::new();
        };
        hashes.iter().map_while(|h| self.stamp(id, *h)).collect()
    }

    /// Insertions into `endpoint`'s LRU so far (the stamp of the latest; 0 when unknown).
    pub fn clock(&self, endpoint: &str) -> u64 {
        self.lru_of(endpoint)
            .and_then(|id| self.lrus.get(id as usize))
            .map_or(0, |l| l.clock)
    }

    /// Entries of `endpoint` (0 when unknown).
    pub fn entries(&self, endpoint: &str) -> usize {
        self.lru_of(endpoint)
            .map_or(0, |id| self.lrus.get(id as usize).map_or(0, |l| l.len))
    }

    /// The LRU capacity of `endpoint`, when known.
    pub fn capacity(&self, endpoint: &str) -> Option<usize> {
        let id = self.lru_of(endpoint)?;
        self.lrus.get(id as usize).map(|l| l.capacity)
    }

    /// Drops every entry of `endpoint` inserted at or before `stamp` (the server evicted
    /// the block of that stamp, hence everything less recently used). Returns how many.
    pub fn evict_through(&mut self, endpoint: &str, stamp: u64) -> usize {
        let Some(id) = self.lru_of(endpoint) else {
            return 0;
        };
        let mut dropped = 0;
        while self.oldest_stamp(id).is_some_and(|s| s <= stamp) {
            if self.pop_oldest(id) == Popped::Live {
                dropped += 1;
            }
        }
        dropped
    }

    /// Sets the capacity of `endpoint` (at least 1) and drops its oldest entries beyond it.
    /// Unknown endpoints are left alone (their first insertion sets their capacity).
    pub fn set_capacity(&mut self, endpoint: &str, capacity: usize) {
        let Some(id) = self.lru_of(endpoint) else {
            return;
        };
        let capacity = capacity.max(1);
        if let Some(lru) = self.lrus.get_mut(id as usize) {
            lru.capacity = capacity;
        }
        while self.lrus.get(id as usize).is_some_and(|l| l.len > capacity) {
            if self.pop_oldest(id) == Popped::Empty {
                break;
            }
        }
    }

    fn lru_of(&self, endpoint: &str) -> Option<u32> {
        self.ids.get(&crate::endpoint::key(endpoint)).copied()
    }

    /// The stamp at the front of the order queue (possibly a stale duplicate).
    fn oldest_stamp(&self, id: u32) -> Option<u64> {
        self.lrus.get(id as usize)?.order.front().map(|(_, s)| *s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn evicting_a_block_drops_everything_older_on_that_endpoint_only() {
        let mut ix = PrefixIndex::new();
        ix.insert("a", &[1, 2], 100);
        ix.insert("a", &[3, 4], 100);
        ix.insert("a", &[5, 6], 100);
        ix.insert("b", &[1, 2, 3], 100);
        let s = ix.stamps("a", &[3, 4, 9, 5]);
        assert_eq!(s.len(), 2, "stops at the first block not held");
        assert_eq!(ix.evict_through("a", s[0]), 3, "1, 2 and 3");
        assert!(!ix.holds("a", 1) && !ix.holds("a", 3));
        assert!(ix.holds("a", 4) && ix.holds("a", 6));
        let m = ix.matches(&[1, 2, 3], ["a", "b"].into_iter(), 16);
        assert_eq!((m[0].matched, m[1].matched), (0, 3), "b still credited");
        assert_eq!(ix.entries("a"), 3);
        assert_eq!(ix.evict_through("nobody", 10), 0);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_smaller_capacity_drops_the_oldest_entries_and_stays() {
        let mut ix = PrefixIndex::new();
        ix.insert("a", &[1, 2, 3, 4, 5, 6], 100);
        ix.set_capacity("a", 2);
        assert_eq!(ix.capacity("a"), Some(2));
        assert!(!ix.holds("a", 4) && ix.holds("a", 5) && ix.holds("a", 6));
        // Later insertions keep the learned capacity, whatever capacity they carry.
        ix.insert("a", &[7], 100);
        assert_eq!(ix.entries("a"), 2);
        assert!(ix.holds("a", 7) && !ix.holds("a", 5));
        ix.set_capacity("a", 0);
        assert_eq!(ix.capacity("a"), Some(1));
        ix.set_capacity("unknown", 5);
        assert_eq!(ix.capacity("unknown"), None);
    }
}
