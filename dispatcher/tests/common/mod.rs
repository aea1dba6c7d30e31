//! What the dispatcher's end-to-end tests share: a gateway (real Envoy with the filter in
//! front of `vllm-sim`), a real `redis-server`, the `dispatcher` binary as a process, and
//! a metrics endpoint whose saturation a test sets (to play stale or unreadable metrics).
#![allow(dead_code)]

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tests::envoy::Envoy;
use tests::openai::MODEL;
use tests::vllm_sim_server::VllmSimServer;
use tests::{free_port, scratch_dir};

/// Envoy + the filter in front of `servers` vllm-sims; `batch` is an objective of
/// priority -10; the concurrency detector counts `max` requests per endpoint.
pub struct Gateway {
    pub servers: Vec<VllmSimServer>,
    pub envoy: Envoy,
}

impl Gateway {
    pub fn start(servers: usize, max: u64, sim_args: &[&str]) -> Gateway {
        Self::start_with(servers, max, sim_args, false)
    }

    /// Like [`Gateway::start`], with the filter's `flowControl` gate on if `flow_control`.
    pub fn start_with(servers: usize, max: u64, sim_args: &[&str], flow_control: bool) -> Gateway {
        let mut args = vec!["--model", MODEL];
        args.extend_from_slice(sim_args);
        let servers = VllmSimServer::pool(servers, &args);
        let mut config = json!({
            "plugins": [{"type": "concurrency-detector", "parameters": {"maxConcurrency": max}}],
            "saturationDetector": {"pluginRef": "concurrency-detector"},
            "pool": {"objectives": [{"name": "batch", "priority": -10}]}
        });
        if flow_control {
            config["featureGates"] = json!(["flowControl"]);
        }
        let envoy = Envoy::start(&config, &VllmSimServer::addresses(&servers), 2);
        Gateway { servers, envoy }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.envoy.listen)
    }

    pub fn stats_url(&self) -> String {
        format!("envoy-stats=http://{}/stats/prometheus", self.envoy.admin)
    }

    /// Requests Envoy sent upstream so far.
    pub fn upstream_requests(&self) -> u64 {
        let r = tests::http::get(
            &self.envoy.admin,
            "/stats?filter=^cluster\\.pool\\.upstream_rq_total$",
        )
        .expect("stats");
        r.text()
            .split(':')
            .nth(1)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

/// A body for `MODEL`.
pub fn completion(prompt: &str, max_tokens: u32) -> Value {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": true})
}

/// A `redis-server` on a free loopback port, without persistence; killed when dropped.
pub struct Redis {
    child: Child,
    pub port: u16,
}

impl Redis {
    pub fn start() -> Redis {
        let bin = ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("redis-server is missing; scripts/setup --test-tools installs it");
        let port = free_port();
        let child = Command::new(bin)
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let r = Redis { child, port };
        let ok = tests::eventually(10, || {
            r.conn_opt()
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c).ok())
                .is_some()
        });
        assert!(ok, "redis-server did not answer PING within 10 s");
        r
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn conn_opt(&self) -> Option<redis::Connection> {
        redis::Client::open(self.url()).ok()?.get_connection().ok()
    }

    pub fn conn(&self) -> redis::Connection {
        self.conn_opt().expect("redis connection")
    }

    /// Enqueues a request as llm-d-async's producer does: the envelope scored by its
    /// deadline, with a request token.
    pub fn push(&self, id: &str, deadline: i64, payload: &Value, userid: &str) {
        let token = format!("tok-{id}");
        let member = json!({
            "internal": {"request_token": token},
            "request_kind": "redis",
            "data": {"id": id, "created": 1, "deadline": deadline, "payload": payload,
                     "metadata": {"userid": userid}}
        });
        let mut c = self.conn();
        let _: () = redis::pipe()
            .cmd("SET")
            .arg(format!("request-active:{id}"))
            .arg(&token)
            .ignore()
            .cmd("ZADD")
            .arg("request-sortedset")
            .arg(deadline)
            .arg(member.to_string())
            .ignore()
            .query(&mut c)
            .expect("enqueue");
    }

    /// Every result in `result-list`, oldest first.
    pub fn results(&self) -> Vec<Value> {
        let mut c = self.conn();
        let raw: Vec<String> = redis::cmd("LRANGE")
            .arg("result-list")
            .arg(0)
            .arg(-1)
            .query(&mut c)
            .expect("LRANGE");
        raw.iter()
            .rev()
            .map(|r| serde_json::from_str(r).expect("result JSON"))
            .collect()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `dispatcher` process; killed (SIGKILL) when dropped.
pub struct Processor {
    pub child: Child,
    pub log: PathBuf,
}

impl Processor {
    pub fn start(args: &[String]) -> Processor {
        let log = scratch_dir("dispatcher").join("stderr.log");
        let child = Command::new(env!("CARGO_BIN_EXE_dispatcher"))
            .args(args)
            .args(["--progress-every", "1s"])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start dispatcher");
        Processor { child, log }
    }

    /// Waits for the exit (at most `secs`) and returns the JSON summary it printed.
    pub fn wait(mut self, secs: u64) -> Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                let mut out = String::new();
                if let Some(mut o) = self.child.stdout.take() {
                    o.read_to_string(&mut out).expect("stdout");
                }
                assert!(
                    status.success(),
                    "dispatcher failed ({status}):\n{}",
                    self.log_text()
                );
                return serde_json::from_str(out.trim())
                    .unwrap_or_else(|e| panic!("summary `{out}`: {e}\n{}", self.log_text()));
            }
            assert!(
                Instant::now() < deadline,
                "dispatcher still running after {secs} s:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// kill -9.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Processor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- dispatcher log ---\n{}", self.log_text());
        }
    }
}

/// A Prometheus text endpoint serving the filter's two pool series with the saturation
/// the test sets (in thousandths, as Envoy's stats hold it); `None` answers 500.
pub struct MetricsStub {
    pub port: u16,
    saturation: Arc<Mutex<Option<u64>>>,
}

impl MetricsStub {
    pub fn start(ready: u64) -> MetricsStub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let saturation = Arc::new(Mutex::new(Some(0)));
        let s = saturation.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut line = String::new();
                while reader.read_line(&mut line).map(|n| n > 2).unwrap_or(false) {
                    line.clear();
                }
                let value = *s.lock().expect("lock");
                let reply = match value {
                    Some(v) => {
                        let body = format!(
                            "inference_extension_flow_control_pool_saturation{{inference_pool=\"default-pool\"}} {v}\n\
                             inference_pool_ready_pods{{name=\"default-pool\"}} {ready}\n"
                        );
                        format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len())
                    }
                    None => "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_string(),
                };
                let _ = stream.write_all(reply.as_bytes());
            }
        });
        MetricsStub { port, saturation }
    }

    pub fn set(&self, thousandths: Option<u64>) {
        *self.saturation.lock().expect("lock") = thousandths;
    }

    pub fn source(&self) -> String {
        format!(
            "envoy-stats=http://127.0.0.1:{}/stats/prometheus",
            self.port
        )
    }
}

/// Reads a budget log (one JSON line per gate decision).
pub fn budget_log(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

pub fn s(v: impl ToString) -> String {
    v.to_string()
}
