//! The data layer: which endpoints exist and what state they are in.
//!
//! * [`prometheus`] — the `/metrics` text parser.
//! * [`mapping`] — engine metric names (vLLM current and legacy, sglang, trtllm, triton).
//! * [`snapshot`] — per-endpoint snapshots in shared data, pool aggregates, staleness.
//! * [`prior_weights`] — the rendezvous prior's load weights the scraper publishes.
//! * [`lease`] — the lease that makes one VM at a time the scraper.
//! * [`discovery`] — endpoints from Envoy's admin `/clusters` (service discovery).
//!
//! The proxy's root tick (`proxy/scrape.rs`) does the I/O; everything here is pure.

pub mod discovery;
pub mod lease;
pub mod mapping;
pub mod notifications;
pub mod prior_weights;
pub mod prometheus;
pub mod snapshot;
pub mod source;

use crate::endpoint::KeyMap;
use crate::endpoint::{other_requests, Candidate, Endpoint};
use crate::flow_control::saturation::EndpointLoad;
pub use snapshot::Snapshots;

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
    Members::new(static_endpoints, discovered, subset).candidates(
        static_endpoints,
        discovered,
        snapshots,
    )
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
    Members::new(static_endpoints, discovered, subset).loads(snapshots)
}

/// The pool's endpoints as the view reads them: static then discovered, each once,
/// within a subset hint, by key. Kept while the endpoints stay the same, so that a new
/// publication of the snapshots is read without hashing an address again, and each
/// endpoint's entry is found where it was in the previous record.
#[derive(Debug, Clone, Default)]
pub struct Members {
    list: Vec<Member>,
}

#[derive(Debug, Clone, Copy)]
struct Member {
    key: u64,
    /// Its position in the static endpoints followed by the discovered ones.
    at: usize,
    /// Where its entry was in the last snapshots read (a hint).
    slot: usize,
}

impl Members {
    /// The endpoints of `static_endpoints` then `discovered`, each once, within `subset`.
    pub fn new(
        static_endpoints: &[Endpoint],
        discovered: &[Endpoint],
        subset: Option<&[String]>,
    ) -> Self {
        let n = static_endpoints.len() + discovered.len();
        let mut seen: KeyMap<()> = KeyMap::with_capacity_and_hasher(n, Default::default());
        let list = static_endpoints
            .iter()
            .chain(discovered)
            .enumerate()
            .filter(|(_, e)| subset_allows(subset, &e.address))
            .map(|(at, e)| Member {
                key: crate::endpoint::key(&e.address),
                at,
                slot: usize::MAX,
            })
            .filter(|m| seen.insert(m.key, ()).is_none())
            .collect();
        Self { list }
    }

    /// The endpoints' snapshots, each looked for where it was last time.
    fn entries<'s>(
        &mut self,
        snapshots: &'s Snapshots,
    ) -> impl Iterator<Item = (Member, Option<snapshot::Entry<'s>>)> + use<'_, 's> {
        self.list.iter_mut().map(|m| {
            let found = snapshots.find(m.key, m.slot);
            if let Some((slot, _)) = found {
                m.slot = slot;
            }
            (*m, found.map(|(_, e)| e))
        })
    }

    /// The candidates: the endpoints whose last scrape did not fail, with their metrics
    /// (`static_endpoints` and `discovered` are the lists these members were made of).
    pub fn candidates(
        &mut self,
        static_endpoints: &[Endpoint],
        discovered: &[Endpoint],
        snapshots: &Snapshots,
    ) -> Vec<Candidate> {
        let mut out = Vec::with_capacity(self.list.len());
        for (m, snap) in self.entries(snapshots) {
            if snap.is_some_and(|s| s.failing()) {
                continue;
            }
            let endpoint = static_endpoints.get(m.at).or_else(|| {
                m.at.checked_sub(static_endpoints.len())
                    .and_then(|i| discovered.get(i))
            });
            let Some(e) = endpoint else { continue };
            out.push(Candidate {
                address: e.address.clone(),
                key: m.key,
                labels: e.labels.clone(),
                metrics: snap.map(|s| s.metrics()).unwrap_or_default(),
                ..Candidate::default()
            });
        }
        out
    }

    /// Brings `list`, which [`Members::candidates`] made from these members, to `snapshots`
    /// in place: the same as making it again, without allocating. `false` when the
    /// candidates are no longer the same endpoints in the same order (one failing now or
    /// answering again, or the list reordered): then nothing is guaranteed about `list`,
    /// which must be made again.
    pub fn refresh(&mut self, list: &mut [Candidate], snapshots: &Snapshots) -> bool {
        let mut next = list.iter_mut();
        for (m, snap) in self.entries(snapshots) {
            if snap.is_some_and(|s| s.failing()) {
                continue;
            }
            let Some(c) = next.next().filter(|c| c.key == m.key) else {
                return false;
            };
            match snap {
                Some(s) => s.write_metrics(&mut c.metrics),
                None => c.metrics = Default::default(),
            }
            c.in_flight = 0;
            c.in_flight_tokens = 0;
            c.prefilling = 0;
            c.prefill_tokens = 0;
        }
        next.next().is_none()
    }

    /// The scraped load of every member, as the saturation detectors read it.
    pub fn loads(&mut self, snapshots: &Snapshots) -> Vec<EndpointLoad> {
        self.entries(snapshots)
            .map(|(_, snap)| match snap {
                Some(s) if !s.failing() && s.updated_ms() != 0 => {
                    EndpointLoad::scraped(s.waiting(), s.kv_usage(), Some(s.updated_ms()))
                        .with_other_requests(other_requests(
                            s.running(),
                            s.waiting(),
                            s.gateway_in_flight(),
                        ))
                        .with_own_at_scrape(s.gateway_in_flight())
                }
                _ => EndpointLoad::UNKNOWN,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapshot::EndpointSnapshot;
    use std::collections::BTreeMap;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn ep(a: &str) -> Endpoint {
        Endpoint {
            address: a.into(),
            labels: BTreeMap::new(),
        }
    }

    fn snap(a: &str, waiting: u64, failing: bool) -> EndpointSnapshot {
        EndpointSnapshot {
            address: a.into(),
            waiting,
            updated_ms: 5,
            failing,
            ..EndpointSnapshot::default()
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn failing_endpoints_leave_until_they_answer() {
        let eps = [ep("10.0.0.1:8000"), ep("10.0.0.2:8000")];
        let mut list = [
            snap("10.0.0.2:8000", 0, true),
            snap("10.0.0.1:8000", 3, false),
        ];
        let c = candidates(&eps, &[], &Snapshots::of(&list), None);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].metrics.waiting, 3);
        // It answers again.
        list[0].failing = false;
        assert_eq!(candidates(&eps, &[], &Snapshots::of(&list), None).len(), 2);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_refresh_in_place_gives_the_list_made_afresh() {
        let eps: Vec<Endpoint> = (0..6).map(|i| ep(&format!("10.0.0.{i}:8000"))).collect();
        let discovered = [ep("10.0.0.5:8000"), ep("10.0.0.9:8000")];
        let round = |t: u64, failing: u64| {
            let list: Vec<EndpointSnapshot> = (0..10)
                .filter(|i| *i != 3) // never scraped
                .map(|i| EndpointSnapshot {
                    active_models: vec![format!("lora-{}", t % 2)],
                    ..snap(&format!("10.0.0.{i}:8000"), t + i, i == failing)
                })
                .collect();
            Snapshots::of(&list)
        };
        let mut members = Members::new(&eps, &discovered, None);
        let mut list = members.candidates(&eps, &discovered, &round(1, 99));
        assert_eq!(list.len(), 7);
        list[2].in_flight = 4;
        let next = round(2, 99);
        assert!(members.refresh(&mut list, &next));
        assert_eq!(list, candidates(&eps, &discovered, &next, None));
        // An endpoint failing now, or one answering again: the list is made afresh.
        assert!(!members.refresh(&mut list, &round(3, 4)));
        let mut list = members.candidates(&eps, &discovered, &round(3, 4));
        assert!(!members.refresh(&mut list, &round(4, 99)));
        // A list reordered (passive health puts ejected endpoints last): made afresh.
        let mut list = members.candidates(&eps, &discovered, &round(5, 99));
        list.swap(0, 1);
        assert!(!members.refresh(&mut list, &round(6, 99)));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn detector_loads_count_each_endpoint_once_within_the_subset_hint() {
        let eps = [ep("10.0.0.1:8000"), ep("10.0.0.2:8000")];
        // Discovery also lists a static endpoint: it is one endpoint, not two.
        let discovered = [ep("10.0.0.2:8000"), ep("10.0.0.3:8000")];
        let snaps = Snapshots::of(&[snap("10.0.0.2:8000", 9, false)]);
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
