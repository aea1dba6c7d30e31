//! What the invariants read from the running gateway: Envoy's RSS, its stats (count, VM
//! creations and reloads, forged names) and the filter's in-flight gauges.

use crate::envoy::Envoy;
use crate::http;

/// One look at the gateway.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Envoy's resident set (KiB).
    pub rss_kib: u64,
    /// Lines of the admin `/stats` (one per stat).
    pub stats: usize,
    /// Wasm VMs created since start (`wasm.envoy.wasm.runtime.v8.created`).
    pub vms_created: u64,
    /// Sum of Envoy's `wasm.…vm_reload…` stats: a VM replaced after a crash.
    pub vm_reloads: u64,
    /// Requests the filter counts as running (`inference_objective_running_requests`).
    pub running: f64,
    /// Requests in flow control's queues (`inference_extension_flow_control_queue_size`).
    pub queued: f64,
    /// Stat names or Prometheus lines that hold client text outside a bounded label.
    pub forged: Vec<String>,
    /// The admin API or the metrics listener did not answer (e.g. blocked on the stats lock).
    pub unanswered: Vec<String>,
}

/// The resident set of `pid` (KiB), from `/proc`.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// The longest label value a bounded label may hold (128 bytes cut, escaped at most ×6).
const LABEL_MAX: usize = 128 * 6;

/// Reads the gateway: admin `/stats`, `/stats/prometheus`, and the filter's own metrics
/// (`metrics`, the `pool.metricsEndpoint` listener, when given).
pub fn snapshot(envoy: &Envoy, metrics: Option<&str>, marker: &str) -> Snapshot {
    let mut unanswered = Vec::new();
    let mut read = |addr: &str, path: &str| match http::get(addr, path) {
        Ok(r) if r.status == 200 => r.text(),
        Ok(r) => {
            unanswered.push(format!("{path} answered {}", r.status));
            String::new()
        }
        Err(e) => {
            unanswered.push(format!("{path} did not answer within 30 s ({e})"));
            String::new()
        }
    };
    let stats = read(&envoy.admin, "/stats");
    let prom = read(&envoy.admin, "/stats/prometheus");
    let own = metrics.map(|m| read(m, "/metrics")).unwrap_or_default();
    let mut s = Snapshot {
        rss_kib: rss_kib(envoy.pid()),
        stats: stats.lines().count(),
        unanswered,
        ..Snapshot::default()
    };
    let mut names = std::collections::HashSet::new();
    for line in stats.lines() {
        let Some((name, value)) = line.rsplit_once(": ") else {
            s.forged
                .push(format!("/stats line without a value: {}", clip(line)));
            continue;
        };
        if !names.insert(name) {
            s.forged.push(format!("/stats name twice: {}", clip(name)));
        }
        if name == "wasm.envoy.wasm.runtime.v8.created" {
            s.vms_created = value.trim().parse().unwrap_or(0);
        }
        // Envoy's own (`wasm.<plugin>.vm_reload_*`), not a filter stat with a label.
        if name.starts_with("wasm.") && name.contains("vm_reload") && !name.contains("=.=") {
            s.vm_reloads += value.trim().parse::<u64>().unwrap_or(0);
        }
        if let Some(why) = unbounded_client_text(name, marker) {
            s.forged.push(format!("/stats {why}: {}", clip(name)));
        }
    }
    for (source, text) in [("/stats/prometheus", &prom), ("/metrics", &own)] {
        for line in text.lines() {
            if let Some(why) = bad_prometheus_line(line, marker) {
                s.forged.push(format!("{source} {why}: {}", clip(line)));
            }
        }
    }
    let gauges = if own.is_empty() { &prom } else { &own };
    s.running = sum(gauges, "inference_objective_running_requests");
    s.queued = sum(gauges, "inference_extension_flow_control_queue_size");
    s
}

fn clip(s: &str) -> String {
    s.chars().take(160).collect()
}

/// Sum of a Prometheus family's samples.
pub fn sum(text: &str, family: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(family)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Why a stat name holds client text where it may not: the marker outside a label
/// segment (`;k=.=v;.;`), a label segment longer than a bounded label, a control byte.
fn unbounded_client_text(name: &str, marker: &str) -> Option<&'static str> {
    if name.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Some("control byte in a name");
    }
    if !name.contains(marker) {
        return None;
    }
    // Remove every label value; the marker must be gone with them.
    let mut rest = name;
    let mut skeleton = String::new();
    while let Some(i) = rest.find("=.=") {
        skeleton.push_str(&rest[..i]);
        let after = &rest[i + 3..];
        let end = after.find(";.;").unwrap_or(after.len());
        if end > LABEL_MAX {
            return Some("label value beyond the bound");
        }
        rest = &after[end..];
    }
    skeleton.push_str(rest);
    skeleton
        .contains(marker)
        .then_some("client text outside a label")
}

/// Why a line of a Prometheus exposition is not one a bounded exporter writes.
fn bad_prometheus_line(line: &str, marker: &str) -> Option<&'static str> {
    if line.is_empty() {
        return None;
    }
    if let Some(comment) = line.strip_prefix('#') {
        let family = comment.split_whitespace().nth(1).unwrap_or("");
        return (family.contains(marker) || family.contains("forged"))
            .then_some("a family named by the client");
    }
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
    {
        return Some("not a metric name");
    }
    if name.contains(marker) || name.contains("forged") {
        return Some("a metric named by the client");
    }
    // Label values: each quoted value bounded.
    if line[name_end..].starts_with('{') {
        let Some(close) = line.rfind('}') else {
            return Some("labels not closed");
        };
        let labels = &line[name_end + 1..close];
        let mut in_value = false;
        let mut escaped = false;
        let mut len = 0;
        for b in labels.bytes() {
            if in_value {
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                } else if b == b'"' {
                    in_value = false;
                    if len > LABEL_MAX {
                        return Some("label value beyond the bound");
                    }
                    len = 0;
                    continue;
                }
                len += 1;
            } else if b == b'"' {
                in_value = true;
            }
        }
        if in_value {
            return Some("label value not closed");
        }
        if line[close + 1..].trim().parse::<f64>().is_err() {
            return Some("no value after the labels");
        }
    } else if line[name_end..].trim().parse::<f64>().is_err() {
        return Some("no value");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_text_only_inside_bounded_labels() {
        let m = "zq000001";
        assert_eq!(unbounded_client_text("wasm.epp.vm_reload", m), None);
        assert_eq!(
            unbounded_client_text("wasmcustom.x;model_name=.=zq000001-a;.;", m),
            None
        );
        assert!(unbounded_client_text("wasmcustom.x;model_name=.=a;.;zq000001", m).is_some());
        let long = format!("x;model_name=.={m}{};.;", "a".repeat(LABEL_MAX));
        assert!(unbounded_client_text(&long, m).is_some());
        assert!(unbounded_client_text("x\nwasm.epp.vm_reload", m).is_some());
    }

    #[test]
    fn forged_prometheus_lines_are_found() {
        let m = "zq000001";
        assert_eq!(bad_prometheus_line("# TYPE a_b counter", m), None);
        assert_eq!(bad_prometheus_line("a_b{x=\"zq000001 \\\"q\"} 1", m), None);
        assert!(bad_prometheus_line("# TYPE forged_zq000001 counter", m).is_some());
        assert!(bad_prometheus_line("forged_zq000001 1", m).is_some());
        assert!(bad_prometheus_line("wasm.epp.vm_reload: 999", m).is_some());
        assert!(bad_prometheus_line("a{x=\"y\"}", m).is_some());
        assert_eq!(bad_prometheus_line("a 1.5", m), None);
    }
}
