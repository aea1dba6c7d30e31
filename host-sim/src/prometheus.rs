//! The Prometheus view of the process-wide stats, as Envoy's `/stats/prometheus` shows
//! them: tag extraction with the bootstrap's `stats_tags` rules (for each rule, in order,
//! the first capture group is cut out of the name and the second is the tag value),
//! the `wasmcustom.` namespace stripped without an `envoy_` prefix, invalid characters
//! turned into `_`, labels in the order of the rules.

use crate::host::shared::{MetricKind, Stat};
use anyhow::{anyhow, Context, Result};
use regex::Regex;
use std::collections::BTreeMap;

/// One `stats_tags` rule.
#[derive(Debug, Clone)]
pub struct TagRule {
    /// `tag_name`.
    pub name: String,
    /// `regex`.
    pub regex: Regex,
}

/// The project's rules (`envoy/stats-tags.yaml`), as rendered into the bootstrap.
pub fn default_rules() -> Vec<TagRule> {
    parse_rules(include_str!("../../envoy/stats-tags.yaml"))
        .unwrap_or_else(|e| panic!("envoy/stats-tags.yaml: {e}"))
}

/// A `histogram_bucket_settings` entry: stats whose Envoy name starts with `prefix`
/// (e.g. `wasmcustom.inference_...`) use `buckets`.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketSetting {
    /// Stat-name prefix, including the `wasmcustom.` namespace.
    pub prefix: String,
    /// Bucket upper bounds.
    pub buckets: Vec<f64>,
}

/// The project's bucket settings (`envoy/histogram-buckets.yaml`), as rendered into the
/// bootstrap; histograms they do not match use [`DEFAULT_BUCKETS`].
pub fn default_bucket_settings() -> Vec<BucketSetting> {
    parse_bucket_settings(include_str!("../../envoy/histogram-buckets.yaml"))
}

/// Parses a list in the form of `envoy/histogram-buckets.yaml`
/// (`- match: {prefix: x}` followed by `buckets: [a, b, ...]`).
pub fn parse_bucket_settings(yaml: &str) -> Vec<BucketSetting> {
    let mut out = Vec::new();
    let mut prefix: Option<String> = None;
    for line in yaml.lines() {
        let l = line.trim().trim_start_matches("- ").trim();
        if let Some(v) = l.strip_prefix("match:") {
            prefix = v
                .trim()
                .trim_start_matches('{')
                .trim_end_matches('}')
                .trim()
                .strip_prefix("prefix:")
                .map(|p| p.trim().to_string());
        } else if let Some(v) = l.strip_prefix("buckets:") {
            let buckets = v
                .trim()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .split(',')
                .filter_map(|b| b.trim().parse::<f64>().ok())
                .collect();
            if let Some(prefix) = prefix.take() {
                out.push(BucketSetting { prefix, buckets });
            }
        }
    }
    out
}

fn buckets_for<'a>(stat_name: &str, settings: &'a [BucketSetting]) -> &'a [f64] {
    settings
        .iter()
        .find(|s| stat_name.starts_with(&s.prefix))
        .map_or(DEFAULT_BUCKETS, |s| s.buckets.as_slice())
}

/// Parses a `stats_tags` list in the form of `envoy/stats-tags.yaml`
/// (`- tag_name: x` followed by `regex: '...'`).
pub fn parse_rules(yaml: &str) -> Result<Vec<TagRule>> {
    let mut rules = Vec::new();
    let mut name: Option<String> = None;
    for (n, line) in yaml.lines().enumerate() {
        let l = line.trim().trim_start_matches("- ").trim();
        if let Some(v) = l.strip_prefix("tag_name:") {
            name = Some(v.trim().to_string());
        } else if let Some(v) = l.strip_prefix("regex:") {
            let v = v.trim();
            let v = v
                .strip_prefix('\'')
                .and_then(|v| v.strip_suffix('\''))
                .map(|v| v.replace("''", "'"))
                .unwrap_or_else(|| v.to_string());
            let tag = name
                .take()
                .ok_or_else(|| anyhow!("line {}: regex without tag_name", n + 1))?;
            let regex = Regex::new(&v).with_context(|| format!("line {}: bad regex", n + 1))?;
            rules.push(TagRule { name: tag, regex });
        }
    }
    Ok(rules)
}

/// Applies the rules to a stat name: the name with every matched first group removed,
/// and the tags in rule order.
pub fn extract(name: &str, rules: &[TagRule]) -> (String, Vec<(String, String)>) {
    let mut cuts: Vec<(usize, usize)> = Vec::new();
    let mut tags = Vec::new();
    for rule in rules {
        let Some(caps) = rule.regex.captures(name) else {
            continue;
        };
        let Some(cut) = caps.get(1) else { continue };
        let value = caps.get(2).unwrap_or(cut).as_str().to_string();
        cuts.push((cut.start(), cut.end()));
        tags.push((rule.name.clone(), value));
    }
    cuts.sort_unstable();
    let mut out = String::with_capacity(name.len());
    let mut at = 0;
    for (s, e) in cuts {
        if s >= at {
            out.push_str(&name[at..s]);
        }
        at = at.max(e);
    }
    out.push_str(&name[at.min(name.len())..]);
    (out, tags)
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('\n', "\\n")
        .replace('"', "\\\"")
}

/// The Prometheus metric name of an extracted stat name.
pub fn metric_name(extracted: &str) -> String {
    match extracted.strip_prefix("wasmcustom.") {
        Some(rest) => sanitize(rest),
        None => format!("envoy_{}", sanitize(extracted)),
    }
}

/// Envoy's default histogram buckets.
pub const DEFAULT_BUCKETS: &[f64] = &[
    0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0,
    60000.0, 300000.0, 600000.0, 1800000.0, 3600000.0,
];

fn fmt_num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Renders the stats as `/stats/prometheus` text.
pub fn render(
    stats: &BTreeMap<String, Stat>,
    rules: &[TagRule],
    bucket_settings: &[BucketSetting],
) -> String {
    // family name -> (kind, [(labels, stat, buckets)])
    type Family<'a> = (MetricKind, Vec<(String, &'a Stat, &'a [f64])>);
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for (name, stat) in stats {
        let (extracted, tags) = extract(name, rules);
        let labels = tags
            .iter()
            .map(|(k, v)| format!("{}=\"{}\"", sanitize(k), escape(v)))
            .collect::<Vec<_>>()
            .join(",");
        families
            .entry(metric_name(&extracted))
            .or_insert_with(|| (stat.kind, Vec::new()))
            .1
            .push((labels, stat, buckets_for(name, bucket_settings)));
    }
    let mut out = String::new();
    for (family, (kind, mut members)) in families {
        members.sort_by(|a, b| a.0.cmp(&b.0));
        let t = match kind {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        };
        out.push_str(&format!("# TYPE {family} {t}\n"));
        for (labels, stat, buckets) in members {
            if kind == MetricKind::Histogram {
                let sep = if labels.is_empty() { "" } else { "," };
                for b in buckets {
                    let n = stat.samples.iter().filter(|s| (**s as f64) <= *b).count();
                    out.push_str(&format!(
                        "{family}_bucket{{{labels}{sep}le=\"{}\"}} {n}\n",
                        fmt_num(*b)
                    ));
                }
                out.push_str(&format!(
                    "{family}_bucket{{{labels}{sep}le=\"+Inf\"}} {}\n",
                    stat.samples.len()
                ));
                let sum: u64 = stat.samples.iter().sum();
                out.push_str(&format!("{family}_sum{{{labels}}} {sum}\n"));
                out.push_str(&format!(
                    "{family}_count{{{labels}}} {}\n",
                    stat.samples.len()
                ));
            } else {
                // Envoy prints `{}` on untagged lines too.
                out.push_str(&format!("{family}{{{labels}}} {}\n", stat.value));
            }
        }
    }
    out
}

/// The value of the sample line `name{labels}` (exact labels text, in rule order) in
/// Prometheus text, e.g. `value(text, "m{a=\"x\"}")`.
pub fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_come_out_in_rule_order_and_the_name_is_cut() {
        let rules = default_rules();
        let (name, tags) = extract(
            "wasmcustom.inference_extension_scheduler_attempts_total;status=.=success;.;;target_model_name=.=m.x;.;",
            &rules,
        );
        assert_eq!(
            name,
            "wasmcustom.inference_extension_scheduler_attempts_total"
        );
        assert_eq!(
            tags,
            vec![
                ("status".to_string(), "success".to_string()),
                ("target_model_name".to_string(), "m.x".to_string())
            ]
        );
    }

    #[test]
    fn model_name_does_not_match_inside_target_model_name() {
        let rules = default_rules();
        let (_, tags) = extract(
            "wasmcustom.x;model_name=.=a;.;;target_model_name=.=b;.;",
            &rules,
        );
        let model: Vec<_> = tags.iter().filter(|(k, _)| k == "model_name").collect();
        assert_eq!(model, vec![&("model_name".to_string(), "a".to_string())]);
    }

    #[test]
    fn renders_like_envoy() {
        let mut stats = BTreeMap::new();
        stats.insert(
            "wasmcustom.inference_objective_running_requests;model_name=.=m;.;".to_string(),
            Stat {
                kind: MetricKind::Gauge,
                value: 0,
                samples: vec![],
            },
        );
        stats.insert(
            "wasmcustom.lat_ms".to_string(),
            Stat {
                kind: MetricKind::Histogram,
                value: 0,
                samples: vec![3, 700],
            },
        );
        stats.insert(
            "wasmcustom.inference_extension_prefix_indexer_size".to_string(),
            Stat {
                kind: MetricKind::Gauge,
                value: 7,
                samples: vec![],
            },
        );
        let settings =
            parse_bucket_settings("- match: {prefix: wasmcustom.lat_}\n  buckets: [1, 5, 1000]\n");
        let text = render(&stats, &default_rules(), &settings);
        assert!(
            text.contains("inference_extension_prefix_indexer_size{} 7\n"),
            "{text}"
        );
        assert!(
            !text.contains("lat_ms_bucket{le=\"10\"}"),
            "Envoy's defaults replaced: {text}"
        );
        assert!(text.contains("# TYPE inference_objective_running_requests gauge\n"));
        assert_eq!(
            value(
                &text,
                "inference_objective_running_requests{model_name=\"m\"}"
            ),
            Some(0.0)
        );
        assert!(text.contains("lat_ms_bucket{le=\"5\"} 1\n"), "{text}");
        assert!(text.contains("lat_ms_sum{} 703\n"), "{text}");
        assert!(text.contains("lat_ms_count{} 2\n"), "{text}");
    }

    #[test]
    fn the_projects_bucket_settings_are_read() {
        let settings = default_bucket_settings();
        assert!(settings.iter().any(|s| s.prefix
            == "wasmcustom.inference_extension_flow_control_dispatch_cycle_duration_seconds"
            && s.buckets.first() == Some(&5.0)));
    }
}
