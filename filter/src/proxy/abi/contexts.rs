//! This VM's live contexts by id: the root contexts (one per plugin) and one HTTP context
//! per request. Envoy hands out ids in one increasing sequence per VM, so ids are keys
//! (a hashbrown map: one lookup per callback), not indexes.
//!
//! A context is removed when it ends (`on_done` for a request; for a root, `on_done`
//! returning done or a later `host::done`): the module exports no `proxy_on_delete`, so
//! nothing else would. A callback for an id not in the table (a request that arrived
//! before the plugin was configured, or one already ended) does nothing.

use super::traits::{ContextType, HttpContext, NewRoot, RootContext};
use crate::proxy::vm::IdMap;
use std::cell::{Cell, RefCell};

thread_local! {
    static NEW_ROOT: Cell<Option<NewRoot>> = const { Cell::new(None) };
    static ROOTS: RefCell<IdMap<Box<dyn RootContext>>> = RefCell::new(IdMap::default());
    static HTTP: RefCell<IdMap<Box<dyn HttpContext>>> = RefCell::new(IdMap::default());
}

/// How root contexts are made.
pub fn set_new_root(new_root: NewRoot) {
    NEW_ROOT.with(|n| n.set(Some(new_root)));
}

/// Creates context `id`: a root context when `parent` is 0, else an HTTP context of root
/// `parent` (none when that root makes none).
pub fn create(id: u32, parent: u32) {
    if parent == 0 {
        let Some(new_root) = NEW_ROOT.with(Cell::get) else {
            log::error!("no root context constructor: the module was not initialized");
            return;
        };
        let root = new_root(id);
        ROOTS.with(|roots| {
            if let Ok(mut roots) = roots.try_borrow_mut() {
                roots.insert(id, root);
            }
        });
        return;
    }
    let http = ROOTS.with(|roots| {
        let roots = roots.try_borrow().ok()?;
        let root = roots.get(&parent)?;
        match root.get_type() {
            Some(ContextType::HttpContext) => root.create_http_context(id),
            None => None,
        }
    });
    if let Some(http) = http {
        HTTP.with(|table| {
            if let Ok(mut table) = table.try_borrow_mut() {
                table.insert(id, http);
            }
        });
    }
}

/// Runs `f` on root context `id`; `None` when there is none (or a callback is already
/// running on the roots: Envoy never nests callbacks, so this is only a guard).
pub fn with_root<R>(id: u32, f: impl FnOnce(&mut dyn RootContext) -> R) -> Option<R> {
    ROOTS.with(|roots| {
        let mut roots = roots.try_borrow_mut().ok()?;
        let root = roots.get_mut(&id)?;
        Some(f(root.as_mut()))
    })
}

/// Forgets root context `id` (it ended).
pub fn remove_root(id: u32) {
    ROOTS.with(|roots| {
        if let Ok(mut roots) = roots.try_borrow_mut() {
            roots.remove(&id);
        }
    });
}

/// Runs `f` on HTTP context `id`; `None` when there is none.
pub fn with_http<R>(id: u32, f: impl FnOnce(&mut dyn HttpContext) -> R) -> Option<R> {
    HTTP.with(|table| {
        let mut table = table.try_borrow_mut().ok()?;
        let http = table.get_mut(&id)?;
        Some(f(http.as_mut()))
    })
}

/// Takes HTTP context `id` out of the table (it ends).
pub fn take_http(id: u32) -> Option<Box<dyn HttpContext>> {
    HTTP.with(|table| table.try_borrow_mut().ok()?.remove(&id))
}
