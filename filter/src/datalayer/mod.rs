//! The data layer: which endpoints exist and what state they are in.
//!
//! * [`prometheus`] — the `/metrics` text parser.
//! * [`mapping`] — engine metric names (vLLM current and legacy, sglang, trtllm, triton).
//! * [`snapshot`] — per-endpoint snapshots in shared data, pool aggregates, staleness.
//! * [`lease`] — the lease that makes one VM at a time the scraper.
//! * [`discovery`] — endpoints from Envoy's admin `/clusters` (service discovery).
//!
//! The proxy's root tick (`proxy/scrape.rs`) does the I/O; everything here is pure.

pub mod discovery;
pub mod lease;
pub mod mapping;
pub mod prometheus;
pub mod snapshot;
pub mod source;

use crate::endpoint::Endpoint;
use crate::endpoint::KeyMap;
use crate::endpoint::{other_requests, Candidate};
use crate::flow_control::saturation::EndpointLoad;
use snapshot::EndpointSnapshot;

/// The latest snapshot of each endpoint, by its key (`crate::endpoint::key`).
pub type Snapshots = KeyMap<EndpointSnapshot>;

/// [`Snapshots`] of a published list.
pub fn by_key(list: Vec<EndpointSnapshot>) -> Snapshots {
    list.into_iter()
        .map(|s| (crate::endpoint::key(&s.address), s))
        .collect()
}

/// Default scrape period (the reference's `--refresh-metrics-interval`).
pub const DEFAULT_INTERVAL_MS: u64 = 50;
/// Default per-scrape timeout (the reference's `defaultCollectionTimeout`).
pub const DEFAULT_TIMEOUT_MS: u64 = 1_000;
/// Default name of the bootstrap's ORIGINAL_DST cluster used for scrapes.
pub const DEFAULT_CLUSTER: &str = "epp-metrics";

/// How metrics are collected.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Whether any source is configured (`dataLayer.sources: []` disables collection).
    pub enabled: bool,
    /// Scrape period.
    pub interval_ms: u64,
    /// Per-scrape timeout.
    pub timeout_ms: u64,
    /// Metrics path.
    pub path: String,
    /// Envoy cluster the callouts go through (ORIGINAL_DST on `x-envoy-original-dst-host`).
    pub cluster: String,
    /// Engine metric mapping.
    pub mapping: mapping::Mapping,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            enabled: true,
            interval_ms: DEFAULT_INTERVAL_MS,
            timeout_ms: DEFAULT_TIMEOUT_MS,
            path: "/metrics".to_string(),
            cluster: DEFAULT_CLUSTER.to_string(),
            mapping: mapping::Mapping::default(),
        }
    }
}

/// Whether the subset hint allows `address`. No hint: every endpoint. An entry with a
/// port matches that `ip:port` exactly; an entry without a port matches every port of the
/// IP (the reference matches by IP only, which conflates data-parallel ranks served on
/// one IP).
pub fn subset_allows(subset: Option<&[String]>, address: &str) -> bool {
    let Some(list) = subset else { return true };
    let ip = host_of(address);
    list.iter().any(|entry| {
        let entry = entry.trim();
        if entry.parse::<std::net::SocketAddr>().is_ok() {
            entry == address
        } else {
            entry.trim_start_matches('[').trim_end_matches(']') == ip
        }
    })
}

/// The IP part of `ip:port` (brackets removed for IPv6).
pub fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Parses the subset hint header value (a comma list of `ip:port` or `ip`).
pub fn parse_subset(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// The candidates for one request: static then discovered endpoints (deduplicated),
/// minus those whose last scrape failed, minus those outside the subset hint, with their
/// latest metrics. In-flight counts are filled in by the caller.
pub fn candidates(
    static_endpoints: &[Endpoint],
    discovered: &[Endpoint],
    snapshots: &Snapshots,
    subset: Option<&[String]>,
) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = Vec::with_capacity(static_endpoints.len() + discovered.len());
    let mut seen: KeyMap<()> = KeyMap::with_capacity_and_hasher(out.capacity(), Default::default());
    for e in static_endpoints.iter().chain(discovered) {
        let key = crate::endpoint::key(&e.address);
        if !subset_allows(subset, &e.address) || seen.insert(key, ()).is_some() {
            continue;
        }
        let snap = snapshots.get(&key);
        if snap.is_some_and(|s| s.failing) {
            continue;
        }
        out.push(Candidate {
            address: e.address.clone(),
            key,
            labels: e.labels.clone(),
            metrics: snap.map(EndpointSnapshot::metrics).unwrap_or_default(),
            ..Candidate::default()
        });
    }
    out
}

/// The scraped load of every pool endpoint (static then discovered, each once, within the
/// subset hint), as the saturation detectors read it: an endpoint not scraped yet, or
/// whose scrape failed, reads as never scraped (saturated until it is).
pub fn endpoint_loads(
    static_endpoints: &[Endpoint],
    discovered: &[Endpoint],
    snapshots: &Snapshots,
    subset: Option<&[String]>,
) -> Vec<EndpointLoad> {
    let mut seen: hashbrown::HashSet<u64> = hashbrown::HashSet::new();
    static_endpoints
        .iter()
        .chain(discovered)
        .map(|e| (e, crate::endpoint::key(&e.address)))
        .filter(|(e, key)| subset_allows(subset, &e.address) && seen.insert(*key))
        .map(|(_, key)| match snapshots.get(&key) {
            Some(s) if !s.failing && s.updated_ms != 0 => {
                EndpointLoad::scraped(s.waiting, s.kv_usage, Some(s.updated_ms))
                    .with_other_requests(other_requests(s.running, s.waiting, s.gateway_in_flight))
                    .with_own_at_scrape(s.gateway_in_flight)
            }
            _ => EndpointLoad::UNKNOWN,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn ep(a: &str) -> Endpoint {
        Endpoint {
            address: a.into(),
            labels: BTreeMap::new(),
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn failing_endpoints_leave_until_they_answer() {
        let eps = [ep("10.0.0.1:8000"), ep("10.0.0.2:8000")];
        let mut snaps = Snapshots::default();
        snaps.insert(
            crate::endpoint::key("10.0.0.2:8000"),
            EndpointSnapshot {
                address: "10.0.0.2:8000".into(),
                failing: true,
                ..EndpointSnapshot::default()
            },
        );
        snaps.insert(
            crate::endpoint::key("10.0.0.1:8000"),
            EndpointSnapshot {
                address: "10.0.0.1:8000".into(),
                waiting: 3,
                updated_ms: 5,
                ..EndpointSnapshot::default()
            },
        );
        let c = candidates(&eps, &[], &snaps, None);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].metrics.waiting, 3);
        // It answers again.
        snaps
            .get_mut(&crate::endpoint::key("10.0.0.2:8000"))
            .unwrap()
            .failing = false;
        assert_eq!(candidates(&eps, &[], &snaps, None).len(), 2);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn detector_loads_count_each_endpoint_once_within_the_subset_hint() {
        let eps = [ep("10.0.0.1:8000"), ep("10.0.0.2:8000")];
        // Discovery also lists a static endpoint: it is one endpoint, not two.
        let discovered = [ep("10.0.0.2:8000"), ep("10.0.0.3:8000")];
        let mut snaps = Snapshots::default();
        snaps.insert(
            crate::endpoint::key("10.0.0.2:8000"),
            EndpointSnapshot {
                address: "10.0.0.2:8000".into(),
                waiting: 9,
                updated_ms: 5,
                ..EndpointSnapshot::default()
            },
        );
        assert_eq!(endpoint_loads(&eps, &discovered, &snaps, None).len(), 3);
        let only = parse_subset("10.0.0.2:8000");
        let loads = endpoint_loads(&eps, &discovered, &snaps, Some(&only));
        assert_eq!(loads.len(), 1);
        assert_eq!(loads[0].waiting, 9.0);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_subset_hint_restricts_candidates() {
        let eps = [
            ep("10.0.0.1:8000"),
            ep("10.0.0.1:8001"),
            ep("10.0.0.2:8000"),
        ];
        let snaps = Snapshots::default();
        let addrs = |s: Option<&[String]>| -> Vec<String> {
            candidates(&eps, &[], &snaps, s)
                .into_iter()
                .map(|c| c.address)
                .collect()
        };
        assert_eq!(addrs(None).len(), 3);
        let exact = parse_subset("10.0.0.1:8001");
        assert_eq!(
            addrs(Some(&exact)),
            ["10.0.0.1:8001"],
            "ports are respected"
        );
        let by_ip = parse_subset("10.0.0.1");
        assert_eq!(addrs(Some(&by_ip)), ["10.0.0.1:8000", "10.0.0.1:8001"]);
        let empty: Vec<String> = vec![];
        assert!(
            addrs(Some(&empty)).is_empty(),
            "an empty hint means no candidates"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn static_and_discovered_endpoints_merge() {
        let c = candidates(
            &[ep("10.0.0.1:8000")],
            &[ep("10.0.0.1:8000"), ep("10.0.0.3:8000")],
            &Snapshots::default(),
            None,
        );
        assert_eq!(c.len(), 2);
    }
}
