//! `vllm-sim` server processes on ephemeral loopback ports, for the end-to-end tests.

use crate::paths;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// One running `vllm-sim`; killed when dropped.
pub struct VllmSimServer {
    child: Child,
    /// `ip:port` it listens on (and names itself by, in `x-sim-server`).
    pub address: String,
}

impl VllmSimServer {
    /// Starts `vllm-sim --port 0 <args>` and waits for its "listening on" line.
    pub fn start(args: &[&str]) -> VllmSimServer {
        Self::start_on(0, args)
    }

    /// Starts `vllm-sim --port <port> <args>` (0: an ephemeral port).
    pub fn start_on(port: u16, args: &[&str]) -> VllmSimServer {
        let mut child = Command::new(paths::vllm_sim())
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start vllm-sim: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(url.trim().to_string());
                }
            }
        });
        let address = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!("vllm-sim did not print its address within 20 s");
            }
        };
        VllmSimServer { child, address }
    }

    /// The addresses of `servers`.
    pub fn addresses(servers: &[VllmSimServer]) -> Vec<&str> {
        servers.iter().map(|s| s.address.as_str()).collect()
    }

    /// Starts `n` servers with the same arguments.
    pub fn pool(n: usize, args: &[&str]) -> Vec<VllmSimServer> {
        (0..n).map(|_| VllmSimServer::start(args)).collect()
    }

    /// `n` fast servers of [`crate::openai::MODEL`] (TTFT 5 ms, ITL 2 ms): the tests' default pool.
    pub fn fast_pool(n: usize) -> Vec<VllmSimServer> {
        let args = [
            "--model",
            crate::openai::MODEL,
            "--time-to-first-token",
            "5ms",
            "--inter-token-latency",
            "2ms",
        ];
        VllmSimServer::pool(n, &args)
    }
}

impl Drop for VllmSimServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
