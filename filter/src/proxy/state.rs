//! This VM's view of the cross-worker state, refreshed from shared data before it is
//! used: the endpoint snapshots (refetched only when their version changed), the
//! discovered endpoints, and the candidate list built from them.

use super::store::HostStore;
use crate::datalayer::discovery::{Discovered, DISCOVERED_KEY};
use crate::datalayer::snapshot::{self, Version, SNAPSHOTS_KEY, VERSION_KEY};
use crate::datalayer::{by_key, candidates, endpoint_loads, Snapshots};
use crate::endpoint::{Candidate, Endpoint};
use crate::flow_control::saturation::EndpointLoad;
use crate::shared_store::read;
use std::collections::BTreeMap;

/// Cached snapshots and discovered endpoints.
#[derive(Default)]
pub struct View {
    version: Option<u64>,
    /// Latest snapshot per endpoint.
    pub snapshots: Snapshots,
    /// Endpoints discovered from Envoy's cluster membership.
    pub discovered: Vec<Endpoint>,
    /// The candidate list built from the above (no subset hint), until they change.
    cached: Option<Vec<Candidate>>,
}

impl View {
    /// Rereads the snapshots (when their version moved) and, with discovery, the
    /// discovered endpoints. (Not throttled: a VM routing a request that another VM just
    /// dispatched because an endpoint came back must see that endpoint too.)
    pub fn refresh(&mut self, discovery: bool) {
        match read::<Version>(&HostStore, VERSION_KEY) {
            Ok(Some(v)) if self.version != Some(v.version) => {
                if let Ok(Some(s)) = read::<snapshot::Snapshots>(&HostStore, SNAPSHOTS_KEY) {
                    self.snapshots = by_key(s.endpoints);
                    self.version = Some(v.version);
                    self.cached = None;
                }
            }
            Ok(_) => {}
            Err(e) => log::debug!("snapshot version read failed: {e:?}"),
        }
        if discovery {
            if let Ok(Some(d)) = read::<Discovered>(&HostStore, DISCOVERED_KEY) {
                if d.addresses.len() != self.discovered.len()
                    || d.addresses
                        .iter()
                        .zip(&self.discovered)
                        .any(|(a, e)| *a != e.address)
                {
                    self.cached = None;
                    self.discovered = d
                        .addresses
                        .into_iter()
                        .map(|address| Endpoint {
                            address,
                            labels: BTreeMap::new(),
                        })
                        .collect();
                }
            }
        }
    }

    /// Runs `f` with the current candidates: static and discovered endpoints, minus
    /// failing ones, within the subset hint, with their latest metrics. Without a hint the
    /// list is built once per snapshot publication and reused (only in-flight counts
    /// change per pick).
    pub fn with_candidates<R>(
        &mut self,
        endpoints: &[Endpoint],
        subset: Option<&[String]>,
        f: impl FnOnce(&mut Vec<Candidate>) -> R,
    ) -> R {
        if subset.is_some() {
            let mut list = candidates(endpoints, &self.discovered, &self.snapshots, subset);
            return f(&mut list);
        }
        let list = self
            .cached
            .get_or_insert_with(|| candidates(endpoints, &self.discovered, &self.snapshots, None));
        f(list)
    }

    /// The scraped load of every endpoint within the subset hint, for the saturation
    /// detectors.
    pub fn loads(&self, endpoints: &[Endpoint], subset: Option<&[String]>) -> Vec<EndpointLoad> {
        endpoint_loads(endpoints, &self.discovered, &self.snapshots, subset)
    }
}
