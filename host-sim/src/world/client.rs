//! Clients' connections and how they are spread over Envoy's workers.
//!
//! Envoy 1.40 on Linux listens with `SO_REUSEPORT` per worker, so the kernel hashes each
//! new connection's 4-tuple to a worker: effectively a uniform random choice per
//! connection, which is what this models (seeded). Every stream of one connection stays
//! on that worker.
//!
//! With several gateway replicas (Envoy processes behind a Kubernetes Service), each new
//! connection first lands on a replica, uniformly at random (kube-proxy's per-connection
//! choice), and then on one of that replica's workers.

use super::clock::Rng;
use std::collections::HashMap;

/// Connection-to-worker assignment.
#[derive(Debug, Default)]
pub struct Connections {
    /// The worker of each connection id seen so far.
    by_id: HashMap<u64, usize>,
    /// The replica of each connection id seen so far.
    replica_by_id: HashMap<u64, usize>,
}

impl Connections {
    /// The replica of connection `id` (`None` = a fresh connection), assigning one on
    /// first use; with one replica always 0 (and no draw, so one-replica runs replay as
    /// before).
    pub fn replica(&mut self, id: Option<u64>, replicas: usize, rng: &mut Rng) -> usize {
        if replicas <= 1 {
            return 0;
        }
        if let Some(&r) = id.and_then(|id| self.replica_by_id.get(&id)) {
            return r;
        }
        let r = rng.below(replicas as u64) as usize;
        if let Some(id) = id {
            self.replica_by_id.insert(id, r);
        }
        r
    }

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
