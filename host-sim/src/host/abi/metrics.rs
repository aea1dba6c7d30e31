//! The metric imports: process-wide stats by name (`wasmcustom.<name>`), per-VM ids.
//! Counters refuse negative increments; gauges are unsigned (a decrement below zero
//! wraps, as in Envoy); histograms keep every sample.

use super::memory::{arg, arg64, read_str, write, write_u32, C};
use super::status::{BAD_ARGUMENT, NOT_FOUND, OK};
use crate::host::lock;
use crate::host::shared::{MetricKind, Stat};
use anyhow::Result;
use wasmtime::Val;

/// `proxy_define_metric(type, name, name_size, out_id)`.
pub fn define(c: C, p: &[Val]) -> Result<u32> {
    let kind = match arg(p, 0) {
        0 => MetricKind::Counter,
        1 => MetricKind::Gauge,
        2 => MetricKind::Histogram,
        _ => return Ok(BAD_ARGUMENT),
    };
    let name = read_str(c, arg(p, 1), arg(p, 2))?;
    let full = format!("wasmcustom.{name}");
    let id = {
        let h = c.data_mut();
        lock(&h.shared).define_stat(&full, kind);
        h.new_metric_id(kind, full)
    };
    write_u32(c, arg(p, 3), id)?;
    Ok(OK)
}

/// Runs `update` on the stat with the metric id of argument 0, given its kind and the
/// value of argument 1.
fn update(c: C, p: &[Val], apply: impl FnOnce(&mut Stat, MetricKind, i64) -> u32) -> u32 {
    let (id, v) = (arg(p, 0), arg64(p, 1));
    let h = c.data();
    let Some((name, kind)) = h.metric_ids.get(&id) else {
        return NOT_FOUND;
    };
    let mut shared = lock(&h.shared);
    let Some(stat) = shared.stat_mut(name) else {
        return NOT_FOUND;
    };
    apply(stat, *kind, v)
}

/// `proxy_increment_metric(id, offset)`: counters and gauges.
pub fn increment(c: C, p: &[Val]) -> Result<u32> {
    Ok(update(c, p, |stat, kind, v| match kind {
        MetricKind::Counter if v > 0 => {
            stat.value = stat.value.wrapping_add(v as u64);
            OK
        }
        MetricKind::Gauge => {
            stat.value = stat.value.wrapping_add(v as u64);
            OK
        }
        _ => BAD_ARGUMENT,
    }))
}

/// `proxy_record_metric(id, value)`: a counter adds it, a gauge takes it, a histogram
/// keeps it as a sample.
pub fn record(c: C, p: &[Val]) -> Result<u32> {
    Ok(update(c, p, |stat, kind, v| {
        match kind {
            MetricKind::Counter => stat.value = stat.value.wrapping_add(v as u64),
            MetricKind::Gauge => stat.value = v as u64,
            MetricKind::Histogram => stat.samples.push(v as u64),
        }
        OK
    }))
}

/// `proxy_get_metric(id, out_value)`: counters and gauges.
pub fn get(c: C, p: &[Val]) -> Result<u32> {
    let id = arg(p, 0);
    let value = {
        let h = c.data();
        let Some((name, kind)) = h.metric_ids.get(&id) else {
            return Ok(NOT_FOUND);
        };
        if *kind == MetricKind::Histogram {
            return Ok(BAD_ARGUMENT);
        }
        lock(&h.shared).stats.get(name).map_or(0, |s| s.value)
    };
    write(c, arg(p, 1), &value.to_le_bytes())?;
    Ok(OK)
}
