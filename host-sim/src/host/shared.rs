//! What every VM of the simulated Envoy process shares: shared data with CAS, shared
//! queues, and the stats (metrics). One [`Shared`] per simulated process.

use std::collections::{BTreeMap, HashMap, VecDeque};

/// Where a queue's `on_queue_ready` goes: the VM slot (thread) and root context that
/// registered it last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueOwner {
    /// Thread slot of the registering VM.
    pub slot: usize,
    /// Its root context id.
    pub root: u32,
}

/// One shared queue.
#[derive(Debug)]
pub struct Queue {
    /// Last registrant.
    pub owner: QueueOwner,
    /// Messages not dequeued yet.
    pub items: VecDeque<Vec<u8>>,
}

/// Metric types of the ABI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum MetricKind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Samples in buckets.
    Histogram,
}

/// One stat, process-wide, keyed by its full name (`wasmcustom.<name>`).
#[derive(Debug, Clone)]
pub struct Stat {
    /// Its type (first definition wins).
    pub kind: MetricKind,
    /// Counter or gauge value; a gauge is an unsigned 64-bit number in Envoy, so
    /// decrementing below zero wraps (shown as such in the Prometheus view).
    pub value: u64,
    /// Histogram samples.
    pub samples: Vec<u64>,
}

/// The process-wide store.
#[derive(Debug, Default)]
pub struct Shared {
    data: HashMap<(String, String), (Vec<u8>, u32)>,
    next_cas: u32,
    queues: Vec<Queue>,
    queue_index: HashMap<(String, String), u32>,
    /// Stats by full name.
    pub stats: BTreeMap<String, Stat>,
    /// Conditional writes refused because another write came first.
    pub cas_mismatches: u64,
}

/// Result of a shared-data write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetResult {
    /// Written.
    Ok,
    /// `cas` did not match the current token.
    CasMismatch,
}

impl Shared {
    fn cas_token(&mut self) -> u32 {
        // proxy-wasm-cpp-host: one global counter, never 0.
        self.next_cas = self.next_cas.wrapping_add(1);
        if self.next_cas == 0 {
            self.next_cas = 1;
        }
        self.next_cas
    }

    /// `get_shared_data`: value and CAS token, `None` when the key was never written.
    pub fn get(&mut self, vm_id: &str, key: &str) -> Option<(Vec<u8>, u32)> {
        self.data
            .get(&(vm_id.to_string(), key.to_string()))
            .cloned()
    }

    /// Borrowing read for host-side inspection (no copy of the key strings needed by callers).
    pub fn peek(&self, vm_id: &str, key: &str) -> Option<&[u8]> {
        self.data
            .get(&(vm_id.to_string(), key.to_string()))
            .map(|(v, _)| v.as_slice())
    }

    /// How many keys `vm_id`'s shared data holds and their values' total size in bytes.
    pub fn footprint(&self, vm_id: &str) -> (usize, usize) {
        self.data
            .iter()
            .filter(|((vm, _), _)| vm == vm_id)
            .fold((0, 0), |(n, b), ((_, k), (v, _))| {
                (n + 1, b + k.len() + v.len())
            })
    }

    /// `set_shared_data`: a missing key is always written; an existing one only when
    /// `cas` is 0 or equals its token.
    pub fn set(&mut self, vm_id: &str, key: &str, value: &[u8], cas: u32) -> SetResult {
        let token = self.cas_token();
        let k = (vm_id.to_string(), key.to_string());
        match self.data.get_mut(&k) {
            Some(entry) => {
                if cas != 0 && cas != entry.1 {
                    self.cas_mismatches += 1;
                    return SetResult::CasMismatch;
                }
                *entry = (value.to_vec(), token);
            }
            None => {
                self.data.insert(k, (value.to_vec(), token));
            }
        }
        SetResult::Ok
    }

    /// `register_shared_queue`: creates the queue or re-points it at the caller (the last
    /// registrant receives). Returns its token.
    pub fn register_queue(&mut self, vm_id: &str, name: &str, owner: QueueOwner) -> u32 {
        let k = (vm_id.to_string(), name.to_string());
        if let Some(&token) = self.queue_index.get(&k) {
            self.queues[token as usize - 1].owner = owner;
            return token;
        }
        self.queues.push(Queue {
            owner,
            items: VecDeque::new(),
        });
        let token = self.queues.len() as u32;
        self.queue_index.insert(k, token);
        token
    }

    /// `resolve_shared_queue`.
    pub fn resolve_queue(&self, vm_id: &str, name: &str) -> Option<u32> {
        self.queue_index
            .get(&(vm_id.to_string(), name.to_string()))
            .copied()
    }

    /// `enqueue_shared_queue`: the owner to notify, `None` for an unknown token.
    pub fn enqueue(&mut self, token: u32, value: &[u8]) -> Option<QueueOwner> {
        let q = self.queues.get_mut((token as usize).checked_sub(1)?)?;
        q.items.push_back(value.to_vec());
        Some(q.owner)
    }

    /// `dequeue_shared_queue`: `Err(())` for an unknown token, `Ok(None)` when empty.
    #[allow(clippy::result_unit_err)]
    pub fn dequeue(&mut self, token: u32) -> Result<Option<Vec<u8>>, ()> {
        let idx = (token as usize).checked_sub(1).ok_or(())?;
        let q = self.queues.get_mut(idx).ok_or(())?;
        Ok(q.items.pop_front())
    }

    /// Defines (or finds) a stat.
    pub fn define_stat(&mut self, full_name: &str, kind: MetricKind) {
        self.stats
            .entry(full_name.to_string())
            .or_insert_with(|| Stat {
                kind,
                value: 0,
                samples: Vec::new(),
            });
    }

    /// A stat by full name.
    pub fn stat_mut(&mut self, full_name: &str) -> Option<&mut Stat> {
        self.stats.get_mut(full_name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cas_writes_only_over_the_version_read_and_a_missing_key_is_always_writable() {
        let mut s = Shared::default();
        assert_eq!(s.get("vm", "k"), None);
        assert_eq!(
            s.set("vm", "k", b"a", 12345),
            SetResult::Ok,
            "missing key: any cas"
        );
        let (_, cas) = s.get("vm", "k").unwrap();
        assert_eq!(s.set("vm", "k", b"b", cas), SetResult::Ok);
        assert_eq!(
            s.set("vm", "k", b"c", cas),
            SetResult::CasMismatch,
            "stale token"
        );
        assert_eq!(
            s.set("vm", "k", b"d", 0),
            SetResult::Ok,
            "0 = unconditional"
        );
        assert_eq!(s.get("vm", "k").unwrap().0, b"d");
        assert_eq!(s.get("other-vm", "k"), None, "keyed by vm_id");
    }

    #[test]
    fn the_last_registrant_owns_a_queue_and_tokens_are_stable() {
        let mut s = Shared::default();
        let a = QueueOwner { slot: 2, root: 1 };
        let b = QueueOwner { slot: 3, root: 1 };
        let t = s.register_queue("vm", "q", a);
        assert_eq!(s.register_queue("vm", "q", b), t);
        assert_eq!(s.resolve_queue("vm", "q"), Some(t));
        assert_eq!(s.enqueue(t, b"m"), Some(b));
        assert_eq!(s.dequeue(t), Ok(Some(b"m".to_vec())));
        assert_eq!(s.dequeue(t), Ok(None));
        assert_eq!(s.dequeue(t + 1), Err(()));
    }
}
