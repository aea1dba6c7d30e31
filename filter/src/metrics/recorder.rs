//! One VM's metric values, in the reference's units, and the record it publishes.
//!
//! Each VM records into its own [`Recorder`] (no host call, no lock); the proxy layer
//! publishes [`Recorder::record`] to shared data now and then, and the VM answering a
//! metrics scrape merges every VM's record ([`super::exposition`]). Counters and
//! histograms are cumulative since the VM started; gauges are this VM's share (summed
//! over VMs) or, for [`Kind::Level`], a value set at a time (the latest wins).
//!
//! Series whose labels carry a value a client chose (a fairness id, a model name) come
//! and go with the clients: one that nobody has updated for [`IDLE_MS`] leaves the
//! exposition, and a VM drops its copy once it is idle on every VM ([`Recorder::expire`]),
//! which frees its place under [`LABEL_CAP`]. Envoy's own stats are never freed, so the
//! values Envoy gets are capped for the VM's lifetime instead ([`Recorder::envoy_labels`]),
//! and a model name no server has been seen serving ([`Recorder::serve`]) gets one of
//! them only within a small budget of its own ([`ENVOY_UNSERVED_LABEL_CAP`]): requests
//! naming models that do not exist cannot use up the places of models deployed later.

use super::{Kind, Metric};
use prost::Message;
use std::collections::{BTreeSet, HashMap, HashSet};

/// Distinct values a VM reports at a time per client-chosen label family before the rest
/// are reported as [`OTHER`]: `model_name` and `target_model_name` share one cap,
/// `fairness_id` has its own (the llm-d router's caps). Also the lifetime cap of the
/// values Envoy's own counters and gauges get.
pub const LABEL_CAP: usize = 1_000;
/// A series with a client-chosen label value that no VM has updated for this long is
/// left out of the exposition, by default (ms; `pool.metricsEndpoint.idleSeriesSeconds`).
pub const IDLE_MS: i64 = 10 * 60_000;
/// How much longer than the idle time a VM keeps an idle series before dropping it, so that
/// every VM's copy has left the exposition first (ms).
pub const EXPIRY_GRACE_MS: i64 = 60_000;
/// The value reported for a client-chosen label beyond [`LABEL_CAP`].
pub const OTHER: &str = "other";
/// Distinct client-chosen values a VM gives Envoy's own histograms per family in its
/// lifetime; beyond it, [`OTHER`]. Envoy never frees a stat and a histogram costs it far
/// more memory than a counter (its buckets, per worker), so a flood of tenants or model
/// names would grow Envoy without this; the filter's own endpoint keeps [`LABEL_CAP`].
pub const ENVOY_HISTOGRAM_LABEL_CAP: usize = 32;
/// Of [`LABEL_CAP`], the model names a VM gives Envoy's counters and gauges in its
/// lifetime that no server has answered since ([`Recorder::serve`]); beyond it a name not
/// served is [`OTHER`] in Envoy's stats (until it is served), so junk names (answered 404
/// by every server) can take at most this many of Envoy's places for good.
pub const ENVOY_UNSERVED_LABEL_CAP: usize = 100;
/// The same as [`ENVOY_UNSERVED_LABEL_CAP`] for Envoy's histograms (of
/// [`ENVOY_HISTOGRAM_LABEL_CAP`]).
pub const ENVOY_UNSERVED_HISTOGRAM_LABEL_CAP: usize = 4;
/// Of [`LABEL_CAP`], the places a VM keeps at a time for model names a server has served
/// ([`Recorder::serve`]): names no server served hold at most the rest.
pub const SERVED_RESERVE: usize = 100;
/// Served model names a VM remembers ([`Recorder::serve`]).
pub const SERVED_CAP: usize = LABEL_CAP;

/// The label families whose values come from clients, by label name: `model_name` and
/// `target_model_name` (0), `fairness_id` (1).
pub fn family(label: &str) -> Option<usize> {
    match label {
        "model_name" | "target_model_name" | "target_model" => Some(0),
        "fairness_id" => Some(1),
        _ => None,
    }
}

/// Whether a series of `metric` with these label values carries a value a client chose
/// (not empty, not [`OTHER`]): such series expire when idle.
pub fn client_chosen(metric: &Metric, values: &[String]) -> bool {
    metric
        .labels
        .iter()
        .zip(values)
        .any(|(label, value)| family(label).is_some() && !value.is_empty() && value != OTHER)
}

/// The value of one series.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A counter, or this VM's share of a gauge.
    Sum(f64),
    /// A gauge set at `at_ms`.
    Level {
        /// The value.
        value: f64,
        /// When it was set (ms since the epoch).
        at_ms: i64,
    },
    /// Observations: non-cumulative counts per bucket (one more than the bounds: the
    /// last is above every bound), their sum and count.
    Histogram {
        /// Counts per bucket.
        counts: Vec<u64>,
        /// Sum of the observations.
        sum: f64,
    },
}

/// One VM's metric values.
#[derive(Debug, Default)]
pub struct Recorder {
    /// Every series, in the order first recorded; [`Slot`]s index it.
    series: Vec<Series>,
    index: HashMap<(&'static str, Vec<String>), usize>,
    /// Client-chosen values held now, per family.
    seen: [BTreeSet<String>; 2],
    /// Client-chosen values given to Envoy's stats in this VM's lifetime: counters and
    /// gauges, histograms; per family.
    envoy_seen: [[BTreeSet<String>; 2]; 2],
    /// Of `envoy_seen`'s model names, how many were given before they were served:
    /// counters and gauges, histograms.
    envoy_unserved: [usize; 2],
    /// Model names a server answered successfully, or that the configuration names.
    served: HashSet<String>,
    /// Of `seen`'s model names, how many are not served.
    seen_unserved: usize,
}

#[derive(Debug)]
struct Series {
    metric: &'static Metric,
    labels: Vec<String>,
    value: Value,
    /// Whether a label value was chosen by a client ([`client_chosen`]).
    client: bool,
    /// Updated since the last [`Recorder::record`].
    touched: bool,
    /// The last [`Recorder::record`] that found it touched (ms since the epoch).
    updated_ms: i64,
}

impl Series {
    /// Whether it still holds something only this VM knows is pending: a gauge share
    /// that is not back to zero.
    fn pending(&self) -> bool {
        matches!(self.metric.kind, Kind::Gauge) && matches!(self.value, Value::Sum(v) if v != 0.0)
    }
}

/// Where one series lives in a [`Recorder`]: a caller that keeps it updates the series
/// with no lookup and no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot(usize);

impl Recorder {
    /// The label values to record under: a client-chosen value beyond the cap of its
    /// family becomes [`OTHER`]. Missing values are empty.
    pub fn labels(&mut self, metric: &Metric, values: &[&str]) -> Vec<String> {
        let served = &self.served;
        let unserved = &mut self.seen_unserved;
        metric
            .labels
            .iter()
            .enumerate()
            .map(|(i, label)| {
                let value = values.get(i).copied().unwrap_or("");
                let f = family(label);
                match f.and_then(|f| self.seen.get_mut(f)) {
                    Some(seen) if !value.is_empty() && !seen.contains(value) => {
                        let model = f == Some(0) && !served.contains(value);
                        if seen.len() >= LABEL_CAP
                            || (model && *unserved >= LABEL_CAP - SERVED_RESERVE)
                        {
                            return OTHER.to_string();
                        }
                        *unserved += usize::from(model);
                        seen.insert(value.to_string());
                        value.to_string()
                    }
                    _ => value.to_string(),
                }
            })
            .collect()
    }

    /// The label values for Envoy's own stat of `metric`, from [`Recorder::labels`]'s:
    /// client-chosen values beyond a lifetime cap per family become [`OTHER`]
    /// ([`ENVOY_HISTOGRAM_LABEL_CAP`] for histograms, [`LABEL_CAP`] for the others), since
    /// Envoy keeps every stat it was given until it exits.
    ///
    /// A model name (family 0) that is not [served](Recorder::serve) takes a new place only
    /// within [`ENVOY_UNSERVED_LABEL_CAP`] ([`ENVOY_UNSERVED_HISTOGRAM_LABEL_CAP`]) such
    /// names in the VM's lifetime.
    pub fn envoy_labels(&mut self, metric: &Metric, labels: &[String]) -> Vec<String> {
        let (kind, cap, unserved_cap) = match metric.kind {
            Kind::Histogram => (
                1,
                ENVOY_HISTOGRAM_LABEL_CAP,
                ENVOY_UNSERVED_HISTOGRAM_LABEL_CAP,
            ),
            _ => (0, LABEL_CAP, ENVOY_UNSERVED_LABEL_CAP),
        };
        let served = &self.served;
        let mut unserved = self.envoy_unserved.get_mut(kind);
        metric
            .labels
            .iter()
            .zip(labels)
            .map(|(label, value)| {
                let f = family(label);
                let Some(seen) =
                    f.and_then(|f| self.envoy_seen.get_mut(kind).and_then(|k| k.get_mut(f)))
                else {
                    return value.clone();
                };
                if value.is_empty() || value == OTHER || seen.contains(value.as_str()) {
                    return value.clone();
                }
                if seen.len() >= cap {
                    return OTHER.to_string();
                }
                if f == Some(0) && !served.contains(value.as_str()) {
                    match unserved.as_deref_mut() {
                        Some(n) if *n < unserved_cap => *n += 1,
                        _ => return OTHER.to_string(),
                    }
                }
                seen.insert(value.clone());
                value.clone()
            })
            .collect()
    }

    /// Remembers that a server served the model `name` (a label value, already bounded),
    /// or that the configuration names it: from now on Envoy's stats may give it a place
    /// of its own ([`Recorder::envoy_labels`]). `true` if it was not known before (label
    /// values resolved earlier should then be resolved again). At most [`SERVED_CAP`]
    /// names are remembered.
    pub fn serve(&mut self, name: &str) -> bool {
        if name.is_empty() || name == OTHER || self.served.contains(name) {
            return false;
        }
        if self.served.len() >= SERVED_CAP {
            return false;
        }
        // A name that took a place while unserved no longer counts against their budgets.
        if self.seen.first().is_some_and(|s| s.contains(name)) {
            self.seen_unserved = self.seen_unserved.saturating_sub(1);
        }
        for (kind, n) in self.envoy_unserved.iter_mut().enumerate() {
            let held = self.envoy_seen.get(kind).and_then(|k| k.first());
            if held.is_some_and(|s| s.contains(name)) {
                *n = n.saturating_sub(1);
            }
        }
        self.served.insert(name.to_string())
    }

    /// Whether `name` is known to be served ([`Recorder::serve`]).
    pub fn served(&self, name: &str) -> bool {
        self.served.contains(name)
    }

    /// The series of `metric` with these (capped) label values, created empty if new.
    pub fn slot(&mut self, metric: &'static Metric, labels: Vec<String>) -> Slot {
        let key = (metric.name, labels);
        if let Some(i) = self.index.get(&key) {
            return Slot(*i);
        }
        let empty = match metric.kind {
            Kind::Counter | Kind::Gauge => Value::Sum(0.0),
            Kind::Level => Value::Level {
                value: 0.0,
                at_ms: 0,
            },
            Kind::Histogram => Value::Histogram {
                counts: vec![0; metric.buckets.len() + 1],
                sum: 0.0,
            },
        };
        let i = self.series.len();
        self.series.push(Series {
            metric,
            labels: key.1.clone(),
            value: empty,
            client: client_chosen(metric, &key.1),
            touched: true,
            updated_ms: 0,
        });
        self.index.insert(key, i);
        Slot(i)
    }

    fn value(&mut self, slot: Slot) -> Option<&mut Value> {
        self.series.get_mut(slot.0).map(|s| {
            s.touched = true;
            &mut s.value
        })
    }

    /// Adds `raw` (in the metric's recorded unit) to a counter or gauge.
    pub fn add_at(&mut self, slot: Slot, metric: &Metric, raw: i64) {
        if let Some(Value::Sum(v)) = self.value(slot) {
            *v += raw as f64 * metric.unit.scale();
        }
    }

    /// Sets a gauge to `value` (in the exported unit) at `at_ms`.
    pub fn set_at(&mut self, slot: Slot, value: f64, at_ms: i64) {
        if let Some(v @ Value::Level { .. }) = self.value(slot) {
            *v = Value::Level { value, at_ms };
        }
    }

    /// Records one histogram observation of `raw` (in the metric's recorded unit).
    pub fn observe_at(&mut self, slot: Slot, metric: &Metric, raw: u64) {
        let value = raw as f64 * metric.unit.scale();
        let bucket = metric
            .buckets
            .iter()
            .position(|bound| value <= *bound)
            .unwrap_or(metric.buckets.len());
        if let Some(Value::Histogram { counts, sum }) = self.value(slot) {
            if let Some(c) = counts.get_mut(bucket) {
                *c += 1;
            }
            *sum += value;
        }
    }

    /// Adds `raw` to a counter or gauge, by labels.
    pub fn add(&mut self, metric: &'static Metric, labels: Vec<String>, raw: i64) {
        let slot = self.slot(metric, labels);
        self.add_at(slot, metric, raw);
    }

    /// Sets a gauge, by labels.
    pub fn set(&mut self, metric: &'static Metric, labels: Vec<String>, value: f64, at_ms: i64) {
        let slot = self.slot(metric, labels);
        self.set_at(slot, value, at_ms);
    }

    /// Records one histogram observation, by labels.
    pub fn observe(&mut self, metric: &'static Metric, labels: Vec<String>, raw: u64) {
        let slot = self.slot(metric, labels);
        self.observe_at(slot, metric, raw);
    }

    /// Series held (for tests and the bound documentation).
    pub fn len(&self) -> usize {
        self.series.len()
    }

    /// Whether nothing was recorded yet.
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }

    /// The record this VM publishes, stamped `now_ms`: series updated since the last
    /// record, and gauge shares not back to zero, count as updated now.
    pub fn record(&mut self, now_ms: i64) -> Record {
        self.stamp(now_ms);
        Record {
            updated_ms: now_ms,
            series: self
                .series
                .iter()
                .map(|series| {
                    let mut s = WireSeries {
                        metric: series.metric.name.to_string(),
                        labels: series.labels.clone(),
                        updated_ms: series.updated_ms,
                        ..WireSeries::default()
                    };
                    match &series.value {
                        Value::Sum(v) => s.value = *v,
                        Value::Level { value, at_ms } => {
                            s.value = *value;
                            s.set_at_ms = *at_ms;
                        }
                        Value::Histogram { counts, sum } => {
                            s.value = *sum;
                            s.counts = counts.clone();
                        }
                    }
                    s
                })
                .collect(),
        }
    }

    /// Marks the series updated since the last stamp, and the gauge shares not back to
    /// zero, as updated at `now_ms`.
    pub fn stamp(&mut self, now_ms: i64) {
        for s in &mut self.series {
            if s.touched || s.pending() {
                s.updated_ms = now_ms;
                s.touched = false;
            }
        }
    }

    /// Whether some series is idle here long enough to be dropped if it is idle on every
    /// VM (then [`Recorder::expire`] needs the other VMs' records).
    pub fn has_expirable(&self, now_ms: i64, idle_ms: i64) -> bool {
        self.series.iter().any(|s| expirable(s, now_ms, idle_ms))
    }

    /// Drops the series with a client-chosen label value that were idle for `idle_ms` +
    /// [`EXPIRY_GRACE_MS`] here and in every record of `others` (the other VMs'), freeing
    /// their places under [`LABEL_CAP`]. Returns how many were dropped; the [`Slot`]s
    /// handed out before are then invalid.
    pub fn expire(&mut self, now_ms: i64, idle_ms: i64, others: &[Record]) -> usize {
        let since = now_ms.saturating_sub(idle_ms + EXPIRY_GRACE_MS);
        let mut idle: HashSet<(&str, &[String])> = self
            .series
            .iter()
            .filter(|s| expirable(s, now_ms, idle_ms))
            .map(|s| (s.metric.name, s.labels.as_slice()))
            .collect();
        if idle.is_empty() {
            return 0;
        }
        for record in others {
            for s in &record.series {
                if series_updated_ms(record, s) > since {
                    idle.remove(&(s.metric.as_str(), s.labels.as_slice()));
                }
            }
        }
        if idle.is_empty() {
            return 0;
        }
        let drop: Vec<bool> = self
            .series
            .iter()
            .map(|s| idle.contains(&(s.metric.name, s.labels.as_slice())))
            .collect();
        let before = self.series.len();
        let mut flags = drop.into_iter();
        self.series.retain(|_| !flags.next().unwrap_or(false));
        self.index = self
            .series
            .iter()
            .enumerate()
            .map(|(i, s)| ((s.metric.name, s.labels.clone()), i))
            .collect();
        self.seen = Default::default();
        for s in &self.series {
            for (label, value) in s.metric.labels.iter().zip(&s.labels) {
                if let Some(seen) = family(label).and_then(|f| self.seen.get_mut(f)) {
                    if !value.is_empty() && value != OTHER {
                        seen.insert(value.clone());
                    }
                }
            }
        }
        self.seen_unserved = self.seen.first().map_or(0, |s| {
            s.iter().filter(|v| !self.served.contains(*v)).count()
        });
        before - self.series.len()
    }
}

/// Whether `s` may be dropped as of `now_ms` as far as this VM knows.
fn expirable(s: &Series, now_ms: i64, idle_ms: i64) -> bool {
    s.client
        && !s.touched
        && !s.pending()
        && s.updated_ms <= now_ms.saturating_sub(idle_ms + EXPIRY_GRACE_MS)
}

/// When a series of `record` was last updated; a record from a build that did not stamp
/// series counts its series as updated when it was written.
pub fn series_updated_ms(record: &Record, series: &WireSeries) -> i64 {
    if series.updated_ms > 0 {
        series.updated_ms
    } else {
        record.updated_ms
    }
}

/// What one VM publishes: every series it holds, and when it wrote this.
#[derive(Clone, PartialEq, Message)]
pub struct Record {
    /// When the VM wrote the record (ms since the epoch): a VM that stopped writing is gone,
    /// and its gauges no longer count.
    #[prost(int64, tag = "1")]
    pub updated_ms: i64,
    /// The series.
    #[prost(message, repeated, tag = "2")]
    pub series: Vec<WireSeries>,
}

/// One series of a [`Record`].
#[derive(Clone, PartialEq, Message)]
pub struct WireSeries {
    /// The metric's name ([`Metric::name`]).
    #[prost(string, tag = "1")]
    pub metric: String,
    /// Label values, in the metric's label order.
    #[prost(string, repeated, tag = "2")]
    pub labels: Vec<String>,
    /// A counter's or gauge's value, a histogram's sum.
    #[prost(double, tag = "3")]
    pub value: f64,
    /// A histogram's non-cumulative bucket counts.
    #[prost(uint64, repeated, tag = "4")]
    pub counts: Vec<u64>,
    /// When a [`Kind::Level`] gauge was set (0 for the others).
    #[prost(int64, tag = "5")]
    pub set_at_ms: i64,
    /// When the VM last found it updated (ms since the epoch; 0 from older builds).
    #[prost(int64, tag = "6")]
    pub updated_ms: i64,
}

impl WireSeries {
    /// Reads it back as a [`Value`] of `metric`'s kind.
    pub fn value(&self, metric: &Metric) -> Value {
        match metric.kind {
            Kind::Counter | Kind::Gauge => Value::Sum(self.value),
            Kind::Level => Value::Level {
                value: self.value,
                at_ms: self.set_at_ms,
            },
            Kind::Histogram => Value::Histogram {
                counts: self.counts.clone(),
                sum: self.value,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{
        FLOW_ENQUEUE_DURATION, FLOW_QUEUE_SIZE, OBJECTIVE_REQUEST_TOTAL,
        OBJECTIVE_RUNNING_REQUESTS, POOL_AVERAGE_KV, SCHEDULER_E2E_DURATION,
    };
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn values_are_kept_in_the_reference_units() {
        let mut r = Recorder::default();
        let l = r.labels(&SCHEDULER_E2E_DURATION, &[]);
        r.observe(&SCHEDULER_E2E_DURATION, l.clone(), 150); // 150 µs
        r.observe(&SCHEDULER_E2E_DURATION, l.clone(), 1_000_000); // 1 s: above every bound
        let rec = r.record(5);
        let s = &rec.series[0];
        assert_eq!(s.metric, SCHEDULER_E2E_DURATION.name);
        assert!((s.value - 1.000150).abs() < 1e-9);
        let le_200us = SCHEDULER_E2E_DURATION
            .buckets
            .iter()
            .position(|b| *b == 0.0002)
            .unwrap();
        assert_eq!(s.counts[le_200us], 1);
        assert_eq!(*s.counts.last().unwrap(), 1);
        assert_eq!(s.counts.iter().sum::<u64>(), 2);

        let l = r.labels(&POOL_AVERAGE_KV, &["pool"]);
        r.set(&POOL_AVERAGE_KV, l, 0.4321, 7);
        let rec = r.record(8);
        let kv = rec.series.iter().find(|s| s.metric == POOL_AVERAGE_KV.name);
        assert_eq!(kv.map(|s| (s.value, s.set_at_ms)), Some((0.4321, 7)));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn gauges_go_up_and_down() {
        let mut r = Recorder::default();
        let l = r.labels(&OBJECTIVE_RUNNING_REQUESTS, &["m"]);
        r.add(&OBJECTIVE_RUNNING_REQUESTS, l.clone(), 1);
        r.add(&OBJECTIVE_RUNNING_REQUESTS, l.clone(), 1);
        r.add(&OBJECTIVE_RUNNING_REQUESTS, l, -1);
        assert_eq!(r.record(0).series[0].value, 1.0);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn client_chosen_label_values_are_capped() {
        let mut r = Recorder::default();
        for i in 0..(LABEL_CAP + 500) {
            let id = format!("tenant-{i}");
            let l = r.labels(&FLOW_QUEUE_SIZE, &[&id, "0", "pool", "m", "m"]);
            r.add(&FLOW_QUEUE_SIZE, l, 1);
        }
        // The model name used the family's first slot; fairness ids have their own cap.
        assert_eq!(r.len(), LABEL_CAP + 1);
        let rec = r.record(0);
        let other = rec.series.iter().find(|s| s.labels[0] == OTHER).unwrap();
        assert_eq!(other.value, 500.0);
        // A value seen before the cap keeps its own series; pool names are never capped.
        let l = r.labels(
            &FLOW_QUEUE_SIZE,
            &["tenant-3", "0", "another-pool", "m", "m"],
        );
        assert_eq!(l, ["tenant-3", "0", "another-pool", "m", "m"]);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn envoy_histograms_get_fewer_client_chosen_values_than_the_endpoint() {
        let mut r = Recorder::default();
        let mut envoy = BTreeSet::new();
        let mut endpoint = BTreeSet::new();
        for i in 0..200 {
            let id = format!("tenant-{i}");
            let l = r.labels(&FLOW_ENQUEUE_DURATION, &[&id, "0", "Dispatched"]);
            endpoint.insert(l[0].clone());
            envoy.insert(r.envoy_labels(&FLOW_ENQUEUE_DURATION, &l)[0].clone());
            // Gauges and counters keep the endpoint's values in Envoy too.
            let g = r.labels(&FLOW_QUEUE_SIZE, &[&id, "0", "pool", "m", "m"]);
            assert_eq!(r.envoy_labels(&FLOW_QUEUE_SIZE, &g), g);
        }
        assert_eq!(endpoint.len(), 200);
        assert_eq!(envoy.len(), ENVOY_HISTOGRAM_LABEL_CAP + 1);
        assert!(envoy.contains(OTHER));
        // A value admitted early keeps its own histogram; labels that clients do not
        // choose are never capped.
        let l = r.labels(&FLOW_ENQUEUE_DURATION, &["tenant-5", "0", "EvictedTTL"]);
        assert_eq!(r.envoy_labels(&FLOW_ENQUEUE_DURATION, &l), l);
    }

    const GONE: i64 = IDLE_MS + EXPIRY_GRACE_MS + 1;

    /// Counts a request of the served model `tenant`.
    fn count(r: &mut Recorder, tenant: &str) {
        r.serve(tenant);
        let l = r.labels(&OBJECTIVE_REQUEST_TOTAL, &[tenant, ""]);
        r.add(&OBJECTIVE_REQUEST_TOTAL, l, 1);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn idle_tenants_are_dropped_and_free_their_place_under_the_cap() {
        let mut r = Recorder::default();
        for i in 0..LABEL_CAP {
            count(&mut r, &format!("tenant-{i}"));
        }
        let l = r.labels(&SCHEDULER_E2E_DURATION, &[]);
        r.observe(&SCHEDULER_E2E_DURATION, l, 100);
        r.record(1_000);
        // Full: the next new tenant is `other`.
        assert_eq!(r.labels(&OBJECTIVE_REQUEST_TOTAL, &["late", ""])[0], OTHER);

        // Not idle long enough yet: nothing goes.
        assert!(!r.has_expirable(1_000 + IDLE_MS, IDLE_MS));
        assert_eq!(r.expire(1_000 + IDLE_MS, IDLE_MS, &[]), 0);
        // One tenant came back in the meantime: it stays; the others go, and so does
        // nothing that a client did not choose.
        count(&mut r, "tenant-7");
        r.record(1_000 + IDLE_MS);
        assert!(r.has_expirable(1_000 + GONE, IDLE_MS));
        assert_eq!(r.expire(1_000 + GONE, IDLE_MS, &[]), LABEL_CAP - 1);
        let rec = r.record(1_000 + GONE);
        let names: Vec<&str> = rec.series.iter().map(|s| s.metric.as_str()).collect();
        assert_eq!(
            names,
            [OBJECTIVE_REQUEST_TOTAL.name, SCHEDULER_E2E_DURATION.name]
        );
        assert_eq!(rec.series[0].labels[0], "tenant-7");
        // Their places are free again, and the kept series still counts where it was.
        assert_eq!(r.labels(&OBJECTIVE_REQUEST_TOTAL, &["late", ""])[0], "late");
        count(&mut r, "tenant-7");
        assert_eq!(r.record(1_000 + GONE).series[0].value, 3.0);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_series_another_vm_still_updates_is_kept() {
        let mut here = Recorder::default();
        count(&mut here, "shared");
        count(&mut here, "only-here");
        here.record(0);
        let mut there = Recorder::default();
        count(&mut there, "shared");
        let theirs = there.record(GONE - 10);
        // Dropping ours while the other VM still counts would make the merged counter
        // go down (a false reset to Prometheus).
        assert_eq!(here.expire(GONE, IDLE_MS, &[theirs]), 1);
        let kept = here.record(GONE);
        assert_eq!(kept.series.len(), 1);
        assert_eq!(kept.series[0].labels[0], "shared");
        // A record from a build without series stamps counts as updated when written.
        let mut old = there.record(GONE - 10);
        old.series[0].updated_ms = 0;
        assert_eq!(here.expire(GONE, IDLE_MS, &[old]), 0);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_gauge_share_not_back_to_zero_is_never_dropped() {
        let mut r = Recorder::default();
        let queued = r.labels(&FLOW_QUEUE_SIZE, &["t", "0", "pool", "m", "m"]);
        r.add(&FLOW_QUEUE_SIZE, queued.clone(), 1);
        r.record(0);
        assert_eq!(r.expire(GONE, IDLE_MS, &[]), 0);
        assert_eq!(r.expire(10 * GONE, IDLE_MS, &[]), 0);
        r.add(&FLOW_QUEUE_SIZE, queued, -1);
        r.record(10 * GONE);
        assert_eq!(r.expire(10 * GONE + GONE, IDLE_MS, &[]), 1);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn envoy_keeps_its_lifetime_cap_when_the_recorder_frees_places() {
        let mut r = Recorder::default();
        for i in 0..LABEL_CAP {
            count(&mut r, &format!("tenant-{i}"));
            r.serve(&format!("tenant-{i}"));
            let l = r.labels(&OBJECTIVE_REQUEST_TOTAL, &[&format!("tenant-{i}"), ""]);
            assert_eq!(r.envoy_labels(&OBJECTIVE_REQUEST_TOTAL, &l), l);
        }
        r.record(0);
        assert_eq!(r.expire(GONE, IDLE_MS, &[]), LABEL_CAP);
        let l = r.labels(&OBJECTIVE_REQUEST_TOTAL, &["new", ""]);
        assert_eq!(l[0], "new");
        // Envoy never frees a stat: a new value after the cap goes to `other` there.
        assert_eq!(r.envoy_labels(&OBJECTIVE_REQUEST_TOTAL, &l)[0], OTHER);
        // One Envoy already has keeps its own stat.
        let l = r.labels(&OBJECTIVE_REQUEST_TOTAL, &["tenant-3", ""]);
        assert_eq!(r.envoy_labels(&OBJECTIVE_REQUEST_TOTAL, &l)[0], "tenant-3");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn model_names_no_server_served_take_few_of_envoys_places() {
        let mut r = Recorder::default();
        let envoy = |r: &mut Recorder, model: &str| {
            let l = r.labels(&OBJECTIVE_REQUEST_TOTAL, &[model, model]);
            (l.clone(), r.envoy_labels(&OBJECTIVE_REQUEST_TOTAL, &l))
        };
        // 5,000 names no server serves: the first ENVOY_UNSERVED_LABEL_CAP get a stat
        // (a model's first request comes before its first answer), the rest `other`; the
        // endpoint keeps SERVED_RESERVE places free of them.
        let (mut own, mut listed) = (0, 0);
        for i in 0..5_000 {
            let (l, e) = envoy(&mut r, &format!("junk-{i}"));
            assert_eq!(e[0], e[1], "both labels of one request decided alike");
            own += usize::from(e[0] != OTHER);
            listed += usize::from(l[0] != OTHER);
        }
        assert_eq!(own, ENVOY_UNSERVED_LABEL_CAP);
        assert_eq!(listed, LABEL_CAP - SERVED_RESERVE);
        // A model deployed afterwards: `other` until a server answered it, then its own
        // series in both.
        assert_eq!(envoy(&mut r, "real").1[0], OTHER);
        assert!(r.serve("real"));
        assert!(!r.serve("real"), "once");
        assert_eq!(envoy(&mut r, "real").1, vec!["real", "real"]);
        // Served names fill the endpoint's reserve and every place Envoy has left.
        for i in 0..SERVED_RESERVE - 1 {
            let name = format!("model-{i}");
            r.serve(&name);
            assert_eq!(envoy(&mut r, &name).1[0], name);
        }
        // A junk name that got a stat keeps it (Envoy never frees one).
        assert_eq!(envoy(&mut r, "junk-3").1[0], "junk-3");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_name_served_after_it_took_a_place_no_longer_counts_as_junk() {
        let mut r = Recorder::default();
        let envoy = |r: &mut Recorder, model: &str| {
            let l = r.labels(&OBJECTIVE_REQUEST_TOTAL, &[model, ""]);
            r.envoy_labels(&OBJECTIVE_REQUEST_TOTAL, &l)[0].clone()
        };
        // New models, each answered after its first request: none uses up the budget.
        for i in 0..3 * ENVOY_UNSERVED_LABEL_CAP {
            let name = format!("model-{i}");
            assert_eq!(envoy(&mut r, &name), name);
            r.serve(&name);
        }
        // Envoy's lifetime cap holds for served names too.
        let mut r = Recorder::default();
        for i in 0..LABEL_CAP {
            let name = format!("m-{i}");
            r.serve(&name);
            assert_eq!(envoy(&mut r, &name), name);
            count(&mut r, &name);
        }
        r.record(0);
        r.expire(GONE, IDLE_MS, &[]);
        r.serve("late");
        assert_eq!(envoy(&mut r, "late"), OTHER);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn served_names_are_bounded_and_never_other() {
        let mut r = Recorder::default();
        assert!(!r.serve(""));
        assert!(!r.serve(OTHER));
        for i in 0..SERVED_CAP + 10 {
            r.serve(&format!("m-{i}"));
        }
        assert!(r.served("m-0"));
        assert!(!r.served(&format!("m-{}", SERVED_CAP + 5)));
    }
}
