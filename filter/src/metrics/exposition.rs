//! The Prometheus text exposition of every VM's records, merged.
//!
//! Counters and histograms add up over every record (a VM that is gone still counted what
//! it counted); gauge shares add up over the records written within [`LIVE_MS`] (a crashed
//! VM's share of `running_requests` must not stay forever); a [`Kind::Level`] gauge takes
//! the value set last, from a live record.

use super::recorder::{
    self, client_chosen, series_updated_ms, Record, Value, IDLE_MS, LABEL_CAP, OTHER,
};
use super::{Kind, Metric, ALL};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write;

/// A record older than this is from a VM that stopped (VMs write theirs every second).
pub const LIVE_MS: i64 = 10_000;

/// The `Content-Type` of [`render`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Merges `records` as of `now_ms` and writes the exposition, with the default idle time.
pub fn render(records: &[Record], now_ms: i64) -> String {
    let mut merger = Merger::new(now_ms, IDLE_MS);
    for record in records {
        merger.add(record);
    }
    merger.render()
}

/// Every VM's records merged one at a time, so that only one decoded record is held
/// besides the merged series while answering a scrape.
pub struct Merger {
    now_ms: i64,
    idle_ms: i64,
    /// Per metric, per label values: the merged value and the latest update of any copy.
    merged: BTreeMap<&'static str, BTreeMap<Vec<String>, (Value, i64)>>,
}

impl Merger {
    /// An empty merge as of `now_ms`, leaving out client-labelled series idle for
    /// `idle_ms`.
    pub fn new(now_ms: i64, idle_ms: i64) -> Self {
        Self {
            now_ms,
            idle_ms,
            merged: BTreeMap::new(),
        }
    }

    /// Adds one VM's record.
    pub fn add(&mut self, record: &Record) {
        let live = self.now_ms.saturating_sub(record.updated_ms) <= LIVE_MS;
        for s in &record.series {
            let Some(metric) = ALL.iter().find(|m| m.name == s.metric) else {
                continue;
            };
            if matches!(metric.kind, Kind::Gauge | Kind::Level) && !live {
                continue;
            }
            if s.labels.len() != metric.labels.len() {
                continue;
            }
            let value = s.value(metric);
            let updated = series_updated_ms(record, s);
            let series = self.merged.entry(metric.name).or_default();
            match series.get_mut(&s.labels) {
                None => {
                    series.insert(s.labels.clone(), (value, updated));
                }
                Some((into, latest)) => {
                    combine(into, value);
                    *latest = (*latest).max(updated);
                }
            }
        }
    }

    /// The exposition: every metric and its llm-d router twin, without the series with
    /// a client-chosen label value that no VM updated for the idle time. Each VM caps its
    /// own values at [`LABEL_CAP`]; across VMs, the [`LABEL_CAP`] values per family
    /// updated last keep their series and the rest are added up under [`OTHER`], so one
    /// scrape's size does not grow with the number of VMs.
    pub fn render(self) -> String {
        let idle_before = self.now_ms.saturating_sub(self.idle_ms);
        let shown = |metric: &Metric, labels: &[String], updated: i64| {
            updated > idle_before || !client_chosen(metric, labels)
        };
        let kept = self.kept_values(&shown);
        let mut out = String::new();
        for metric in ALL {
            let Some(series) = self.merged.get(metric.name) else {
                continue;
            };
            let mut folded: BTreeMap<Vec<String>, Value> = BTreeMap::new();
            for (labels, (value, updated)) in series {
                if !shown(metric, labels, *updated) {
                    continue;
                }
                let labels = fold(metric, labels, &kept);
                match folded.get_mut(&labels) {
                    Some(into) => combine(into, value.clone()),
                    None => {
                        folded.insert(labels, value.clone());
                    }
                }
            }
            if folded.is_empty() {
                continue;
            }
            family(&mut out, metric, metric.name, metric.labels, &[], &folded);
            if let Some(twin) = metric.twin {
                let labels = if twin.labels.len() == metric.labels.len() {
                    twin.labels
                } else {
                    metric.labels
                };
                family(&mut out, metric, twin.name, labels, twin.constant, &folded);
            }
        }
        out
    }

    /// Per client-chosen label family, the values that keep their own series: all of
    /// them up to [`LABEL_CAP`] (`None`), else the [`LABEL_CAP`] updated last.
    fn kept_values(
        &self,
        shown: &impl Fn(&Metric, &[String], i64) -> bool,
    ) -> [Option<HashSet<String>>; 2] {
        let mut latest: [HashMap<&str, i64>; 2] = Default::default();
        for metric in ALL {
            let Some(series) = self.merged.get(metric.name) else {
                continue;
            };
            for (labels, (_, updated)) in series {
                if !shown(metric, labels, *updated) {
                    continue;
                }
                for (label, value) in metric.labels.iter().zip(labels) {
                    let Some(f) = recorder::family(label).and_then(|f| latest.get_mut(f)) else {
                        continue;
                    };
                    if value.is_empty() || value == OTHER {
                        continue;
                    }
                    let at = f.entry(value.as_str()).or_insert(*updated);
                    *at = (*at).max(*updated);
                }
            }
        }
        latest.map(|values| {
            if values.len() <= LABEL_CAP {
                return None;
            }
            let mut by_recency: Vec<(&str, i64)> = values.into_iter().collect();
            by_recency.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
            Some(
                by_recency
                    .into_iter()
                    .take(LABEL_CAP)
                    .map(|(v, _)| v.to_string())
                    .collect(),
            )
        })
    }
}

/// `labels` with each client-chosen value that did not keep its series ([`Merger::kept_values`])
/// replaced by [`OTHER`].
fn fold(metric: &Metric, labels: &[String], kept: &[Option<HashSet<String>>; 2]) -> Vec<String> {
    metric
        .labels
        .iter()
        .zip(labels)
        .map(|(label, value)| {
            let cap = recorder::family(label)
                .and_then(|f| kept.get(f))
                .and_then(Option::as_ref);
            match cap {
                Some(kept) if !value.is_empty() && value != OTHER && !kept.contains(value) => {
                    OTHER.to_string()
                }
                _ => value.clone(),
            }
        })
        .collect()
}

fn combine(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Sum(a), Value::Sum(b)) => *a += b,
        (
            Value::Level { value, at_ms },
            Value::Level {
                value: v,
                at_ms: at,
            },
        ) if at > *at_ms => {
            *value = v;
            *at_ms = at;
        }
        (Value::Histogram { counts, sum }, Value::Histogram { counts: c, sum: s })
            if counts.len() == c.len() =>
        {
            for (a, b) in counts.iter_mut().zip(c) {
                *a += b;
            }
            *sum += s;
        }
        _ => {}
    }
}

fn family(
    out: &mut String,
    metric: &Metric,
    name: &str,
    labels: &[&str],
    constant: &[(&str, &str)],
    series: &BTreeMap<Vec<String>, Value>,
) {
    let kind = match metric.kind {
        Kind::Counter => "counter",
        Kind::Gauge | Kind::Level => "gauge",
        Kind::Histogram => "histogram",
    };
    let _ = writeln!(out, "# HELP {name} {}", metric.help);
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (values, value) in series {
        let mut pairs: Vec<(&str, &str)> = labels
            .iter()
            .copied()
            .zip(values.iter().map(String::as_str))
            .collect();
        pairs.extend_from_slice(constant);
        match value {
            Value::Sum(v) | Value::Level { value: v, .. } => {
                sample(out, name, "", &pairs, None, *v);
            }
            Value::Histogram { counts, sum } => {
                let mut cumulative = 0u64;
                for (bound, count) in metric.buckets.iter().zip(counts) {
                    cumulative += count;
                    let le = format_float(*bound);
                    sample(out, name, "_bucket", &pairs, Some(&le), cumulative as f64);
                }
                let total: u64 = counts.iter().sum();
                sample(out, name, "_bucket", &pairs, Some("+Inf"), total as f64);
                sample(out, name, "_sum", &pairs, None, *sum);
                sample(out, name, "_count", &pairs, None, total as f64);
            }
        }
    }
}

fn sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    pairs: &[(&str, &str)],
    le: Option<&str>,
    value: f64,
) {
    out.push_str(name);
    out.push_str(suffix);
    let mut all: Vec<(&str, &str)> = pairs.to_vec();
    if let Some(le) = le {
        all.push(("le", le));
    }
    if !all.is_empty() {
        out.push('{');
        for (i, (k, v)) in all.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            escape(out, v);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    out.push_str(&format_float(value));
    out.push('\n');
}

fn escape(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// A float as Prometheus reads it (no exponent; `NaN`/`+Inf` spelled its way).
fn format_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_string()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::recorder::Recorder;
    use crate::metrics::{
        FLOW_POOL_SATURATION, OBJECTIVE_RUNNING_REQUESTS, POOL_AVERAGE_KV, POOL_PER_POD_QUEUE,
        SCHEDULER_ATTEMPTS, SCHEDULER_E2E_DURATION,
    };
    use wasm_bindgen_test::wasm_bindgen_test;

    fn vm(f: impl FnOnce(&mut Recorder), updated_ms: i64) -> Record {
        let mut r = Recorder::default();
        f(&mut r);
        r.record(updated_ms)
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn workers_add_up_to_one_series_per_pool() {
        let add = |r: &mut Recorder, m: &'static Metric, v: &[&str], d| {
            let l = r.labels(m, v);
            r.add(m, l, d)
        };
        let a = vm(
            |r| {
                add(r, &OBJECTIVE_RUNNING_REQUESTS, &["m"], 3);
                add(
                    r,
                    &SCHEDULER_ATTEMPTS,
                    &["success", "m", "10.0.0.1", "", "8000"],
                    5,
                );
            },
            1_000,
        );
        let b = vm(
            |r| {
                add(r, &OBJECTIVE_RUNNING_REQUESTS, &["m"], 2);
                add(
                    r,
                    &SCHEDULER_ATTEMPTS,
                    &["success", "m", "10.0.0.1", "", "8000"],
                    1,
                );
            },
            1_000,
        );
        let text = render(&[a, b], 2_000);
        assert!(text.contains("# TYPE inference_objective_running_requests gauge\n"));
        assert!(text.contains("inference_objective_running_requests{model_name=\"m\"} 5\n"));
        assert!(text.contains(
            "inference_extension_scheduler_attempts_total{status=\"success\",target_model_name=\"m\",\
             pod_name=\"10.0.0.1\",namespace=\"\",port=\"8000\"} 6\n"
        ));
        // The llm-d router's twin, with its label names.
        assert!(text.contains(
            "llm_d_epp_scheduler_attempts_total{status=\"success\",target_model_name=\"m\",\
             endpoint_name=\"10.0.0.1\",namespace=\"\",port=\"8000\"} 6\n"
        ));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_gone_vm_keeps_its_counts_but_not_its_gauges() {
        let gone = vm(
            |r| {
                let l = r.labels(&OBJECTIVE_RUNNING_REQUESTS, &["m"]);
                r.add(&OBJECTIVE_RUNNING_REQUESTS, l, 4);
                let l = r.labels(&SCHEDULER_E2E_DURATION, &[]);
                r.observe(&SCHEDULER_E2E_DURATION, l, 300);
            },
            0,
        );
        let text = render(&[gone], LIVE_MS + 1);
        assert!(!text.contains("inference_objective_running_requests"));
        assert!(text.contains("inference_extension_scheduler_e2e_duration_seconds_count 1\n"));
        assert!(text.contains(
            "inference_extension_scheduler_e2e_duration_seconds_bucket{le=\"0.0005\"} 1\n"
        ));
        assert!(text.contains(
            "inference_extension_scheduler_e2e_duration_seconds_bucket{le=\"0.0002\"} 0\n"
        ));
        assert!(text.contains("inference_extension_scheduler_e2e_duration_seconds_sum 0.0003\n"));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_latest_setting_of_a_pool_gauge_wins() {
        let set = |value, at| {
            move |r: &mut Recorder| {
                let l = r.labels(&POOL_AVERAGE_KV, &["pool"]);
                r.set(&POOL_AVERAGE_KV, l, value, at);
                let l = r.labels(&FLOW_POOL_SATURATION, &["pool"]);
                r.set(&FLOW_POOL_SATURATION, l, value * 2.0, at);
            }
        };
        // The old lease holder still writes its record, but set its gauge earlier.
        let text = render(&[vm(set(0.25, 100), 900), vm(set(0.5, 500), 800)], 1_000);
        assert!(text.contains("inference_pool_average_kv_cache_utilization{name=\"pool\"} 0.5\n"));
        assert!(text.contains("llm_d_epp_average_kv_cache_utilization{name=\"pool\"} 0.5\n"));
        assert!(text.contains(
            "llm_d_epp_flow_control_pool_saturation{inference_pool=\"pool\",stage=\"effective\"} 1\n"
        ));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn label_values_are_escaped() {
        let rec = vm(
            |r| {
                let l = r.labels(&POOL_PER_POD_QUEUE, &["p", "a\"b\\c\nd"]);
                r.set(&POOL_PER_POD_QUEUE, l, 1.0, 1);
            },
            1,
        );
        let text = render(&[rec], 1);
        assert!(text.contains("model_server_pod=\"a\\\"b\\\\c\\nd\"} 1\n"));
        assert!(
            text.contains("llm_d_epp_per_endpoint_queue_size{name=\"p\",model_server_endpoint=")
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_tenant_idle_on_every_vm_leaves_the_exposition() {
        use crate::metrics::recorder::IDLE_MS;
        use crate::metrics::OBJECTIVE_REQUEST_TOTAL;
        let count = |tenant: &'static str, at: i64| {
            vm(
                move |r: &mut Recorder| {
                    let l = r.labels(&OBJECTIVE_REQUEST_TOTAL, &[tenant, ""]);
                    r.add(&OBJECTIVE_REQUEST_TOTAL, l, 1);
                    let l = r.labels(&SCHEDULER_E2E_DURATION, &[]);
                    r.observe(&SCHEDULER_E2E_DURATION, l, 100);
                },
                at,
            )
        };
        let now = 2 * IDLE_MS;
        // "gone" was last counted more than IDLE_MS ago on both VMs; "back" is idle on one
        // VM but was counted lately on the other.
        let records = [
            count("gone", now - IDLE_MS - 1),
            count("gone", now - IDLE_MS - 5),
            count("back", now - IDLE_MS - 1),
            count("back", now - 1_000),
        ];
        let text = render(&records, now);
        assert!(!text.contains("model_name=\"gone\""));
        assert!(
            text.contains(
                "inference_objective_request_total{model_name=\"back\",target_model_name=\"\"} 2\n"
            ),
            "{text}"
        );
        // Series a client did not choose stay, idle or not.
        assert!(text.contains("inference_extension_scheduler_e2e_duration_seconds_count 4\n"));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_scrape_lists_at_most_the_cap_of_client_values_whatever_the_number_of_vms() {
        use crate::metrics::recorder::{LABEL_CAP, OTHER};
        use crate::metrics::OBJECTIVE_REQUEST_TOTAL;
        // Two VMs, each with its own LABEL_CAP names; the second VM's are newer.
        let names = |prefix: &'static str, at: i64| {
            vm(
                move |r: &mut Recorder| {
                    for i in 0..LABEL_CAP {
                        let name = format!("{prefix}-{i}");
                        r.serve(&name);
                        let l = r.labels(&OBJECTIVE_REQUEST_TOTAL, &[&name, ""]);
                        r.add(&OBJECTIVE_REQUEST_TOTAL, l, 1);
                    }
                },
                at,
            )
        };
        let text = render(&[names("old", 1_000), names("new", 2_000)], 3_000);
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("inference_objective_request_total{"))
            .collect();
        assert_eq!(lines.len(), LABEL_CAP + 1);
        assert!(lines.iter().all(|l| !l.contains("\"old-")));
        assert!(lines.contains(
            &"inference_objective_request_total{model_name=\"new-7\",target_model_name=\"\"} 1"
        ));
        let other = format!(
            "inference_objective_request_total{{model_name=\"{OTHER}\",target_model_name=\"\"}} {LABEL_CAP}"
        );
        assert!(lines.contains(&other.as_str()), "{}", lines[0]);
    }
}
