//! The requests with a TPOT SLO running on each endpoint, across every worker: one
//! shared-data record ([`RUNNING_KEY`]) with a row per VM, each entry one request
//! (its endpoint, its SLOs and its predictions). Each VM keeps its own requests in
//! [`Local`] (added at the pick, removed at the end of the stream: no shared-data work
//! per request) and publishes them on its tick with one CAS, reading back every VM's
//! rows: a pick uses the tightest TPOT SLO per endpoint as of this VM's last tick
//! ([`Local::tightest`]), with its own requests since then folded in at once. Another
//! worker's request is seen within two ticks (100 ms each with a latency producer); an
//! ended one keeps its endpoint's bound until the next tick (the cautious side). The
//! cost per tick is one decode and encode of the record, whatever the traffic; a pick
//! reads none.
//!
//! Entries older than the producer's `contextTTL` are dropped (a lost removal cannot
//! pin an endpoint forever); rows of a VM not seen for [`VM_STALE_MS`] are dropped
//! (a crashed worker's requests died with it).

use crate::shared_store::{read, update, SharedStore, StoreError};
use hashbrown::HashMap;
use prost::Message;
use std::rc::Rc;

/// Shared-data key of the record.
pub const RUNNING_KEY: &str = "epp.v1.latency.running";
/// A row not refreshed for this long belongs to a dead VM.
pub const VM_STALE_MS: i64 = 5_000;
/// At most this many entries per VM (the oldest go first).
pub const MAX_PER_VM: usize = 4_096;

/// The whole record.
#[derive(Clone, PartialEq, Message)]
pub struct RunningSlos {
    /// One row per VM with SLO requests running.
    #[prost(message, repeated, tag = "1")]
    pub rows: Vec<VmRow>,
}

/// One VM's running SLO requests.
#[derive(Clone, PartialEq, Message)]
pub struct VmRow {
    /// The VM's id.
    #[prost(uint64, tag = "1")]
    pub vm: u64,
    /// When the VM last wrote or refreshed the row (ms).
    #[prost(int64, tag = "2")]
    pub seen_ms: i64,
    /// Its requests.
    #[prost(message, repeated, tag = "3")]
    pub entries: Vec<Entry>,
}

/// One running request.
#[derive(Clone, PartialEq, Message)]
pub struct Entry {
    /// The stream's context id (unique within the VM).
    #[prost(uint32, tag = "1")]
    pub ctx: u32,
    /// `ip:port`.
    #[prost(string, tag = "2")]
    pub endpoint: String,
    /// TPOT SLO (ms).
    #[prost(double, tag = "3")]
    pub tpot_slo_ms: f64,
    /// TTFT SLO (ms; 0 = none).
    #[prost(double, tag = "4")]
    pub ttft_slo_ms: f64,
    /// Predicted TTFT (ms; 0 = none).
    #[prost(double, tag = "5")]
    pub predicted_ttft_ms: f64,
    /// Predicted TPOT (ms; 0 = none).
    #[prost(double, tag = "6")]
    pub predicted_tpot_ms: f64,
    /// When it was dispatched (ms).
    #[prost(int64, tag = "7")]
    pub started_ms: i64,
}

impl RunningSlos {
    fn prune(&mut self, now_ms: i64, ttl_ms: i64) {
        self.rows
            .retain(|r| now_ms.saturating_sub(r.seen_ms) < VM_STALE_MS);
        for r in &mut self.rows {
            r.entries
                .retain(|e| now_ms.saturating_sub(e.started_ms) < ttl_ms);
        }
        self.rows.retain(|r| !r.entries.is_empty());
    }
}

/// The tightest TPOT SLO (ms) running on each endpoint, over every live VM.
pub fn tightest_tpot(record: &RunningSlos, now_ms: i64) -> HashMap<String, f64> {
    let mut out: HashMap<String, f64> = HashMap::new();
    for r in record
        .rows
        .iter()
        .filter(|r| now_ms.saturating_sub(r.seen_ms) < VM_STALE_MS)
    {
        for e in &r.entries {
            tighten(&mut out, e);
        }
    }
    out
}

fn tighten(map: &mut HashMap<String, f64>, e: &Entry) {
    if e.tpot_slo_ms > 0.0 {
        match map.get_mut(e.endpoint.as_str()) {
            Some(v) => *v = v.min(e.tpot_slo_ms),
            None => {
                map.insert(e.endpoint.clone(), e.tpot_slo_ms);
            }
        }
    }
}

/// Reads the record (empty when absent).
pub fn load(store: &impl SharedStore) -> Result<RunningSlos, StoreError> {
    Ok(read(store, RUNNING_KEY)?.unwrap_or_default())
}

/// One VM's running SLO requests and its view of every VM's.
#[derive(Debug, Default)]
pub struct Local {
    own: Vec<Entry>,
    /// Shared with the picks in progress (copied on a change only while one holds it).
    tightest: Rc<HashMap<String, f64>>,
    /// Whether the record holds a row of this VM (to drop it once empty).
    published: bool,
}

impl Local {
    /// Lists `entry` (a request just dispatched); picks see it at once.
    pub fn add(&mut self, entry: Entry) {
        self.own.retain(|e| e.ctx != entry.ctx);
        if self.own.len() >= MAX_PER_VM {
            self.own.remove(0);
        }
        tighten(Rc::make_mut(&mut self.tightest), &entry);
        self.own.push(entry);
    }

    /// Unlists request `ctx` (its stream ended).
    pub fn remove(&mut self, ctx: u32) {
        self.own.retain(|e| e.ctx != ctx);
    }

    /// The tightest TPOT SLO (ms) running on each endpoint: every VM's as of the last
    /// [`Local::publish`], this VM's since then.
    pub fn tightest(&self) -> Rc<HashMap<String, f64>> {
        Rc::clone(&self.tightest)
    }

    /// The tick: writes this VM's row (its requests younger than `ttl_ms`), drops dead
    /// rows and old entries, and reads back every VM's.
    pub fn publish(
        &mut self,
        store: &impl SharedStore,
        vm: u64,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<(), StoreError> {
        self.own
            .retain(|e| now_ms.saturating_sub(e.started_ms) < ttl_ms);
        let record = if self.own.is_empty() && !self.published {
            // Nothing of ours to write or take back: a read is enough.
            load(store)?
        } else {
            let own = &self.own;
            update(store, RUNNING_KEY, |r: &mut RunningSlos| {
                r.rows.retain(|w| w.vm != vm);
                if !own.is_empty() {
                    r.rows.push(VmRow {
                        vm,
                        seen_ms: now_ms,
                        entries: own.clone(),
                    });
                }
                r.prune(now_ms, ttl_ms);
                r.clone()
            })?
        };
        self.published = !self.own.is_empty();
        let mut tightest = tightest_tpot(&record, now_ms);
        for e in &self.own {
            tighten(&mut tightest, e);
        }
        self.tightest = Rc::new(tightest);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared_store::MemoryStore;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn entry(ctx: u32, endpoint: &str, tpot: f64, at: i64) -> Entry {
        Entry {
            ctx,
            endpoint: endpoint.into(),
            tpot_slo_ms: tpot,
            started_ms: at,
            ..Entry::default()
        }
    }

    const TTL: i64 = 300_000;

    #[wasm_bindgen_test(unsupported = test)]
    fn the_tightest_slo_across_workers_until_the_request_ends() {
        let store = MemoryStore::default();
        let (mut one, mut two) = (Local::default(), Local::default());
        one.add(entry(7, "a", 80.0, 0));
        two.add(entry(7, "a", 50.0, 0));
        two.add(entry(8, "b", 30.0, 0));
        // Its own requests count at once; another VM's once both have ticked.
        assert_eq!(one.tightest().get("a"), Some(&80.0));
        assert_eq!(one.tightest().get("b"), None);
        two.publish(&store, 2, 5, TTL).unwrap();
        one.publish(&store, 1, 10, TTL).unwrap();
        assert_eq!(one.tightest().get("a"), Some(&50.0));
        assert_eq!(one.tightest().get("b"), Some(&30.0));
        // VM 2's request 7 ends: VM 1's (same context id) stays.
        two.remove(7);
        two.publish(&store, 2, 20, TTL).unwrap();
        one.publish(&store, 1, 25, TTL).unwrap();
        assert_eq!(one.tightest().get("a"), Some(&80.0));
        assert_eq!(one.tightest().get("b"), Some(&30.0));
        // Everything ended: the record empties.
        one.remove(7);
        two.remove(8);
        one.publish(&store, 1, 30, TTL).unwrap();
        two.publish(&store, 2, 30, TTL).unwrap();
        assert!(load(&store).unwrap().rows.is_empty());
        assert!(two.tightest().is_empty());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_dead_workers_requests_and_old_entries_are_forgotten() {
        let store = MemoryStore::default();
        let (mut one, mut two) = (Local::default(), Local::default());
        one.add(entry(1, "a", 50.0, 0));
        two.add(entry(1, "b", 50.0, 0));
        one.publish(&store, 1, 0, TTL).unwrap();
        two.publish(&store, 2, 0, TTL).unwrap();
        // VM 1 keeps ticking; VM 2 went silent.
        one.publish(&store, 1, 4_000, TTL).unwrap();
        one.publish(&store, 1, 6_000, TTL).unwrap();
        assert_eq!(one.tightest().get("a"), Some(&50.0));
        assert_eq!(one.tightest().get("b"), None);
        // Past contextTTL even a live VM's own entry goes.
        one.publish(&store, 1, 7_000, 1_000).unwrap();
        assert!(one.tightest().is_empty());
        assert!(load(&store).unwrap().rows.is_empty());
    }
}
