//! The `vllm-sim` binary's contract: one "listening" line per rank on stdout,
//! a working server behind it, a clean exit on SIGTERM.

mod common;

use common::Client;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[tokio::test]
async fn binary_prints_one_line_per_rank_and_exits_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vllm-sim"))
        .args([
            "--port",
            "0",
            "--profile",
            "zero",
            "--data-parallel-size",
            "2",
            "--model",
            "m",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn vllm-sim");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let line = lines.next().expect("a line").expect("utf-8 line");
        let addr = line
            .strip_prefix("vllm-sim listening on http://")
            .unwrap_or_else(|| panic!("unexpected line {line:?}"));
        addrs.push(addr.parse::<std::net::SocketAddr>().expect("ip:port"));
    }
    assert_ne!(addrs[0], addrs[1]);
    for addr in &addrs {
        let mut c = Client::connect(*addr).await;
        let (status, _, headers) = c.call("GET", "/health", "").await;
        assert_eq!(status, 200);
        assert_eq!(headers["x-sim-server"], addr.to_string().as_str());
    }

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let Some(status) = status else {
        let _ = child.kill();
        panic!("vllm-sim did not exit on SIGTERM");
    };
    assert!(status.success(), "exit status {status:?}");
}
