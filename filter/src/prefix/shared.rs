//! How every worker's prefix index learns every pick: a ring log in shared data.
//!
//! * `epp.v1.prefix.head` holds the next sequence number (one small CAS record).
//! * `epp.v1.prefix.log.<seq % RING>` holds the entry with that sequence: which VM
//!   picked, which endpoint, the request's block hashes and the LRU capacity to use (with
//!   `precise-prefix-cache-scorer`, also its speculative entries: `super::speculative`); or,
//!   marked `resize`, an endpoint's capacity learned from cached-token feedback
//!   (`super::feedback`: every VM's LRU for it takes that capacity).
//!
//! A pick publishes by claiming a sequence number (CAS on the head) and writing its slot.
//! Before each pick a VM reads the head (one small read) and applies the entries it has
//! not seen yet to its own [`PrefixIndex`], so a request routed by one worker informs the
//! next pick on any worker at once. Each entry is read once per VM; a VM that fell more
//! than `RING` entries behind skips what was overwritten (the index is approximate).
//! An entry claimed but not yet written (its writer is between the two calls) is waited
//! for on the next pick, and skipped once [`SKIP_UNWRITTEN_AFTER`] later entries exist.

use super::index::PrefixIndex;
use crate::shared_store::{read, update, SharedStore, StoreError};
use prost::Message;

/// Shared-data key of the head record.
pub const HEAD_KEY: &str = "epp.v1.prefix.head";
/// Slots in the ring.
pub const RING: u64 = 4096;
/// Most entries applied in one sync (bounds the work of one callback).
pub const MAX_APPLY_PER_SYNC: u64 = 512;
/// A claimed slot still unwritten after this many later claims is skipped.
pub const SKIP_UNWRITTEN_AFTER: u64 = 64;

/// The head of the log.
#[derive(Clone, PartialEq, Message)]
pub struct Head {
    /// The next sequence number to claim.
    #[prost(uint64, tag = "1")]
    pub next: u64,
}

/// One pick, as logged.
#[derive(Clone, PartialEq, Message)]
pub struct Entry {
    /// Its sequence number (a slot holding another one is stale or unwritten).
    #[prost(uint64, tag = "1")]
    pub seq: u64,
    /// The VM that picked (it applied the entry itself already).
    #[prost(uint64, tag = "2")]
    pub vm: u64,
    /// `ip:port` that now holds the blocks.
    #[prost(string, tag = "3")]
    pub endpoint: String,
    /// The request's block hashes, in order.
    #[prost(fixed64, repeated, tag = "4")]
    pub hashes: Vec<u64>,
    /// LRU capacity for the endpoint if the index does not know it yet.
    #[prost(uint64, tag = "5")]
    pub capacity: u64,
    /// No hashes: the endpoint's capacity is now `capacity`.
    #[prost(bool, tag = "6")]
    pub resize: bool,
    /// `precise-prefix-cache-scorer`'s speculative entries: the block keys (the relay's)
    /// the endpoint is credited with until `speculative_until_ms` ([`super::speculative`]).
    #[prost(fixed64, repeated, tag = "7")]
    pub speculative: Vec<u64>,
    /// Until when (ms) `speculative` is credited.
    #[prost(int64, tag = "8")]
    pub speculative_until_ms: i64,
}

/// A pick's blocks: the approximate index's hashes, and the speculative entries of
/// `precise-prefix-cache-scorer` (the relay's keys, and until when they are credited).
#[derive(Debug, Clone, Copy, Default)]
pub struct Picked<'a> {
    /// The approximate index's block hashes.
    pub hashes: &'a [u64],
    /// The relay's keys credited speculatively.
    pub speculative: &'a [u64],
    /// Until when (ms) they are.
    pub speculative_until_ms: i64,
}

/// The key of a sequence number's slot.
pub fn slot_key(seq: u64) -> String {
    format!("epp.v1.prefix.log.{}", seq % RING)
}

/// Logs that `endpoint` now holds `picked`; returns the sequence number used.
pub fn publish(
    store: &impl SharedStore,
    vm: u64,
    endpoint: &str,
    picked: Picked<'_>,
    capacity: u64,
) -> Result<u64, StoreError> {
    let entry = Entry {
        hashes: picked.hashes.to_vec(),
        speculative: picked.speculative.to_vec(),
        speculative_until_ms: picked.speculative_until_ms,
        capacity,
        ..Entry::default()
    };
    append(store, vm, endpoint, entry)
}

/// Logs that `endpoint`'s capacity is now `capacity`; returns the sequence number used.
pub fn publish_capacity(
    store: &impl SharedStore,
    vm: u64,
    endpoint: &str,
    capacity: u64,
) -> Result<u64, StoreError> {
    let entry = Entry {
        capacity,
        resize: true,
        ..Entry::default()
    };
    append(store, vm, endpoint, entry)
}

/// Takes the next sequence number and writes `entry` (for `vm` and `endpoint`) into its
/// slot.
fn append(
    store: &impl SharedStore,
    vm: u64,
    endpoint: &str,
    entry: Entry,
) -> Result<u64, StoreError> {
    let seq = update(store, HEAD_KEY, |h: &mut Head| {
        let seq = h.next;
        h.next += 1;
        seq
    })?;
    let entry = Entry {
        seq,
        vm,
        endpoint: endpoint.to_string(),
        ..entry
    };
    store.set(&slot_key(seq), &entry.encode_to_vec(), 0)?;
    Ok(seq)
}

/// A VM's position in the log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cursor {
    /// The next sequence number to apply.
    pub next: u64,
    /// Whether the cursor was placed (a new VM starts at the oldest entry still in the ring).
    pub started: bool,
}

impl Cursor {
    /// Notes that this VM published entry `seq` (and applied it itself): when it is the
    /// next one to read, it is skipped without a shared-data read.
    pub fn published(&mut self, seq: u64) {
        if self.started && self.next == seq {
            self.next = seq + 1;
        }
    }
}

/// Applies the entries this VM has not seen to `index`. Returns how many were applied.
pub fn sync(
    store: &impl SharedStore,
    vm: u64,
    index: &mut PrefixIndex,
    cursor: &mut Cursor,
) -> Result<u64, StoreError> {
    let head = read::<Head>(store, HEAD_KEY)?.unwrap_or_default().next;
    if !cursor.started {
        cursor.next = head.saturating_sub(RING);
        cursor.started = true;
    }
    if cursor.next > head {
        // The log was reset (new shared data): start over.
        cursor.next = head.saturating_sub(RING);
    }
    if head.saturating_sub(cursor.next) > RING {
        cursor.next = head - RING;
    }
    let mut applied = 0;
    while cursor.next < head && applied < MAX_APPLY_PER_SYNC {
        let seq = cursor.next;
        let entry = match store.get(&slot_key(seq))? {
            Some(v) => Entry::decode(v.bytes.as_slice()).ok(),
            None => None,
        };
        match entry {
            Some(e) if e.seq == seq => {
                if e.vm != vm {
                    let cap = usize::try_from(e.capacity).unwrap_or(usize::MAX);
                    if e.resize {
                        index.set_capacity(&e.endpoint, cap);
                    } else {
                        index.insert(&e.endpoint, &e.hashes, cap);
                        index.precise.speculative.add(
                            &e.endpoint,
                            &e.speculative,
                            e.speculative_until_ms,
                        );
                    }
                    applied += 1;
                }
                cursor.next += 1;
            }
            Some(e) if e.seq > seq => cursor.next += 1, // overwritten: lost, move on
            _ if head - seq > SKIP_UNWRITTEN_AFTER => cursor.next += 1,
            _ => break, // claimed, not written yet: next time
        }
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared_store::MemoryStore;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn hashes(hashes: &[u64]) -> Picked<'_> {
        Picked {
            hashes,
            ..Picked::default()
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_pick_on_one_worker_reaches_the_index_of_another() {
        let store = MemoryStore::default();
        let (mut ix1, mut ix2) = (PrefixIndex::new(), PrefixIndex::new());
        let (mut c1, mut c2) = (Cursor::default(), Cursor::default());
        sync(&store, 1, &mut ix1, &mut c1).unwrap();
        sync(&store, 2, &mut ix2, &mut c2).unwrap();
        // Worker 1 routes a request to "a" and applies it locally.
        ix1.insert("a", &[10, 11], 100);
        publish(&store, 1, "a", hashes(&[10, 11]), 100).unwrap();
        // Worker 2's next pick syncs first and sees it.
        assert_eq!(sync(&store, 2, &mut ix2, &mut c2).unwrap(), 1);
        assert!(ix2.holds("a", 10) && ix2.holds("a", 11));
        // Worker 1 does not apply its own entry twice (nor read it, once noted), and
        // nothing is re-applied.
        assert_eq!(sync(&store, 1, &mut ix1, &mut c1).unwrap(), 0);
        let own = publish(&store, 1, "a", hashes(&[12]), 100).unwrap();
        c1.published(own);
        assert_eq!(c1.next, own + 1);
        assert_eq!(sync(&store, 2, &mut ix2, &mut c2).unwrap(), 1);
        assert_eq!(sync(&store, 2, &mut ix2, &mut c2).unwrap(), 0);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_capacity_learned_on_one_worker_resizes_the_others() {
        let store = MemoryStore::default();
        let mut ix = PrefixIndex::new();
        let mut c = Cursor::default();
        publish(&store, 1, "a", hashes(&[1, 2, 3, 4]), 100).unwrap();
        publish_capacity(&store, 1, "a", 2).unwrap();
        assert_eq!(sync(&store, 2, &mut ix, &mut c).unwrap(), 2);
        assert_eq!(ix.capacity("a"), Some(2));
        assert!(!ix.holds("a", 2) && ix.holds("a", 3) && ix.holds("a", 4));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_new_vm_replays_what_the_ring_still_holds() {
        let store = MemoryStore::default();
        for i in 0..10u64 {
            publish(&store, 1, "a", hashes(&[i]), 100).unwrap();
        }
        let mut ix = PrefixIndex::new();
        let mut c = Cursor::default();
        assert_eq!(sync(&store, 3, &mut ix, &mut c).unwrap(), 10);
        assert_eq!(ix.size(), 10);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn an_unwritten_slot_is_waited_for_then_skipped() {
        let store = MemoryStore::default();
        // Claim seq 0 without writing it (a writer between its two calls).
        update(&store, HEAD_KEY, |h: &mut Head| h.next += 1).unwrap();
        let mut ix = PrefixIndex::new();
        let mut c = Cursor::default();
        publish(&store, 1, "a", hashes(&[1]), 10).unwrap();
        assert_eq!(
            sync(&store, 2, &mut ix, &mut c).unwrap(),
            0,
            "waits for seq 0"
        );
        for i in 0..SKIP_UNWRITTEN_AFTER {
            publish(&store, 1, "a", hashes(&[100 + i]), 1000).unwrap();
        }
        let n = sync(&store, 2, &mut ix, &mut c).unwrap();
        assert_eq!(
            n,
            SKIP_UNWRITTEN_AFTER + 1,
            "seq 0 skipped, the rest applied"
        );
    }
}
