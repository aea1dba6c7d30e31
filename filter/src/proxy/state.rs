//! This VM's view of the cross-worker state, refreshed from shared data before each pick:
//! the prefix index (synced from the shared log), the endpoint snapshots (refetched only
//! when their version changed) and the discovered endpoints.

use super::store::HostStore;
use crate::config::{Config, Endpoint};
use crate::datalayer::discovery::{Discovered, DISCOVERED_KEY};
use crate::datalayer::snapshot::{
    EndpointSnapshot, Snapshots, Version, SNAPSHOTS_KEY, VERSION_KEY,
};
use crate::datalayer::{candidates, Settings};
use crate::prefix::index::PrefixIndex;
use crate::prefix::shared::{self, Cursor};
use crate::scheduler::{Candidate, Scheduler};
use crate::shared_store::read;
use hashbrown::HashMap;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

/// The configuration of this plugin instance, built once in `on_configure`.
pub struct Runtime {
    /// The validated configuration.
    pub config: Rc<Config>,
    /// The scheduler built from it.
    pub scheduler: Scheduler,
    /// Data-layer settings.
    pub settings: Settings,
    /// Whether a session-affinity scorer is configured (read `x-session-token`, write it back).
    pub sessions: bool,
}

/// Cached snapshots and discovered endpoints.
#[derive(Default)]
pub struct View {
    version: Option<u64>,
    /// Latest snapshot per endpoint.
    pub snapshots: HashMap<String, EndpointSnapshot>,
    /// Endpoints discovered from Envoy's cluster membership.
    pub discovered: Vec<Endpoint>,
    /// The candidate list built from the above (no subset hint), until they change.
    cached: Option<Vec<Candidate>>,
}

thread_local! {
    static RUNTIME: RefCell<Option<Rc<Runtime>>> = const { RefCell::new(None) };
    static PREFIX: RefCell<(PrefixIndex, Cursor)> = RefCell::new((PrefixIndex::new(), Cursor::default()));
    static VIEW: RefCell<View> = RefCell::new(View::default());
}

/// Remembers this VM's runtime (for streams woken from another context).
pub fn set_runtime(rt: Rc<Runtime>) {
    RUNTIME.with(|r| *r.borrow_mut() = Some(rt));
}

/// This VM's runtime, once configured.
pub fn runtime() -> Option<Rc<Runtime>> {
    RUNTIME.with(|r| r.borrow().clone())
}

/// Runs `f` with this VM's prefix index (and its log cursor) after applying what other
/// workers logged.
pub fn with_prefix<R>(vm: u64, f: impl FnOnce(&mut PrefixIndex, &mut Cursor) -> R) -> R {
    PREFIX.with(|p| {
        let mut guard = p.borrow_mut();
        let (index, cursor) = &mut *guard;
        if let Err(e) = shared::sync(&HostStore, vm, index, cursor) {
            log::debug!("prefix log sync failed: {e:?}");
        }
        f(index, cursor)
    })
}

/// Runs `f` with the current candidates: static and discovered endpoints, minus failing
/// ones, within the subset hint, with their latest metrics. Without a hint the list is
/// built once per snapshot publication and reused (only in-flight counts change per pick).
/// `f` must not call back into this module's view.
pub fn with_candidates<R>(
    rt: &Runtime,
    subset: Option<&[String]>,
    f: impl FnOnce(&mut Vec<Candidate>) -> R,
) -> R {
    VIEW.with(|v| {
        let mut view = v.borrow_mut();
        refresh(&mut view, rt.config.pool.discovery.is_some());
        let view = &mut *view;
        if subset.is_some() {
            let mut list = candidates(
                &rt.config.pool.endpoints,
                &view.discovered,
                &view.snapshots,
                subset,
            );
            return f(&mut list);
        }
        let list = view.cached.get_or_insert_with(|| {
            candidates(
                &rt.config.pool.endpoints,
                &view.discovered,
                &view.snapshots,
                None,
            )
        });
        f(list)
    })
}

/// Runs `f` with fresh snapshots and discovered endpoints.
pub fn with_view<R>(discovery: bool, f: impl FnOnce(&View) -> R) -> R {
    VIEW.with(|v| {
        let mut view = v.borrow_mut();
        refresh(&mut view, discovery);
        f(&view)
    })
}

fn refresh(view: &mut View, discovery: bool) {
    match read::<Version>(&HostStore, VERSION_KEY) {
        Ok(Some(v)) if view.version != Some(v.version) => {
            if let Ok(Some(s)) = read::<Snapshots>(&HostStore, SNAPSHOTS_KEY) {
                view.snapshots = s
                    .endpoints
                    .into_iter()
                    .map(|e| (e.address.clone(), e))
                    .collect();
                view.version = Some(v.version);
                view.cached = None;
            }
        }
        Ok(_) => {}
        Err(e) => log::debug!("snapshot version read failed: {e:?}"),
    }
    if discovery {
        if let Ok(Some(d)) = read::<Discovered>(&HostStore, DISCOVERED_KEY) {
            if d.addresses.len() != view.discovered.len()
                || d.addresses
                    .iter()
                    .zip(&view.discovered)
                    .any(|(a, e)| *a != e.address)
            {
                view.cached = None;
                view.discovered = d
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
