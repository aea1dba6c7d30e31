//! The scraper: from the root tick of the VM holding the lease, `GET /metrics` on every
//! endpoint through the ORIGINAL_DST scrape cluster (`x-envoy-original-dst-host`), parse,
//! map, and publish one snapshot per endpoint; read Envoy's admin `/clusters` for
//! discovery; set the pool gauges. VMs without the lease do nothing here.
//!
//! A round starts when the previous one is complete (or timed out) and the interval has
//! passed; the snapshots are published once per round (when the last answer arrives, or
//! at the next tick). An endpoint whose scrape fails is marked `failing` (not a candidate)
//! until a scrape succeeds again.

use super::{host, stats, store::HostStore, vm};
use crate::datalayer::discovery::{parse_clusters, Discovered, DISCOVERED_KEY};
use crate::datalayer::snapshot::{
    decode_version, encode_version, pool_stats, EndpointSnapshot, Snapshots, SNAPSHOTS_KEY,
    VERSION_KEY,
};
use crate::datalayer::{lease, mapping, prior_weights::PriorWeights, prometheus};
use crate::endpoint::Endpoint;
use crate::inflight::{self, endpoint_key};
use crate::metrics;
use crate::runtime::Runtime;
use crate::shared_store::{update_record, SharedStore};
use hashbrown::HashMap;
use prost::Message;
use std::cell::RefCell;

/// What a pending callout is for.
enum Pending {
    /// `in_flight`: this gateway's requests in flight at the endpoint when it was sent.
    Metrics {
        address: String,
        in_flight: u64,
    },
    Discovery,
}

#[derive(Default)]
struct Scraper {
    holder: bool,
    pending: HashMap<u32, (Pending, i64)>,
    results: HashMap<String, EndpointSnapshot>,
    /// The rendezvous prior's load weights, published with the snapshots.
    weights: PriorWeights,
    dirty: bool,
    last_round_ms: i64,
    last_discovery_ms: i64,
    last_gauges_ms: i64,
    gauge_pods: Vec<String>,
}

thread_local! {
    static SCRAPER: RefCell<Scraper> = RefCell::new(Scraper::default());
}

/// Whether this VM held the scrape lease at its last tick (it also trains the latency
/// predictor).
pub fn holds_lease() -> bool {
    SCRAPER.with(|s| s.try_borrow().map(|s| s.holder).unwrap_or(false))
}

/// Gauges are refreshed at most this often.
const GAUGE_PERIOD_MS: i64 = 1_000;

/// One tick of this VM.
pub fn tick(rt: &Runtime, vm: u64, now: i64) {
    let ttl = lease::ttl_ms(rt.data_layer.interval_ms);
    let holder = match lease::try_acquire(&HostStore, vm, now, ttl) {
        Ok(h) => h,
        Err(e) => {
            log::debug!("scrape lease unavailable: {e:?}");
            false
        }
    };
    SCRAPER.with(|s| {
        let mut s = s.borrow_mut();
        if holder && !s.holder {
            log::info!("VM {vm} now scrapes model-server metrics");
        }
        s.holder = holder;
        if !holder {
            s.pending.clear();
            return;
        }
        // Callouts older than their timeout are abandoned (Envoy answers them with a 504,
        // which we may never see if the VM was busy).
        let timeout = i64::try_from(rt.data_layer.timeout_ms).unwrap_or(i64::MAX);
        s.pending
            .retain(|_, (_, sent)| now.saturating_sub(*sent) <= timeout.saturating_add(1_000));
        if s.dirty {
            publish(&mut s, now);
        }
        if let Some(d) = &rt.pool.discovery {
            let period = i64::try_from(d.refresh_ms).unwrap_or(i64::MAX);
            let waiting = s
                .pending
                .values()
                .any(|(p, _)| matches!(p, Pending::Discovery));
            if !waiting && now.saturating_sub(s.last_discovery_ms) >= period {
                s.last_discovery_ms = now;
                let headers = [
                    (":method", "GET"),
                    (":path", "/clusters?format=json"),
                    (":authority", "envoy-admin"),
                ];
                match host::http_call(&d.admin_cluster, &headers, rt.data_layer.timeout_ms) {
                    Ok(token) => {
                        s.pending.insert(token, (Pending::Discovery, now));
                    }
                    Err(status) => log::warn!(
                        "cannot call the admin cluster `{}`: status {status}",
                        d.admin_cluster
                    ),
                }
            }
        }
        if rt.data_layer.enabled {
            let interval = i64::try_from(rt.data_layer.interval_ms).unwrap_or(i64::MAX);
            let busy = s
                .pending
                .values()
                .any(|(p, _)| matches!(p, Pending::Metrics { .. }));
            if !busy && now.saturating_sub(s.last_round_ms) >= interval {
                s.last_round_ms = now;
                let endpoints = endpoints(rt);
                // One more ledger read per round, only where it is used.
                let own = if rt.counts_other_replicas() {
                    own_in_flight(now)
                } else {
                    HashMap::new()
                };
                // Endpoints that left the pool (discovery, reconfiguration) leave the snapshots.
                let before = s.results.len();
                s.results
                    .retain(|address, _| endpoints.iter().any(|e| &e.address == address));
                if s.results.len() != before {
                    s.dirty = true;
                }
                for e in endpoints {
                    let headers = [
                        (":method", "GET"),
                        (":path", rt.data_layer.path.as_str()),
                        (":authority", e.address.as_str()),
                        ("x-envoy-original-dst-host", e.address.as_str()),
                    ];
                    match host::http_call(
                        &rt.data_layer.cluster,
                        &headers,
                        rt.data_layer.timeout_ms,
                    ) {
                        Ok(token) => {
                            s.pending.insert(
                                token,
                                (
                                    Pending::Metrics {
                                        in_flight: own
                                            .get(&endpoint_key(&e.address))
                                            .copied()
                                            .unwrap_or(0),
                                        address: e.address.clone(),
                                    },
                                    now,
                                ),
                            );
                        }
                        Err(status) => {
                            log::debug!("cannot scrape {}: status {status}", e.address);
                        }
                    }
                }
            }
        }
        if now.saturating_sub(s.last_gauges_ms) >= GAUGE_PERIOD_MS {
            s.last_gauges_ms = now;
            gauges(rt, &mut s, now);
        }
    });
}

/// This gateway's requests in flight per endpoint (every worker), recorded with each
/// scrape so that the servers' counts can be split into its own and the other replicas'
/// (`Metrics::other_load`).
fn own_in_flight(now: i64) -> HashMap<u64, u64> {
    let mut ledger = inflight::read(&HostStore).unwrap_or_default();
    ledger.drop_stale(now);
    ledger
        .loads()
        .iter()
        .map(|(key, load)| (key, load.requests))
        .collect()
}

fn endpoints(rt: &Runtime) -> Vec<Endpoint> {
    let discovery = rt.pool.discovery.is_some();
    let discovered = vm::with(|vm| {
        vm.view.refresh(discovery);
        vm.view.discovered.clone()
    })
    .unwrap_or_default();
    let mut out = rt.pool.endpoints.clone();
    for e in discovered {
        if !out.iter().any(|x| x.address == e.address) {
            out.push(e);
        }
    }
    out
}

/// An HTTP callout answered (or failed: no `:status`).
pub fn on_response(rt: &Runtime, token: u32, body_size: usize) {
    let now = host::clock_ms();
    SCRAPER.with(|s| {
        let mut s = s.borrow_mut();
        let Some((pending, _)) = s.pending.remove(&token) else {
            return;
        };
        let status = host::header(host::Map::HttpCallResponseHeaders, ":status")
            .ok()
            .flatten()
            .unwrap_or_default();
        let body = if status == "200" {
            host::http_call_body(body_size).unwrap_or_default()
        } else {
            Vec::new()
        };
        match pending {
            Pending::Discovery => {
                let Some(d) = &rt.pool.discovery else { return };
                if status != "200" {
                    log::warn!("admin /clusters answered `{status}`");
                    return;
                }
                match parse_clusters(&body, &d.cluster) {
                    Ok(eps) => {
                        let rec = Discovered {
                            updated_ms: now,
                            addresses: eps.into_iter().map(|e| e.address).collect(),
                        };
                        if let Err(e) = set_key(DISCOVERED_KEY, &rec.encode_to_vec()) {
                            log::warn!("cannot publish discovered endpoints: {e:?}");
                        }
                    }
                    Err(e) => log::warn!("discovery: {e}"),
                }
            }
            Pending::Metrics { address, in_flight } => {
                let previous = s.results.get(&address).cloned();
                let was_failing = previous.as_ref().is_some_and(|p| p.failing);
                let snap = if status == "200" {
                    let text = String::from_utf8_lossy(&body);
                    let parsed = prometheus::parse(&text);
                    let labels = rt
                        .pool
                        .endpoints
                        .iter()
                        .find(|e| e.address == address)
                        .map(|e| e.labels.clone())
                        .unwrap_or_default();
                    let engine = rt.data_layer.mapping.engine_for(&labels);
                    match engine.and_then(|e| mapping::extract(e, &parsed.samples, now)) {
                        Some(m) => EndpointSnapshot {
                            gateway_in_flight: in_flight,
                            ..EndpointSnapshot::from_metrics(&address, &m)
                        },
                        None => {
                            // Answered but without known metrics: keep it a candidate with
                            // its last values (the reference sets no UpdateTime).
                            log::debug!("{address}: no known metric in the response");
                            EndpointSnapshot {
                                failing: false,
                                ..previous.unwrap_or_else(|| EndpointSnapshot {
                                    address: address.clone(),
                                    ..EndpointSnapshot::default()
                                })
                            }
                        }
                    }
                } else {
                    let why = if status.is_empty() {
                        "no response (connect failure or timeout)".to_string()
                    } else {
                        format!("status {status}")
                    };
                    if !was_failing {
                        log::warn!("endpoint {address} leaves the candidates: metrics scrape failed ({why})");
                    }
                    EndpointSnapshot {
                        failing: true,
                        ..previous.unwrap_or_else(|| EndpointSnapshot {
                            address: address.clone(),
                            ..EndpointSnapshot::default()
                        })
                    }
                };
                if was_failing && !snap.failing {
                    log::info!("endpoint {address} answers again and is a candidate");
                }
                s.results.insert(address, snap);
                s.dirty = true;
                let round_done = !s.pending.values().any(|(p, _)| matches!(p, Pending::Metrics { .. }));
                if round_done {
                    publish(&mut s, now);
                }
            }
        }
    });
}

fn set_key(key: &str, value: &[u8]) -> Result<(), crate::shared_store::StoreError> {
    use crate::shared_store::SharedStore;
    HostStore.set(key, value, 0)
}

fn publish(s: &mut Scraper, now: i64) {
    s.dirty = false;
    // The record first, then the version: a reader that sees the new version finds the
    // new record. Only the lease holder writes these keys.
    let version = HostStore
        .get(VERSION_KEY)
        .ok()
        .flatten()
        .and_then(|v| decode_version(&v.bytes))
        .unwrap_or(0)
        + 1;
    let mut endpoints: Vec<EndpointSnapshot> = s.results.values().cloned().collect();
    s.weights.update(now, &mut endpoints);
    let rec = Snapshots::encode(version, now, &endpoints);
    let done = set_key(SNAPSHOTS_KEY, &rec).and_then(|()| {
        update_record(
            &HostStore,
            VERSION_KEY,
            decode_version,
            |v| encode_version(*v),
            |v| *v = version,
        )
    });
    if let Err(e) = done {
        log::warn!("cannot publish snapshots: {e:?}");
    }
}

fn gauges(rt: &Runtime, s: &mut Scraper, now: i64) {
    let name = rt.pool.name.as_str();
    let p = pool_stats(s.results.values(), now);
    super::flow::pool_gauges(rt, now);
    stats::set(&metrics::POOL_READY_PODS, &[name], p.ready);
    stats::set_value(&metrics::POOL_AVERAGE_KV, &[name], p.average_kv);
    stats::set_value(&metrics::POOL_AVERAGE_QUEUE, &[name], p.average_queue);
    stats::set_value(&metrics::POOL_AVERAGE_RUNNING, &[name], p.average_running);
    let mut pods = Vec::new();
    for e in s.results.values() {
        stats::set(&metrics::POOL_PER_POD_QUEUE, &[name, &e.address], e.waiting);
        pods.push(e.address.clone());
    }
    // Endpoints that left the pool read 0 rather than a frozen value.
    for gone in s.gauge_pods.iter().filter(|a| !pods.contains(a)) {
        stats::set(&metrics::POOL_PER_POD_QUEUE, &[name, gone], 0);
    }
    s.gauge_pods = pods;
}

/// Sets the prefix index's size gauge from this VM's copy, if this VM routes (a VM that
/// never picks, the main thread's, keeps no copy up to date: following every worker's
/// picks there would double the index's work for one gauge). Every worker's copy learns
/// the same picks, so any routing VM's size will do; the latest setting is the value.
pub fn prefix_index_size() {
    let size = vm::with(|state| (state.decisions > 0).then(|| state.prefix.size())).flatten();
    if let Some(size) = size {
        let size = u64::try_from(size).unwrap_or(u64::MAX);
        stats::set(&metrics::PREFIX_INDEXER_SIZE, &[], size);
    }
}
