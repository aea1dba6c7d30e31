//! Clients' connections and how they are spread over Envoy's workers.
//!
//! Envoy 1.40 on Linux listens with `SO_REUSEPORT` per worker, so the kernel hashes each
//! new connection's 4-tuple to a worker: effectively a uniform random choice per
//! connection, which is what this models (seeded). Every stream of one connection stays
//! on that worker.

use super::clock::Rng;
use std::collections::HashMap;

/// Connection-to-worker assignment.
#[derive(Debug, Default)]
pub struct Connections {
    /// The worker of each connection id seen so far.
    by_id: HashMap<u64, usize>,
}

impl Connections {
    /// The worker of connection `id` (`None` = a fresh connection), assigning one on first use.
    pub fn worker(&mut self, id: Option<u64>, workers: usize, rng: &mut Rng) -> usize {
        if let Some(id) = id {
            if let Some(&w) = self.by_id.get(&id) {
                return w;
            }
        }
        let w = rng.below(workers as u64) as usize;
        if let Some(id) = id {
            self.by_id.insert(id, w);
        }
        w
    }
}
