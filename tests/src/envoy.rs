//! A real Envoy 1.40 with the filter, on ephemeral loopback ports.

use crate::{http, paths, scratch_dir};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running Envoy; killed when dropped (its log is printed if the test failed).
pub struct Envoy {
    child: Child,
    log: PathBuf,
    /// `127.0.0.1:port` of the inference listener.
    pub listen: String,
    /// `127.0.0.1:port` of the admin API.
    pub admin: String,
}

impl Envoy {
    /// Starts Envoy with `workers` worker threads in front of `endpoints`, with the
    /// filter configured by `config` (JSON; `pool.endpoints` is filled in).
    pub fn start(config: &serde_json::Value, endpoints: &[&str], workers: u32) -> Envoy {
        Self::start_with(config, endpoints, workers, true)
    }

    /// Like [`Envoy::start`], optionally without the filter (plain Envoy).
    pub fn start_with(
        config: &serde_json::Value,
        endpoints: &[&str],
        workers: u32,
        with_filter: bool,
    ) -> Envoy {
        let dir = scratch_dir("envoy");
        let config_path = dir.join("filter.json");
        std::fs::write(&config_path, config.to_string()).expect("write filter config");
        let mut extra = Vec::new();
        if !with_filter {
            extra.push("--no-filter".to_string());
        }
        Self::launch(&config_path, endpoints, workers, &extra).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts Envoy with the filter configured by the file at `config_path` (JSON or YAML,
    /// as `scripts/lib/render.py --config` takes it), `extra` render.py arguments, and
    /// returns why it could not start instead of panicking (the render error, or Envoy's
    /// log when it refused the configuration).
    pub fn launch(
        config_path: &std::path::Path,
        endpoints: &[&str],
        workers: u32,
        extra: &[String],
    ) -> Result<Envoy, String> {
        Self::launch_edited(
            config_path,
            endpoints,
            workers,
            extra,
            |b| Ok(b.to_string()),
        )
    }

    /// Like [`Envoy::launch`], with the rendered bootstrap passed through `edit` first
    /// (e.g. a shipped limit scaled down so a test can reach it).
    pub fn launch_edited(
        config_path: &std::path::Path,
        endpoints: &[&str],
        workers: u32,
        extra: &[String],
        edit: impl FnOnce(&str) -> Result<String, String>,
    ) -> Result<Envoy, String> {
        let dir = scratch_dir("envoy");
        let bootstrap = dir.join("bootstrap.yaml");
        let mut render = Command::new("python3");
        render
            .arg(paths::render())
            .arg("--wasm")
            .arg(paths::wasm())
            .arg("--config")
            .arg(config_path)
            .arg("--endpoints")
            .arg(endpoints.join(","))
            .args(extra);
        let out = render.output().map_err(|e| format!("run render.py: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "render.py failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let rendered = edit(&String::from_utf8_lossy(&out.stdout))?;
        std::fs::write(&bootstrap, rendered).map_err(|e| format!("write bootstrap: {e}"))?;
        let admin_path = dir.join("admin-address");
        let log = dir.join("envoy.log");
        let child = Command::new(paths::envoy())
            .arg("-c")
            .arg(&bootstrap)
            .args([
                "--concurrency",
                &workers.to_string(),
                "--disable-hot-restart",
            ])
            .args(["-l", "warning", "--component-log-level", "wasm:info"])
            .arg("--admin-address-path")
            .arg(&admin_path)
            .arg("--log-path")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("start envoy: {e}"))?;
        let mut envoy = Envoy {
            child,
            log,
            listen: String::new(),
            admin: String::new(),
        };
        envoy.try_wait_ready(&admin_path)?;
        Ok(envoy)
    }

    fn try_wait_ready(&mut self, admin_path: &PathBuf) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("envoy exited with {status}:\n{}", self.log_text()));
            }
            if let Ok(a) = std::fs::read_to_string(admin_path) {
                if !a.trim().is_empty() {
                    self.admin = a.trim().to_string();
                    if let Ok(r) = http::get(&self.admin, "/ready") {
                        if r.status == 200 {
                            self.listen = self.listener_address();
                            return Ok(());
                        }
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("envoy not ready within 30 s:\n{}", self.log_text()))
    }

    fn listener_address(&self) -> String {
        let r = http::get(&self.admin, "/listeners?format=json").expect("admin /listeners");
        let v: serde_json::Value = serde_json::from_slice(&r.body).expect("listeners JSON");
        let port = v["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
            .as_u64()
            .expect("listener port");
        format!("127.0.0.1:{port}")
    }

    /// Envoy's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A counter or gauge of the admin `/stats` (0 when absent).
    pub fn stat(&self, name: &str) -> u64 {
        let r = http::get(&self.admin, &format!("/stats?filter=^{name}$")).expect("admin /stats");
        r.text()
            .lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(": ")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    }

    /// Envoy's Prometheus output.
    pub fn prometheus(&self) -> String {
        let r = http::get(&self.admin, "/stats/prometheus").expect("admin /stats/prometheus");
        String::from_utf8_lossy(&r.body).into_owned()
    }

    /// Envoy's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- envoy log ---\n{}", self.log_text());
        }
    }
}
