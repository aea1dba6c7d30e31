//! Exported metrics: this VM's [`Recorder`] and its Envoy stats, and the Prometheus text
//! of every VM's records (`pool.metricsEndpoint`).
//!
//! Every value goes to both. Stats are process-wide in Envoy, but metric ids are per VM,
//! so each VM defines every name it uses once and caches the id. The recorder is
//! published to shared data (one key per VM) at most every [`PUBLISH_MS`], from the tick.
//!
//! Counter and gauge updates reach Envoy summed ([`flush`]: the sum of the increments,
//! or the last value set, one host call per stat that changed) when a request ends and
//! leaves its VM with no other request in hand, and on the tick, instead of one host call
//! per update: a request's running gauges go up and down again with no host call at all,
//! and under load the updates of many requests go in one call per stat (Envoy's stats
//! are then at most one tick behind; exact whenever the VM is idle). Histogram
//! observations are recorded as they happen.

use super::{host, store::HostStore, vm};
use crate::bound;
use crate::endpoint::KeyHasher;
use crate::metrics::exposition;
use crate::metrics::recorder::{Record, Recorder, Slot};
use crate::metrics::{Kind, Metric};
use crate::shared_store::read;
use std::cell::RefCell;
use std::collections::HashMap;

/// How often a VM publishes its record.
pub const PUBLISH_MS: i64 = 500;
/// How often a VM looks for idle series to drop.
const EXPIRY_MS: i64 = 60_000;
/// At most this many VM records are read for one exposition (the newest ids).
const MAX_VMS: u64 = 1_024;

struct Stats {
    recorder: Recorder,
    /// Envoy stat updates not yet made, by stat id ([`flush`]).
    pending: super::vm::IdMap<Pending>,
    ids: HashMap<String, u32>,
    /// Series already resolved, by a hash of (metric, raw label values): the recorder's
    /// slot and the Envoy stat id, found again with no allocation.
    cache: Cache,
    /// Groups of series resolved together ([`group`]), by a hash of (site, key values).
    groups: hashbrown::HashMap<u64, Group, std::hash::BuildHasherDefault<KeyHasher>>,
    /// Bumped whenever slots move (idle series dropped): a [`Series`] from before is stale.
    generation: u64,
    published_ms: i64,
    expired_ms: i64,
}

/// A counter's or gauge's updates since the last [`flush`]: a value set (the last), then
/// the increments after it.
#[derive(Default, Clone, Copy)]
struct Pending {
    set: Option<u64>,
    delta: i64,
}

struct Resolved {
    metric: &'static str,
    values: Vec<String>,
    slot: Slot,
    id: Option<u32>,
}

/// A series resolved once: the recorder's slot and this VM's Envoy stat id, updated later
/// ([`add_to`], [`observe_in`]) with no label hashed or compared. Valid until idle series
/// are dropped ([`expire`] moves slots); an update through a stale one is refused, and the
/// caller updates by labels instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Series {
    generation: u64,
    slot: Slot,
    id: Option<u32>,
}

/// The series of one [`group`] call site for one set of key values.
struct Group {
    site: &'static str,
    key: Vec<String>,
    series: Vec<Series>,
}

/// Resolved series kept at most (client-chosen label values vary without bound; the
/// recorder's caps bound the series, this bounds the cache of raw values).
const CACHE_MAX: usize = 4_096;

thread_local! {
    static STATS: RefCell<Stats> = RefCell::new(Stats {
        recorder: Recorder::default(),
        pending: super::vm::IdMap::default(),
        ids: HashMap::new(),
        cache: Cache::default(),
        groups: hashbrown::HashMap::default(),
        generation: 0,
        published_ms: i64::MIN,
        expired_ms: 0,
    });
}

fn key(vm: u64) -> String {
    format!("epp.v1.metrics.{vm}")
}

/// The cache key of a series: the metric's name by address (a constant's, so the same
/// call site always gives the same one; another address only costs a second entry for
/// the same series), and its raw label values. A cheap multiplicative hash, eight bytes
/// at a time: the cache compares the values of the entry it finds, so a collision only
/// costs a second resolution, and label values are short.
fn hash(metric: &Metric, values: &[&str]) -> u64 {
    hash_values(metric.name.as_ptr() as u64, values)
}

/// [`hash`] of `values` after a 64-bit `start` (an address).
fn hash_values(start: u64, values: &[&str]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mix = |h: u64, word: u64| (h.rotate_left(26) ^ word).wrapping_mul(K);
    let mut h = mix(0, start);
    for v in values {
        let v = v.as_bytes();
        let mut chunks = v.chunks_exact(8);
        for c in &mut chunks {
            h = mix(h, word(c));
        }
        if !chunks.remainder().is_empty() {
            h = mix(h, tail(v));
        }
        // The length ends each value, so ("ab", "c") and ("a", "bc") differ.
        h = mix(h, v.len() as u64);
    }
    h ^ (h >> 29)
}

/// The first eight bytes of `b` as a word (0 if shorter).
fn word(b: &[u8]) -> u64 {
    b.first_chunk::<8>().map_or(0, |w| u64::from_le_bytes(*w))
}

/// A word that, with the length, tells apart every value whose last `len % 8` bytes
/// differ, read without a loop over bytes: the last eight bytes (overlapping the chunk
/// before) when there are eight, else the first and last four, else three of the bytes.
fn tail(v: &[u8]) -> u64 {
    let n = v.len();
    if n >= 8 {
        return v.get(n - 8..).map_or(0, word);
    }
    let four = |b: Option<&[u8]>| {
        b.and_then(|b| b.first_chunk::<4>())
            .map_or(0, |w| u64::from(u32::from_le_bytes(*w)))
    };
    if n >= 4 {
        return four(v.get(..4)) | four(v.get(n - 4..)) << 32;
    }
    let byte = |i: usize| u64::from(v.get(i).copied().unwrap_or(0));
    if n == 0 {
        0
    } else {
        byte(0) | byte(n / 2) << 8 | byte(n - 1) << 16
    }
}

/// Whether two label values are equal, compared a word at a time.
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut pairs = a.chunks_exact(8).zip(b.chunks_exact(8));
    pairs.all(|(x, y)| word(x) == word(y)) && (a.len() % 8 == 0 || tail(a) == tail(b))
}

/// The cache's keys are hashes already: each is its own hash.
type Cache = hashbrown::HashMap<u64, Resolved, std::hash::BuildHasherDefault<KeyHasher>>;

/// Runs `f` with the metrics state, the series' slot in the recorder and this VM's
/// Envoy stat id for the (capped) labels.
fn with(metric: &'static Metric, values: &[&str], f: impl FnOnce(&mut Stats, Slot, Option<u32>)) {
    STATS.with(|cell| {
        let Ok(mut stats) = cell.try_borrow_mut() else {
            log::error!("internal: nested access to the metrics");
            return;
        };
        let stats = &mut *stats;
        let (slot, id) = resolve_in(stats, metric, values);
        f(stats, slot, id);
    });
}

/// The series' slot in the recorder and this VM's Envoy stat id for the (capped) labels:
/// from the cache, else resolved and cached. Label values are bounded first
/// ([`bound::text`]: the proxy bounds a request's client-chosen values once already, so
/// this is a check of at most 128 bytes each).
fn resolve_in(stats: &mut Stats, metric: &'static Metric, values: &[&str]) -> (Slot, Option<u32>) {
    if values
        .iter()
        .any(|v| matches!(bound::text(v), std::borrow::Cow::Owned(_)))
    {
        let owned: Vec<String> = values.iter().map(|v| bound::owned(v)).collect();
        let refs: Vec<&str> = owned.iter().map(String::as_str).collect();
        return resolve_in(stats, metric, &refs);
    }
    let h = hash(metric, values);
    if let Some(r) = stats.cache.get(&h) {
        let hit = std::ptr::eq(r.metric, metric.name)
            && r.values.len() == values.len()
            && r.values.iter().zip(values).all(|(a, b)| same(a, b));
        if hit {
            return (r.slot, r.id);
        }
    }
    {
        let labels = stats.recorder.labels(metric, values);
        let slot = stats.recorder.slot(metric, labels.clone());
        let id = if metric.envoy {
            let envoy = stats.recorder.envoy_labels(metric, &labels);
            envoy_id(stats, metric, &envoy)
        } else {
            None
        };
        if stats.cache.len() >= CACHE_MAX {
            stats.cache.clear();
        }
        stats.cache.insert(
            h,
            Resolved {
                metric: metric.name,
                values: values.iter().map(|v| v.to_string()).collect(),
                slot,
                id,
            },
        );
        (slot, id)
    }
}

/// Series resolved together, found again by one hash and compare of `key` (e.g. every
/// series one routed request updates, keyed by its label values) instead of one per
/// series. `series` names them, only when the group is not cached yet: it calls the
/// resolver it is given with each metric and its label values, `N` times, always the
/// same for one `site` and `key`. `None` when the metrics state is busy (logged) or
/// `series` resolved another number.
pub fn group<const N: usize>(
    site: &'static str,
    key: &[&str],
    series: impl FnOnce(&mut dyn FnMut(&'static Metric, &[&str])),
) -> Option<[Series; N]> {
    STATS.with(|cell| {
        let Ok(mut stats) = cell.try_borrow_mut() else {
            log::error!("internal: nested access to the metrics");
            return None;
        };
        let stats = &mut *stats;
        let mut h = hash_values(site.as_ptr() as u64, key);
        if let Some(g) = stats.groups.get(&h) {
            let hit = std::ptr::eq(g.site, site)
                && g.key.len() == key.len()
                && g.key.iter().zip(key).all(|(a, b)| same(a, b));
            if hit {
                return <[Series; N]>::try_from(g.series.as_slice()).ok();
            }
            // Another key with the same hash: this one is resolved every time.
            h = 0;
        }
        let generation = stats.generation;
        let mut list = Vec::with_capacity(N);
        series(&mut |metric, values| {
            let (slot, id) = resolve_in(stats, metric, values);
            list.push(Series {
                generation,
                slot,
                id,
            });
        });
        let resolved = <[Series; N]>::try_from(list.as_slice()).ok()?;
        if h != 0 {
            if stats.groups.len() >= CACHE_MAX {
                stats.groups.clear();
            }
            stats.groups.insert(
                h,
                Group {
                    site,
                    key: key.iter().map(|v| v.to_string()).collect(),
                    series: list,
                },
            );
        }
        Some(resolved)
    })
}

/// An update of a resolved series.
#[derive(Debug, Clone, Copy)]
pub enum Update {
    /// [`add`] this delta.
    Add(i64),
    /// [`observe`] this value.
    Observe(u64),
}

/// Applies `updates`, each to a resolved series of its metric, in one access to the
/// metrics state. `false`, with nothing done, if a series is stale (idle series were
/// dropped since it was resolved: the caller updates by labels) or the state is busy.
pub fn apply(updates: &[(Series, &'static Metric, Update)]) -> bool {
    STATS.with(|cell| {
        let Ok(mut stats) = cell.try_borrow_mut() else {
            log::error!("internal: nested access to the metrics");
            return false;
        };
        let stats = &mut *stats;
        if updates
            .iter()
            .any(|(s, _, _)| s.generation != stats.generation)
        {
            return false;
        }
        for (s, metric, update) in updates {
            match *update {
                Update::Add(delta) => add_in(stats, s.slot, s.id, metric, delta),
                Update::Observe(value) => observe_at(stats, s.slot, s.id, metric, value),
            }
        }
        true
    })
}

/// This VM's Envoy stat id for the capped labels, defined on first use.
fn envoy_id(stats: &mut Stats, metric: &Metric, labels: &[String]) -> Option<u32> {
    let refs: Vec<&str> = labels.iter().map(String::as_str).collect();
    let name = metric.stat_name(&refs);
    if let Some(id) = stats.ids.get(&name) {
        return Some(*id);
    }
    let kind = match metric.kind {
        Kind::Counter => 0,
        Kind::Gauge | Kind::Level => 1,
        Kind::Histogram => 2,
    };
    match host::define_metric(kind, &name) {
        Ok(id) => {
            stats.ids.insert(name, id);
            Some(id)
        }
        Err(status) => {
            log::warn!("cannot define metric {name}: status {status}");
            None
        }
    }
}

/// Remembers that a server of the pool served these model names, or that the
/// configuration names them ([`Recorder::serve`]): Envoy's stats give them places of their
/// own from now on. Series resolved before are resolved again (the slots handed out stay
/// valid, so a request in flight ends on the series it started on).
pub fn served(names: &[&str]) {
    STATS.with(|cell| {
        let Ok(mut stats) = cell.try_borrow_mut() else {
            return;
        };
        let mut new = false;
        for name in names {
            new |= stats.recorder.serve(&bound::text(name));
        }
        if new {
            stats.cache.clear();
            stats.groups.clear();
        }
    });
}

/// Whether the model name (a bounded label value) is known to be served ([`served`]).
pub fn is_served(name: &str) -> bool {
    STATS.with(|cell| {
        cell.try_borrow()
            .is_ok_and(|stats| stats.recorder.served(name))
    })
}

/// The series of `metric` with these label values, resolved now and kept by the caller,
/// so that a later update lands on the same series even if the label mapping moved in
/// between (e.g. a model name served meanwhile gets a label place of its own): a gauge
/// raised under `other` is lowered under `other`. `None` when the state is busy.
pub fn resolve(metric: &'static Metric, values: &[&str]) -> Option<Series> {
    STATS.with(|cell| {
        let Ok(mut stats) = cell.try_borrow_mut() else {
            log::error!("internal: nested access to the metrics");
            return None;
        };
        let stats = &mut *stats;
        let (slot, id) = resolve_in(stats, metric, values);
        Some(Series {
            generation: stats.generation,
            slot,
            id,
        })
    })
}

/// Adds `delta` (in the metric's recorded unit) to a counter or gauge.
pub fn add(metric: &'static Metric, values: &[&str], delta: i64) {
    with(metric, values, |stats, slot, id| {
        add_in(stats, slot, id, metric, delta);
    });
}

fn add_in(stats: &mut Stats, slot: Slot, id: Option<u32>, metric: &Metric, delta: i64) {
    stats.recorder.add_at(slot, metric, delta);
    if let Some(id) = id {
        let p = stats.pending.entry(id).or_default();
        p.delta = p.delta.saturating_add(delta);
    }
}

/// Records a histogram observation, or sets a gauge, in the metric's recorded unit.
pub fn record(metric: &'static Metric, values: &[&str], value: u64) {
    match metric.kind {
        Kind::Histogram => observe(metric, values, value),
        _ => set_value(metric, values, value as f64 * metric.unit.scale()),
    }
}

/// Sets a gauge, in the metric's recorded unit (only the lease holder sets pool gauges).
pub fn set(metric: &'static Metric, values: &[&str], value: u64) {
    record(metric, values, value);
}

/// Sets a gauge to `value` in the exported unit (a fraction, seconds); Envoy's stat gets
/// it rounded in the recorded unit.
pub fn set_value(metric: &'static Metric, values: &[&str], value: f64) {
    let now = host::clock_ms();
    let scaled = value / metric.unit.scale();
    let raw = if scaled.is_finite() && scaled > 0.0 {
        scaled.round() as u64
    } else {
        0
    };
    with(metric, values, |stats, slot, id| {
        stats.recorder.set_at(slot, value, now);
        if let Some(id) = id {
            stats.pending.insert(
                id,
                Pending {
                    set: Some(raw),
                    delta: 0,
                },
            );
        }
    });
}

/// Records a histogram observation in the metric's recorded unit.
pub fn observe(metric: &'static Metric, values: &[&str], value: u64) {
    with(metric, values, |stats, slot, id| {
        observe_at(stats, slot, id, metric, value);
    });
}

fn observe_at(stats: &mut Stats, slot: Slot, id: Option<u32>, metric: &Metric, value: u64) {
    stats.recorder.observe_at(slot, metric, value);
    if let Some(id) = id {
        if let Err(status) = host::record_metric(id, value) {
            log::warn!("cannot record metric {}: status {status}", metric.name);
        }
    }
}

/// Makes the counter and gauge updates since the last call in Envoy's stats (at a
/// request's end and on the tick): one host call per stat that changed.
pub fn flush() {
    STATS.with(|cell| {
        let Ok(mut stats) = cell.try_borrow_mut() else {
            return;
        };
        // The host calls touch no metrics state: made while it is held, nothing copied.
        for (id, p) in stats.pending.drain() {
            if let Some(value) = p.set {
                if let Err(status) = host::record_metric(id, value) {
                    log::warn!("cannot set metric {id}: status {status}");
                }
            }
            if p.delta != 0 {
                if let Err(status) = host::increment_metric(id, p.delta) {
                    log::warn!("cannot update metric {id}: status {status}");
                }
            }
        }
    });
}

/// Publishes this VM's record if [`PUBLISH_MS`] passed since the last time (or `force`).
pub fn publish(vm: u64, now_ms: i64, force: bool) {
    let bytes = STATS.with(|cell| {
        let mut stats = cell.try_borrow_mut().ok()?;
        if !force && now_ms.saturating_sub(stats.published_ms) < PUBLISH_MS {
            return None;
        }
        stats.published_ms = now_ms;
        Some(prost::Message::encode_to_vec(
            &stats.recorder.record(now_ms),
        ))
    });
    if let Some(bytes) = bytes {
        if let Err(status) = host::set_shared(&key(vm), &bytes, 0) {
            log::warn!("cannot publish this VM's metrics: status {status}");
        }
    }
}

/// The Prometheus text of every VM's metrics, this VM's brought up to date first. The
/// records are read and merged one at a time.
pub fn exposition(vm: u64, now_ms: i64, idle_ms: i64) -> String {
    publish(vm, now_ms, true);
    let mut merger = exposition::Merger::new(now_ms, idle_ms);
    for id in vm_ids(vm) {
        if let Ok(Some(record)) = read::<Record>(&HostStore, &key(id)) {
            merger.add(&record);
        }
    }
    merger.render()
}

/// The ids whose records an exposition reads: the newest [`MAX_VMS`].
fn vm_ids(vm: u64) -> std::ops::RangeInclusive<u64> {
    let last = vm::allocated().max(vm);
    last.saturating_sub(MAX_VMS) + 1..=last
}

/// Drops this VM's series that every VM has left idle (a client-chosen label value gone
/// for `idle_ms` and a grace), at most every [`EXPIRY_MS`]; the other VMs' records are
/// read only when some series is idle here.
pub fn expire(vm: u64, now_ms: i64, idle_ms: i64) {
    let due = STATS.with(|cell| {
        let mut stats = cell.try_borrow_mut().ok()?;
        if now_ms.saturating_sub(stats.expired_ms) < EXPIRY_MS {
            return None;
        }
        stats.expired_ms = now_ms;
        stats.recorder.stamp(now_ms);
        Some(stats.recorder.has_expirable(now_ms, idle_ms))
    });
    if due != Some(true) {
        return;
    }
    let others: Vec<Record> = vm_ids(vm)
        .filter(|id| *id != vm)
        .filter_map(|id| read::<Record>(&HostStore, &key(id)).ok().flatten())
        .collect();
    STATS.with(|cell| {
        let Ok(mut stats) = cell.try_borrow_mut() else {
            return;
        };
        let dropped = stats.recorder.expire(now_ms, idle_ms, &others);
        if dropped > 0 {
            // Slots moved: resolve every series again.
            stats.cache.clear();
            stats.groups.clear();
            stats.generation += 1;
            log::debug!("dropped {dropped} idle metric series");
        }
    });
}
