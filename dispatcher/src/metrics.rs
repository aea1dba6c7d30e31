//! Reading the pool's saturation and ready endpoints, which the filter publishes as
//! `inference_extension_flow_control_pool_saturation{inference_pool}` and
//! `inference_pool_ready_pods{name}` (twins `llm_d_epp_flow_control_pool_saturation`,
//! `llm_d_epp_ready_endpoints`), from one of:
//!
//! * `envoy-stats=URL`: Envoy's admin `/stats/prometheus`, where the filter's gauges are
//!   integers and saturation is in **thousandths**;
//! * `prometheus-text=URL`: the filter's own metrics endpoint (`pool.metricsEndpoint`),
//!   or any Prometheus exposition with saturation as a **fraction**;
//! * `prometheus-query=URL`: a Prometheus server's HTTP API (`/api/v1/query`), fraction
//!   unless `--saturation-unit thousandths` (a Prometheus scraping Envoy's stats).
//!
//! * `servers=URL,URL,…`: the model servers' own `/metrics` (llm-d-async's third
//!   `prometheus-budget` source): `S = Σ (vllm:num_requests_running + waiting) ÷
//!   (answering servers × max_concurrency)`, `ready` = the servers that answered. Fresher
//!   than the filter's gauge (set once a second), but blind to requests queued in the
//!   gateway.
//!
//! Anything unreadable (connection refused, a non-200 answer, a missing series, several
//! pools without `--pool`) is an error, which the gate turns into budget 0.

use std::time::Duration;

const SATURATION: [&str; 2] = [
    "inference_extension_flow_control_pool_saturation",
    "llm_d_epp_flow_control_pool_saturation",
];
const READY: [&str; 2] = ["inference_pool_ready_pods", "llm_d_epp_ready_endpoints"];
/// The pool label of each name above (the llm-d twins carry none).
const SATURATION_POOL_LABEL: &str = "inference_pool";
const READY_POOL_LABEL: &str = "name";

/// Where the metrics come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    EnvoyStats(String),
    PrometheusText(String),
    PrometheusQuery(String),
    Servers(Vec<String>),
}

impl Source {
    /// `envoy-stats=URL`, `prometheus-text=URL` or `prometheus-query=URL`.
    pub fn parse(s: &str) -> Result<Source, String> {
        let (kind, url) = s.split_once('=').ok_or_else(|| {
            format!("`{s}`: expected envoy-stats=URL, prometheus-text=URL, prometheus-query=URL or servers=URL,URL")
        })?;
        for u in url.split(',') {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                return Err(format!("`{u}`: not an http(s) URL"));
            }
        }
        match kind {
            "envoy-stats" => Ok(Source::EnvoyStats(url.to_string())),
            "prometheus-text" => Ok(Source::PrometheusText(url.to_string())),
            "prometheus-query" => Ok(Source::PrometheusQuery(
                url.trim_end_matches('/').to_string(),
            )),
            "servers" => Ok(Source::Servers(url.split(',').map(String::from).collect())),
            other => Err(format!(
                "`{other}`: unknown metrics source (envoy-stats, prometheus-text, prometheus-query, servers)"
            )),
        }
    }

    /// The factor from the source's saturation number to a fraction, by default.
    pub fn default_scale(&self) -> f64 {
        match self {
            Source::EnvoyStats(_) => 0.001,
            _ => 1.0,
        }
    }
}

/// One reading of the pool.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// `S`, as a fraction (1 = the detector's gating set point).
    pub saturation: f64,
    /// Endpoints with fresh metrics.
    pub ready: u64,
}

/// Reads `source` once. `scale` turns the saturation number into a fraction;
/// `max_concurrency` is the per-server capacity (`servers` only).
pub async fn read(
    client: &reqwest::Client,
    source: &Source,
    pool: Option<&str>,
    scale: f64,
    max_concurrency: u64,
    timeout: Duration,
) -> Result<Reading, String> {
    let (s, ready) = match source {
        Source::Servers(urls) => {
            let mut load = 0.0;
            let mut answered = 0u64;
            let mut last_error = String::new();
            for u in urls {
                let got = get_text(client, u, &[], timeout).await.and_then(|t| {
                    let running = sum(&t, "vllm:num_requests_running")?;
                    let waiting = sum(&t, "vllm:num_requests_waiting")?;
                    Ok(running + waiting)
                });
                match got {
                    Ok(l) => {
                        load += l;
                        answered += 1;
                    }
                    Err(e) => last_error = e,
                }
            }
            if answered == 0 {
                return Err(format!("no server answered: {last_error}"));
            }
            let capacity = (answered * max_concurrency.max(1)) as f64;
            (load / capacity / scale, answered as f64)
        }
        Source::EnvoyStats(url) | Source::PrometheusText(url) => {
            let text = get_text(client, url, &[], timeout).await?;
            let s = find(&text, &SATURATION, SATURATION_POOL_LABEL, pool)?;
            let r = find(&text, &READY, READY_POOL_LABEL, pool)?;
            (s, r)
        }
        Source::PrometheusQuery(base) => {
            let q = |name: &str, label: &str| match pool {
                Some(p) => format!("max({name}{{{label}=\"{p}\"}})"),
                None => format!("max({name})"),
            };
            let s = query(
                client,
                base,
                &q(SATURATION[0], SATURATION_POOL_LABEL),
                timeout,
            )
            .await?;
            let r = query(client, base, &q(READY[0], READY_POOL_LABEL), timeout).await?;
            (s, r)
        }
    };
    if !s.is_finite() || s < 0.0 || !ready.is_finite() || ready < 0.0 {
        return Err(format!(
            "nonsensical reading: saturation {s}, ready {ready}"
        ));
    }
    Ok(Reading {
        saturation: s * scale,
        ready: ready as u64,
    })
}

async fn get_text(
    client: &reqwest::Client,
    url: &str,
    query: &[(&str, &str)],
    timeout: Duration,
) -> Result<String, String> {
    let r = client
        .get(url)
        .query(query)
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    let status = r.status();
    let text = r.text().await.map_err(|e| format!("GET {url}: {e}"))?;
    if !status.is_success() {
        return Err(format!("GET {url}: status {status}"));
    }
    Ok(text)
}

async fn query(
    client: &reqwest::Client,
    base: &str,
    q: &str,
    timeout: Duration,
) -> Result<f64, String> {
    let url = format!("{base}/api/v1/query");
    let text = get_text(client, &url, &[("query", q)], timeout).await?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{url}: not JSON: {e}"))?;
    let result = v["data"]["result"]
        .as_array()
        .ok_or_else(|| format!("{url} `{q}`: no data.result"))?;
    let first = result
        .first()
        .ok_or_else(|| format!("{url} `{q}`: no series"))?;
    first["value"][1]
        .as_str()
        .and_then(|s| s.parse::<f64>().ok())
        .ok_or_else(|| format!("{url} `{q}`: no value"))
}

/// The value of the first of `names` present in a Prometheus text exposition, for `pool`
/// (matched on `pool_label` of the first name; the twins carry no pool label).
pub fn find(
    text: &str,
    names: &[&str],
    pool_label: &str,
    pool: Option<&str>,
) -> Result<f64, String> {
    for (i, name) in names.iter().enumerate() {
        let mut found: Vec<(String, f64)> = Vec::new();
        for line in text.lines() {
            let Some((series, value)) = sample(line) else {
                continue;
            };
            let (n, labels) = match series.split_once('{') {
                Some((n, l)) => (n, l.trim_end_matches('}')),
                None => (series, ""),
            };
            if n != *name {
                continue;
            }
            let pool_value = label(labels, pool_label).unwrap_or_default();
            found.push((pool_value, value));
        }
        if found.is_empty() {
            continue;
        }
        let twin = i > 0;
        let chosen: Vec<&(String, f64)> = match pool {
            Some(p) if !twin => found.iter().filter(|(v, _)| v == p).collect(),
            _ => found.iter().collect(),
        };
        return match chosen.as_slice() {
            [one] => Ok(one.1),
            [] => Err(format!(
                "{name}: no series for pool `{}` (pools: {})",
                pool.unwrap_or(""),
                pools(&found)
            )),
            _ => Err(format!(
                "{name}: several pools ({}); choose one with --pool",
                pools(&found)
            )),
        };
    }
    Err(format!("none of {} in the metrics", names.join(", ")))
}

fn pools(found: &[(String, f64)]) -> String {
    found
        .iter()
        .map(|(p, _)| p.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The sum of every series of `name` (any labels); an error if there is none.
pub fn sum(text: &str, name: &str) -> Result<f64, String> {
    let mut found = false;
    let mut total = 0.0;
    for line in text.lines() {
        let Some((series, value)) = sample(line) else {
            continue;
        };
        let n = series.split_once('{').map_or(series, |(n, _)| n);
        if n == name {
            found = true;
            total += value;
        }
    }
    if found {
        Ok(total)
    } else {
        Err(format!("no {name} in the metrics"))
    }
}

/// `name{labels} value [timestamp]` → (`name{labels}`, value).
fn sample(line: &str) -> Option<(&str, f64)> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let end = match line.find('}') {
        Some(i) => i + 1,
        None => line.find(' ')?,
    };
    let (series, rest) = line.split_at(end);
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    Some((series, value))
}

fn label(labels: &str, key: &str) -> Option<String> {
    labels.split(',').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENVOY: &str = "\
# TYPE inference_extension_flow_control_pool_saturation gauge
inference_extension_flow_control_pool_saturation{inference_pool=\"pool-a\"} 300
inference_extension_flow_control_pool_saturation{inference_pool=\"pool-b\"} 900
inference_pool_ready_pods{name=\"pool-a\"} 5
inference_pool_ready_pods{name=\"pool-b\"} 2
";

    #[test]
    fn finds_the_pools_series() {
        let s = find(ENVOY, &SATURATION, SATURATION_POOL_LABEL, Some("pool-a")).unwrap();
        assert_eq!(s, 300.0);
        let r = find(ENVOY, &READY, READY_POOL_LABEL, Some("pool-b")).unwrap();
        assert_eq!(r, 2.0);
    }

    #[test]
    fn several_pools_without_a_choice_is_an_error_naming_them() {
        let e = find(ENVOY, &SATURATION, SATURATION_POOL_LABEL, None).unwrap_err();
        assert!(e.contains("pool-a, pool-b"), "{e}");
        let e = find(ENVOY, &READY, READY_POOL_LABEL, Some("pool-c")).unwrap_err();
        assert!(e.contains("pool-c"), "{e}");
    }

    #[test]
    fn the_llm_d_twins_are_read_when_the_gie_names_are_absent() {
        let text = "llm_d_epp_flow_control_pool_saturation{stage=\"effective\"} 0.25\nllm_d_epp_ready_endpoints 3\n";
        assert_eq!(
            find(text, &SATURATION, SATURATION_POOL_LABEL, Some("x")).unwrap(),
            0.25
        );
        assert_eq!(find(text, &READY, READY_POOL_LABEL, None).unwrap(), 3.0);
    }

    #[test]
    fn a_servers_load_is_the_sum_over_its_series() {
        let t = "vllm:num_requests_running{model_name=\"a\"} 3.0\nvllm:num_requests_running{model_name=\"b\"} 2.0\n";
        assert_eq!(sum(t, "vllm:num_requests_running").unwrap(), 5.0);
        assert!(sum(t, "vllm:num_requests_waiting").is_err());
        let s = Source::parse("servers=http://a:1/metrics,http://b:2/metrics").unwrap();
        assert_eq!(
            s,
            Source::Servers(vec![
                "http://a:1/metrics".into(),
                "http://b:2/metrics".into()
            ])
        );
    }

    #[test]
    fn a_missing_series_is_an_error() {
        assert!(find("other 1\n", &SATURATION, SATURATION_POOL_LABEL, None).is_err());
    }

    #[test]
    fn sources_parse_and_name_their_errors() {
        assert_eq!(
            Source::parse("envoy-stats=http://127.0.0.1:9901/stats/prometheus").unwrap(),
            Source::EnvoyStats("http://127.0.0.1:9901/stats/prometheus".into())
        );
        assert!(Source::parse("statsd=http://x")
            .unwrap_err()
            .contains("statsd"));
        assert!(Source::parse("envoy-stats=localhost:1")
            .unwrap_err()
            .contains("http"));
    }
}
