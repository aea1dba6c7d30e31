//! Speculative entries of `precise-prefix-cache-scorer` (`speculativeIndexing`): the blocks
//! this gateway has just routed to a server, credited to it before the server reports them.
//!
//! The relay learns a block once the server's prefill stored it, its event was published
//! and the filter's next poll came back; in between, a request routed there is invisible,
//! and the next request with the same prefix is scored as if nobody held it. So each pick
//! records the prompt's block keys that the relay does not report on the chosen server
//! (every worker learns them through the prefix log, `super::shared`), until `until_ms`
//! (pick + `speculativeTTL`), or until the relay's state mentions the block on that
//! server: an `add` confirms it (the relay's copy answers from then on), a `remove` reports
//! an eviction, a server cleared (a restart) drops them all.
//!
//! Bounded: at most [`MAX_ENTRIES`] per VM (more are not recorded, counted in
//! `overflow`); expired entries are dropped at each relay answer.

use hashbrown::HashMap;
use std::collections::VecDeque;

/// Speculative entries kept per VM, over all servers (about 40 bytes each).
pub const MAX_ENTRIES: usize = 65_536;

/// One server's speculative blocks.
#[derive(Debug, Default)]
struct Pending {
    /// key → until when it is credited (ms).
    until: HashMap<u64, i64>,
    /// Recording order (so expiry is oldest first), with superseded records skipped lazily.
    order: VecDeque<(u64, i64)>,
}

impl Pending {
    /// Drops the records that ended before `now_ms`; returns how many entries went.
    fn expire(&mut self, now_ms: i64) -> usize {
        let before = self.until.len();
        while let Some(&(key, until)) = self.order.front() {
            if until >= now_ms {
                break;
            }
            self.order.pop_front();
            if self.until.get(&key) == Some(&until) {
                self.until.remove(&key);
            }
        }
        before - self.until.len()
    }
}

/// Per server address, the blocks credited speculatively.
#[derive(Debug, Default)]
pub struct Speculative {
    servers: HashMap<String, Pending>,
    entries: usize,
    /// Keys not recorded because [`MAX_ENTRIES`] were held.
    pub overflow: u64,
}

impl Speculative {
    /// Credits `endpoint` with `keys` until `until_ms` (a key already credited gets the
    /// later end).
    pub fn add(&mut self, endpoint: &str, keys: &[u64], until_ms: i64) {
        if keys.is_empty() {
            return;
        }
        let p = self.servers.entry_ref(endpoint).or_default();
        for &k in keys {
            match p.until.get_mut(&k) {
                Some(u) if *u >= until_ms => continue,
                Some(u) => *u = until_ms,
                None if self.entries >= MAX_ENTRIES => {
                    self.overflow += 1;
                    continue;
                }
                None => {
                    p.until.insert(k, until_ms);
                    self.entries += 1;
                }
            }
            p.order.push_back((k, until_ms));
        }
        // Superseded records are dropped when they outnumber the live ones.
        if p.order.len() > 2 * p.until.len() + 64 {
            let until = &p.until;
            p.order.retain(|(k, u)| until.get(k) == Some(u));
        }
    }

    /// Whether `endpoint` is credited with `key` at `now_ms`.
    pub fn holds(&self, endpoint: &str, key: u64, now_ms: i64) -> bool {
        self.servers
            .get(endpoint)
            .and_then(|p| p.until.get(&key))
            .is_some_and(|u| *u >= now_ms)
    }

    /// The relay mentioned `key` on `endpoint` (stored: confirmed; removed: evicted): the
    /// speculative entry ends.
    pub fn forget(&mut self, endpoint: &str, key: u64) {
        if let Some(p) = self.servers.get_mut(endpoint) {
            if p.until.remove(&key).is_some() {
                self.entries -= 1;
            }
        }
    }

    /// The relay cleared `endpoint` (the server restarted): nothing of it is credited.
    pub fn forget_server(&mut self, endpoint: &str) {
        if let Some(p) = self.servers.remove(endpoint) {
            self.entries -= p.until.len();
        }
    }

    /// Drops what ended before `now_ms`, and servers left without entries.
    pub fn expire(&mut self, now_ms: i64) {
        let mut gone = 0;
        self.servers.retain(|_, p| {
            gone += p.expire(now_ms);
            !p.until.is_empty()
        });
        self.entries -= gone;
    }

    /// Entries held (expired ones included until the next [`Self::expire`]).
    pub fn len(&self) -> usize {
        self.entries
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn credited_until_the_end_unless_the_relay_mentions_the_block() {
        let mut s = Speculative::default();
        s.add("a", &[1, 2, 3], 1_000);
        assert!(s.holds("a", 1, 1_000) && !s.holds("a", 1, 1_001));
        assert!(!s.holds("b", 1, 0), "only the server it was routed to");
        s.forget("a", 2); // confirmed or evicted
        assert!(!s.holds("a", 2, 0) && s.holds("a", 3, 0));
        // A later pick extends an entry; an earlier one does not shorten it.
        s.add("a", &[3], 2_000);
        s.add("a", &[3], 1_500);
        s.expire(1_001);
        assert!(!s.holds("a", 1, 1_001) && s.holds("a", 3, 2_000));
        assert_eq!(s.len(), 1);
        s.forget_server("a");
        assert!(s.is_empty() && !s.holds("a", 3, 0));
        s.expire(5_000);
        assert!(s.servers.is_empty());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn bounded_in_entries_and_records() {
        let mut s = Speculative::default();
        let keys: Vec<u64> = (0..MAX_ENTRIES as u64 + 10).collect();
        s.add("a", &keys, 10);
        assert_eq!((s.len(), s.overflow), (MAX_ENTRIES, 10));
        s.expire(11);
        assert!(s.is_empty());
        // Re-crediting one key many times keeps its records bounded.
        for t in 0..10_000 {
            s.add("b", &[7], 100 + t);
        }
        assert!(s.servers["b"].order.len() <= 2 + 64 + 1);
        assert_eq!(s.len(), 1);
    }
}
