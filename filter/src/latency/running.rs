//! The requests with a TPOT SLO running on each endpoint, across every worker: one
//! shared-data record ([`RUNNING_KEY`]) with a row per VM, each entry one request
//! (its endpoint, its SLOs and its predictions). A pick reads the tightest TPOT SLO per
//! endpoint ([`tightest_tpot`]); the routing VM adds its request after the pick and
//! removes it at the end of the stream, one CAS each, only for requests that carry a
//! TPOT SLO.
//!
//! Entries older than the producer's `contextTTL` are dropped (a lost removal cannot
//! pin an endpoint forever); rows of a VM not seen for [`VM_STALE_MS`] are dropped
//! (a crashed worker's requests died with it). Live VMs refresh their row from the tick.

use crate::shared_store::{read, update, SharedStore, StoreError};
use hashbrown::HashMap;
use prost::Message;

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
        for e in r.entries.iter().filter(|e| e.tpot_slo_ms > 0.0) {
            let v = out.entry(e.endpoint.clone()).or_insert(f64::INFINITY);
            *v = v.min(e.tpot_slo_ms);
        }
    }
    out
}

/// Reads the record (empty when absent).
pub fn load(store: &impl SharedStore) -> Result<RunningSlos, StoreError> {
    Ok(read(store, RUNNING_KEY)?.unwrap_or_default())
}

/// Lists `entry` as running for `vm`.
pub fn add(
    store: &impl SharedStore,
    vm: u64,
    entry: Entry,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<(), StoreError> {
    update(store, RUNNING_KEY, |r: &mut RunningSlos| {
        r.prune(now_ms, ttl_ms);
        let row = match r.rows.iter().position(|w| w.vm == vm) {
            Some(i) => r.rows.get_mut(i),
            None => {
                r.rows.push(VmRow {
                    vm,
                    ..VmRow::default()
                });
                r.rows.last_mut()
            }
        };
        if let Some(row) = row {
            row.seen_ms = now_ms;
            row.entries.retain(|e| e.ctx != entry.ctx);
            if row.entries.len() >= MAX_PER_VM {
                row.entries.remove(0);
            }
            row.entries.push(entry.clone());
        }
    })
}

/// Removes `vm`'s request `ctx`.
pub fn remove(
    store: &impl SharedStore,
    vm: u64,
    ctx: u32,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<(), StoreError> {
    update(store, RUNNING_KEY, |r: &mut RunningSlos| {
        if let Some(row) = r.rows.iter_mut().find(|w| w.vm == vm) {
            row.entries.retain(|e| e.ctx != ctx);
            row.seen_ms = now_ms;
        }
        r.prune(now_ms, ttl_ms);
    })
}

/// Refreshes `vm`'s row (from its tick) when it has one; drops dead rows.
pub fn heartbeat(
    store: &impl SharedStore,
    vm: u64,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<(), StoreError> {
    let Some(r) = read::<RunningSlos>(store, RUNNING_KEY)? else {
        return Ok(());
    };
    if !r.rows.iter().any(|w| w.vm == vm) {
        return Ok(());
    }
    update(store, RUNNING_KEY, |r: &mut RunningSlos| {
        if let Some(row) = r.rows.iter_mut().find(|w| w.vm == vm) {
            row.seen_ms = now_ms;
        }
        r.prune(now_ms, ttl_ms);
    })
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
        add(&store, 1, entry(7, "a", 80.0, 0), 0, TTL).unwrap();
        add(&store, 2, entry(7, "a", 50.0, 0), 0, TTL).unwrap();
        add(&store, 2, entry(8, "b", 30.0, 0), 0, TTL).unwrap();
        let t = tightest_tpot(&load(&store).unwrap(), 10);
        assert_eq!(t.get("a"), Some(&50.0));
        assert_eq!(t.get("b"), Some(&30.0));
        // VM 2's request 7 ends: VM 1's (same context id) stays.
        remove(&store, 2, 7, 20, TTL).unwrap();
        let t = tightest_tpot(&load(&store).unwrap(), 20);
        assert_eq!(t.get("a"), Some(&80.0));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_dead_workers_requests_and_old_entries_are_forgotten() {
        let store = MemoryStore::default();
        add(&store, 1, entry(1, "a", 50.0, 0), 0, TTL).unwrap();
        add(&store, 2, entry(1, "b", 50.0, 0), 0, TTL).unwrap();
        // VM 1 keeps ticking; VM 2 went silent.
        heartbeat(&store, 1, 4_000, TTL).unwrap();
        let t = tightest_tpot(&load(&store).unwrap(), 6_000);
        assert_eq!(t.get("a"), Some(&50.0));
        assert_eq!(t.get("b"), None);
        // Past contextTTL even a live VM's entry goes.
        heartbeat(&store, 1, 5_000, 1_000).unwrap();
        assert!(load(&store).unwrap().rows.is_empty());
    }
}
