//! This VM's view of the cross-worker state, refreshed from shared data before it is
//! used: the endpoint snapshots (refetched only when their version changed), the
//! discovered endpoints, and the candidate list built from them.

use super::store::HostStore;
use crate::datalayer::discovery::{Discovered, DISCOVERED_KEY};
use crate::datalayer::snapshot::{decode_version, SNAPSHOTS_KEY, VERSION_KEY};
use crate::datalayer::{Members, Snapshots};
use crate::endpoint::{Candidate, Endpoint};
use crate::flow_control::saturation::EndpointLoad;
use crate::shared_store::{read, SharedStore};
use std::collections::BTreeMap;

/// Cached snapshots and discovered endpoints.
#[derive(Default)]
pub struct View {
    version: Option<u64>,
    /// Latest snapshot per endpoint, as published.
    snapshots: Snapshots,
    /// Endpoints discovered from Envoy's cluster membership.
    pub discovered: Vec<Endpoint>,
    /// The pool's endpoints (no subset hint), until the discovered ones change.
    members: Option<Members>,
    /// The candidate list built from the above (no subset hint), until the candidates
    /// change; brought to each new publication of the snapshots in place.
    cached: Option<Vec<Candidate>>,
    /// New snapshots were read since `cached` was brought up to date.
    moved: bool,
}

impl View {
    /// Rereads the snapshots (when their version moved) and, with discovery, the
    /// discovered endpoints. (Not throttled: a VM routing a request that another VM just
    /// dispatched because an endpoint came back must see that endpoint too.)
    pub fn refresh(&mut self, discovery: bool) {
        match HostStore.get(VERSION_KEY) {
            Ok(Some(v)) => match decode_version(&v.bytes) {
                Some(v) if self.version != Some(v) => {
                    if let Ok(Some(s)) = HostStore.get(SNAPSHOTS_KEY) {
                        if let Some(s) = Snapshots::decode(s.bytes) {
                            self.snapshots = s;
                            self.version = Some(v);
                            self.moved = true;
                        }
                    }
                }
                Some(_) => {}
                None => log::debug!("snapshot version unreadable"),
            },
            Ok(None) => {}
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
                    self.members = None;
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

    /// Forgets the pool's endpoints and candidates (a new configuration): they are made
    /// again from the next one's endpoints.
    pub fn forget_pool(&mut self) {
        self.members = None;
        self.cached = None;
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
            let mut members = Members::new(endpoints, &self.discovered, subset);
            let mut list = members.candidates(endpoints, &self.discovered, &self.snapshots);
            return f(&mut list);
        }
        let (discovered, snapshots) = (&self.discovered, &self.snapshots);
        let members = self
            .members
            .get_or_insert_with(|| Members::new(endpoints, discovered, None));
        let moved = std::mem::take(&mut self.moved);
        let current = match &mut self.cached {
            Some(list) => !moved || members.refresh(list, snapshots),
            None => false,
        };
        if !current {
            self.cached = Some(members.candidates(endpoints, discovered, snapshots));
        }
        let list = self.cached.get_or_insert_with(Vec::new);
        f(list)
    }

    /// The scraped load of every endpoint within the subset hint, for the saturation
    /// detectors.
    pub fn loads(
        &mut self,
        endpoints: &[Endpoint],
        subset: Option<&[String]>,
    ) -> Vec<EndpointLoad> {
        if subset.is_some() {
            return Members::new(endpoints, &self.discovered, subset).loads(&self.snapshots);
        }
        let discovered = &self.discovered;
        self.members
            .get_or_insert_with(|| Members::new(endpoints, discovered, None))
            .loads(&self.snapshots)
    }
}
