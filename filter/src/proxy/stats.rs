//! Exported metrics: this VM's ids for the encoded stat names, defined on first use.
//!
//! Stats are process-wide in Envoy, but metric ids are per VM, so each VM defines
//! every name it uses once and caches the id. Workers only add and subtract.

use super::host;
use crate::metrics::{Kind, Metric};
use std::cell::RefCell;
use std::collections::HashMap;

thread_local! {
    static IDS: RefCell<HashMap<String, u32>> = RefCell::new(HashMap::new());
}

fn id(metric: &Metric, values: &[&str]) -> Option<u32> {
    let name = metric.stat_name(values);
    if let Some(id) = IDS.with(|ids| ids.borrow().get(&name).copied()) {
        return Some(id);
    }
    let kind = match metric.kind {
        Kind::Counter => 0,
        Kind::Gauge => 1,
        Kind::Histogram => 2,
    };
    match host::define_metric(kind, &name) {
        Ok(id) => {
            IDS.with(|ids| ids.borrow_mut().insert(name, id));
            Some(id)
        }
        Err(status) => {
            log::warn!("cannot define metric {name}: status {status}");
            None
        }
    }
}

/// Adds `delta` to a counter or gauge.
pub fn add(metric: &Metric, values: &[&str], delta: i64) {
    if let Some(id) = id(metric, values) {
        if let Err(status) = host::increment_metric(id, delta) {
            log::warn!("cannot update metric {}: status {status}", metric.name);
        }
    }
}

/// Records a histogram observation, or sets a gauge (last writer wins across VMs).
pub fn record(metric: &Metric, values: &[&str], value: u64) {
    if let Some(id) = id(metric, values) {
        if let Err(status) = host::record_metric(id, value) {
            log::warn!("cannot record metric {}: status {status}", metric.name);
        }
    }
}

/// Sets a gauge (last writer wins: only the lease holder sets pool gauges).
pub fn set(metric: &Metric, values: &[&str], value: u64) {
    record(metric, values, value);
}

/// Records a histogram observation.
pub fn observe(metric: &Metric, values: &[&str], value: u64) {
    record(metric, values, value);
}
