//! The autoscaling manifests (`envoy/autoscaling/`) and the dashboard
//! (`envoy/dashboards/`) against a real Prometheus 2.42 scraping the filter's metrics
//! endpoint of a real Envoy 1.40 (2 workers) in front of `vllm-sim`: every query they hold
//! names series that exist, the queue reads more than 0 while requests wait in the gateway
//! and 0 once they are served, the running requests are counted while they run, and each
//! panel's unit fits what it plots. Prometheus comes from Debian (`scripts/setup
//! --test-tools`).

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tests::envoy::Envoy;
use tests::free_port;
use tests::http;
use tests::vllm_sim_server::VllmSimServer;

const POOL: &str = "vllm-llama3-8b";
const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// Every panel of the dashboard: (title, unit, expressions with `$pool` set to `POOL`).
fn dashboard_panels() -> Vec<(String, String, Vec<String>)> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../envoy/dashboards/inference-gateway.json");
    let d: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("dashboard"))
        .expect("the dashboard is JSON");
    d["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .map(|p| {
            let exprs = p["targets"]
                .as_array()
                .expect("targets")
                .iter()
                .map(|t| t["expr"].as_str().expect("expr").replace("$pool", POOL))
                .collect();
            (
                p["title"].as_str().unwrap_or_default().to_string(),
                p["fieldConfig"]["defaults"]["unit"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                exprs,
            )
        })
        .collect()
}

/// The unit a panel plotting `expr` must have.
fn unit_for(expr: &str) -> &'static str {
    if expr.contains("_seconds_bucket") {
        "s"
    } else if expr.contains("rate(") {
        "reqps"
    } else if expr.contains("utilization") || expr.contains("saturation") {
        "percentunit"
    } else {
        "short"
    }
}

fn manifests() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../envoy/autoscaling")
}

/// The PromQL expressions the manifests hold, as they query (`query:` of the KEDA
/// triggers; `metricsQuery:` of the adapter rules with the label matchers hpa.yaml's
/// selectors give).
fn manifest_queries() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for file in ["keda-scaledobject.yaml", "prometheus-adapter-rules.yaml"] {
        let text = std::fs::read_to_string(manifests().join(file)).expect("manifest");
        for line in text.lines() {
            let line = line.trim();
            if let Some(q) = line.strip_prefix("query:") {
                out.push((file.to_string(), q.trim().to_string()));
            } else if let Some(q) = line.strip_prefix("metricsQuery:") {
                // The adapter puts the HPA's metric selector there: hpa.yaml selects the
                // queue by pool and the running requests by nothing.
                let matchers = if q.contains("queue_size") {
                    format!("{{inference_pool=\"{POOL}\"}}")
                } else {
                    String::new()
                };
                let q = q.trim().replace("{<<.LabelMatchers>>}", &matchers);
                out.push((file.to_string(), q));
            }
        }
    }
    out
}

/// A Prometheus scraping `target`'s `/metrics` every second; stopped when dropped.
struct Prometheus {
    child: Child,
    addr: String,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let dir = tests::scratch_dir("prometheus");
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
                 scrape_configs:\n- job_name: gateway\n  static_configs:\n  - targets: ['{target}']\n"
            ),
        )
        .expect("write prometheus.yml");
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus is installed by scripts/setup --test-tools (Debian package)");
        let p = Prometheus { child, addr };
        let deadline = Instant::now() + Duration::from_secs(30);
        while http::get(&p.addr, "/-/ready").map(|r| r.status).ok() != Some(200) {
            assert!(Instant::now() < deadline, "prometheus did not become ready");
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    /// The values of an instant query (empty: no series).
    fn query(&self, promql: &str) -> Vec<f64> {
        let path = format!("/api/v1/query?query={}", encode(promql));
        let r = http::get(&self.addr, &path).expect("query");
        let v: Value = serde_json::from_str(&r.text()).unwrap_or(Value::Null);
        assert_eq!(v["status"], "success", "{promql}: {}", r.text());
        v["data"]["result"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s["value"][1].as_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Polls `promql` until `ok` holds for its first value, or 30 s.
    fn until(&self, promql: &str, ok: impl Fn(f64) -> bool) -> Option<f64> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let v = self.query(promql).first().copied();
            if v.is_some_and(&ok) || Instant::now() > deadline {
                return v;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn the_autoscaling_queries_read_the_gateways_queue_and_running_requests() {
    // One slow server and one request at a time: the rest wait in the gateway.
    let servers = VllmSimServer::pool(
        1,
        &[
            "--model",
            MODEL,
            "--time-to-first-token",
            "300ms",
            "--inter-token-latency",
            "100ms",
        ],
    );
    let port = free_port();
    let config = json!({
        "featureGates": ["flowControl"],
        "plugins": [{"type": "concurrency-detector",
                     "parameters": {"maxConcurrency": 1, "concurrencyMode": "requests"}},
                    // Observes TTFT and TPOT for the dashboard's latency panels.
                    {"type": "predicted-latency-producer",
                     "parameters": {"streamingMode": true}}],
        "saturationDetector": {"pluginRef": "concurrency-detector"},
        "flowControl": {"defaultRequestTTL": "60s"},
        "pool": {"name": POOL, "metricsEndpoint": {"port": port}}
    });
    let envoy = Envoy::start(&config, &VllmSimServer::addresses(&servers), 2);
    let prometheus = Prometheus::start(&format!("127.0.0.1:{port}"));
    // Prometheus hands new targets to its scraper after a few seconds: wait for a scrape.
    let up = prometheus.until("up", |v| v == 1.0);
    assert_eq!(up, Some(1.0), "prometheus never scraped the gateway");

    let queries = manifest_queries();
    assert!(queries.len() >= 4, "{queries:?}");
    let queue = queries
        .iter()
        .find(|(f, q)| f.starts_with("keda") && q.contains("queue_size"))
        .map(|(_, q)| q.clone())
        .expect("a queue trigger");
    let running = queries
        .iter()
        .find(|(f, q)| f.starts_with("keda") && q.contains("running"))
        .map(|(_, q)| q.clone())
        .expect("a running trigger");

    // Six requests of about 2 s each, one at a time: five wait.
    let listen = envoy.listen.clone();
    let clients: Vec<_> = (0..6)
        .map(|i| {
            let listen = listen.clone();
            std::thread::spawn(move || {
                // Half streamed: TPOT is observed on streamed responses.
                let body = json!({"model": MODEL, "prompt": format!("request {i}"),
                                  "max_tokens": 16, "stream": i % 2 == 0});
                http::post_json(&listen, "/v1/completions", &body.to_string())
                    .map(|r| r.status)
                    .unwrap_or(0)
            })
        })
        .collect();
    let waiting = prometheus.until(&queue, |v| v >= 1.0);
    assert!(
        waiting.is_some_and(|v| v >= 1.0),
        "the queue query reads {waiting:?} while requests wait: {queue}"
    );
    let busy = prometheus.until(&running, |v| v >= 1.0);
    assert!(busy.is_some_and(|v| v >= 1.0), "{running}: {busy:?}");
    // Every query of the manifests names series that exist (without its `or vector(0)`).
    for (file, q) in &queries {
        let bare = q.trim_end_matches(" or vector(0)");
        assert!(
            !prometheus.query(bare).is_empty(),
            "{file}: `{bare}` returns no series"
        );
    }
    for c in clients {
        assert_eq!(c.join().expect("client"), 200);
    }
    // One request the gateway refuses, for the error panel.
    let bad = http::post_json(&listen, "/v1/completions", "{not json").expect("bad request");
    assert_eq!(bad.status, 400);
    // Every dashboard panel plots data, in a unit that fits it (a rate needs two scrapes
    // of its counter: wait for the error's, then two more).
    let errors = prometheus.until("count(inference_objective_request_error_total)", |v| {
        v >= 1.0
    });
    assert_eq!(errors, Some(1.0));
    std::thread::sleep(Duration::from_millis(2_500));
    let panels = dashboard_panels();
    assert!(panels.len() >= 10);
    for (title, unit, exprs) in &panels {
        for e in exprs {
            assert_eq!(unit, unit_for(e), "panel `{title}`: unit for {e}");
            assert!(
                !prometheus.query(e).is_empty(),
                "panel `{title}`: `{e}` returns no series"
            );
        }
    }
    let idle = prometheus.until(&queue, |v| v == 0.0);
    assert_eq!(
        idle,
        Some(0.0),
        "the queue reads 0 once every request is served"
    );
    let done = prometheus.until(&running, |v| v == 0.0);
    assert_eq!(done, Some(0.0));
}
