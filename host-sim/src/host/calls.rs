//! What crosses the VM boundary: how many times each import (host call) and each export
//! (callback, including `proxy_on_memory_allocate` for every buffer the host hands over)
//! was called over a run, and how many bytes each copied into the VM. Counted for every
//! VM of the process; `scripts/bench breakdown` turns them into per-request figures.

use std::collections::BTreeMap;

/// Calls and bytes of one import or export.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    /// Times called.
    pub calls: u64,
    /// Bytes the host copied into the VM's memory for these calls.
    pub bytes: u64,
    /// Wasm instructions the module ran in these callbacks (`HOST_SIM_FUEL=1` only; a
    /// callback's count includes the allocations the host asked of it meanwhile).
    pub fuel: u64,
}

/// Counts by import or export name.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CallCounts {
    /// By name (`proxy_get_shared_data`, `proxy_on_request_body`, ...).
    pub by_name: BTreeMap<&'static str, Count>,
    /// Shared-data operations by (`get` or `set`, key with digits folded to `N`): calls,
    /// and the bytes read or written.
    pub shared_keys: BTreeMap<(&'static str, String), Count>,
    /// With fuel counted: the wasm instructions between two points of a callback (its
    /// start, a host call, its end), by (callback, from, to): times, and instructions
    /// (in `fuel`). Instructions of an allocation the host asked for during a host call
    /// count in the stretch after that call.
    pub stretches: BTreeMap<(&'static str, &'static str, &'static str), Count>,
}

impl CallCounts {
    /// One call of `name`.
    pub fn call(&mut self, name: &'static str) {
        self.by_name.entry(name).or_default().calls += 1;
    }

    /// `bytes` copied into the VM for the current call of `name`.
    pub fn bytes(&mut self, name: &'static str, bytes: u64) {
        self.by_name.entry(name).or_default().bytes += bytes;
    }

    /// `fuel` units the module ran in the current callback `name`.
    pub fn fuel(&mut self, name: &'static str, fuel: u64) {
        self.by_name.entry(name).or_default().fuel += fuel;
    }

    /// `fuel` units run in `callback` from the point `from` to the point `to`.
    pub fn stretch(
        &mut self,
        callback: &'static str,
        from: &'static str,
        to: &'static str,
        fuel: u64,
    ) {
        let c = self.stretches.entry((callback, from, to)).or_default();
        c.calls += 1;
        c.fuel += fuel;
    }

    /// One shared-data `op` (`get` or `set`) of `bytes` on `key`.
    pub fn shared(&mut self, op: &'static str, key: &str, bytes: u64) {
        let folded: String = key
            .chars()
            .map(|c| if c.is_ascii_digit() { 'N' } else { c })
            .collect::<String>()
            .split("NN")
            .collect::<Vec<_>>()
            .join("N");
        let c = self.shared_keys.entry((op, folded)).or_default();
        c.calls += 1;
        c.bytes += bytes;
    }

    /// Calls of every import (names not starting with `proxy_on_`).
    pub fn host_calls(&self) -> u64 {
        self.by_name
            .iter()
            .filter(|(n, _)| !n.starts_with("proxy_on_"))
            .map(|(_, c)| c.calls)
            .sum()
    }

    /// Calls of every export (`proxy_on_*`).
    pub fn callbacks(&self) -> u64 {
        self.by_name
            .iter()
            .filter(|(n, _)| n.starts_with("proxy_on_"))
            .map(|(_, c)| c.calls)
            .sum()
    }
}
