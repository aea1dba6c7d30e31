//! The Prometheus text exposition of every VM's records, merged.
//!
//! Counters and histograms add up over every record (a VM that is gone still counted what
//! it counted); gauge shares add up over the records written within [`LIVE_MS`] (a crashed
//! VM's share of `running_requests` must not stay forever); a [`Kind::Level`] gauge takes
//! the value set last, from a live record.

use super::recorder::{Record, Value};
use super::{Kind, Metric, ALL};
use std::collections::BTreeMap;
use std::fmt::Write;

/// A record older than this is from a VM that stopped (VMs write theirs every second).
pub const LIVE_MS: i64 = 10_000;

/// The `Content-Type` of [`render`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Merges `records` as of `now_ms` and writes the exposition.
pub fn render(records: &[Record], now_ms: i64) -> String {
    let merged = merge(records, now_ms);
    let mut out = String::new();
    for metric in ALL {
        let Some(series) = merged.get(metric.name) else {
            continue;
        };
        family(&mut out, metric, metric.name, metric.labels, &[], series);
        if let Some(twin) = metric.twin {
            let labels = if twin.labels.len() == metric.labels.len() {
                twin.labels
            } else {
                metric.labels
            };
            family(&mut out, metric, twin.name, labels, twin.constant, series);
        }
    }
    out
}

type Merged = BTreeMap<&'static str, BTreeMap<Vec<String>, Value>>;

fn merge(records: &[Record], now_ms: i64) -> Merged {
    let mut merged: Merged = BTreeMap::new();
    for record in records {
        let live = now_ms.saturating_sub(record.updated_ms) <= LIVE_MS;
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
            let slot = merged
                .entry(metric.name)
                .or_default()
                .entry(s.labels.clone());
            match slot {
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(value);
                }
                std::collections::btree_map::Entry::Occupied(mut o) => combine(o.get_mut(), value),
            }
        }
    }
    merged
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
        let add = |r: &mut Recorder, m: &Metric, v: &[&str], d| {
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
}
