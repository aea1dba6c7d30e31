//! The gate's failure modes end to end, against real Envoy + filter + vllm-sim, with a
//! metrics endpoint the test controls (to play metrics that lag or cannot be read):
//! a 429 storm closes the gate until the metrics say there is room again, and unreadable
//! metrics stop dispatch until they can be read.

mod common;

use common::{budget_log, completion, s, Gateway, MetricsStub, Processor};
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};
use tests::http;
use tests::scratch_dir;

fn write_input(dir: &Path, n: usize) -> (std::path::PathBuf, std::path::PathBuf) {
    let input = dir.join("in.jsonl");
    let lines: Vec<String> = (0..n)
        .map(|i| {
            serde_json::json!({"custom_id": format!("c{i}"), "method": "POST",
                "url": "/v1/completions", "body": completion(&format!("p{i}"), 2)})
            .to_string()
        })
        .collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    (input, dir.join("out.jsonl"))
}

fn statuses(out: &Path) -> HashMap<String, Vec<u64>> {
    let mut m: HashMap<String, Vec<u64>> = HashMap::new();
    for l in std::fs::read_to_string(out).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        let status = v["response"]["status_code"].as_u64().unwrap_or(0);
        m.entry(v["custom_id"].as_str().unwrap().to_string())
            .or_default()
            .push(status);
    }
    m
}

fn dispatched_at(log: &[serde_json::Value], i: usize) -> u64 {
    log[i]["dispatched"].as_u64().unwrap()
}

#[test]
fn a_429_storm_closes_the_gate_until_the_metrics_recover() {
    // One endpoint that holds one request: while an interactive request runs, the filter
    // answers sheddable (batch) requests with 429.
    let gw = Gateway::start(
        1,
        1,
        &[
            "--time-to-first-token",
            "20ms",
            "--inter-token-latency",
            "50ms",
        ],
    );
    let stub = MetricsStub::start(1);
    let dir = scratch_dir("gates-429");
    let (input, output) = write_input(&dir, 12);
    let log = dir.join("budget.jsonl");
    let listen = gw.envoy.listen.clone();
    // About 2 s of interactive work at priority 0.
    let interactive = std::thread::spawn(move || {
        let body = completion("interactive", 40).to_string();
        http::request(
            &listen,
            "POST",
            "/v1/completions",
            &[("content-type", "application/json")],
            body.as_bytes(),
        )
        .expect("interactive request")
        .status
    });
    std::thread::sleep(Duration::from_millis(300));
    // The metrics lag: they still say the pool is idle (S = 0).
    let p = Processor::start(&[
        s("--gateway"),
        gw.url(),
        s("--input"),
        s(input.display()),
        s("--output"),
        s(output.display()),
        s("--metrics"),
        stub.source(),
        s("--max-concurrency"),
        s(1),
        s("--metrics-interval"),
        s("250ms"),
        s("--budget-log"),
        s(log.display()),
    ]);
    let started = Instant::now();
    std::thread::sleep(Duration::from_millis(900));
    // Phase 1 (stale metrics, 429s): after each 429 nothing is sent until the next
    // metrics update, so at most one request per decision (the budget is 1).
    let storm = budget_log(&log);
    let n = storm.len();
    assert!(n >= 2, "{storm:?}");
    assert!(
        dispatched_at(&storm, n - 1) <= n as u64,
        "more dispatches than metrics updates during the 429 storm: {storm:?}"
    );
    // Phase 2: the metrics now show the pool saturated: no dispatch at all.
    stub.set(Some(1000));
    std::thread::sleep(Duration::from_millis(600));
    let at_start = budget_log(&log);
    std::thread::sleep(Duration::from_millis(900));
    let at_end = budget_log(&log);
    assert_eq!(
        dispatched_at(&at_start, at_start.len() - 1),
        dispatched_at(&at_end, at_end.len() - 1),
        "dispatched while the metrics said saturated: {at_end:?}"
    );
    assert_eq!(interactive.join().unwrap(), 200);
    // Phase 3: the metrics recover; every request completes, once.
    stub.set(Some(0));
    let summary = p.wait(60);
    assert!(
        summary["status_429"].as_u64().unwrap() >= 1,
        "no 429 seen: {summary}"
    );
    let m = statuses(&output);
    assert_eq!(m.len(), 12, "{m:?}");
    for (id, st) in &m {
        assert_eq!(st, &vec![200], "{id}");
    }
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[test]
fn unreadable_metrics_stop_dispatch_until_they_can_be_read() {
    let gw = Gateway::start(
        1,
        5,
        &[
            "--time-to-first-token",
            "10ms",
            "--inter-token-latency",
            "5ms",
        ],
    );
    let stub = MetricsStub::start(1);
    stub.set(None); // 500
    let dir = scratch_dir("gates-unreadable");
    let (input, output) = write_input(&dir, 5);
    let log = dir.join("budget.jsonl");
    let before = gw.upstream_requests();
    let p = Processor::start(&[
        s("--gateway"),
        gw.url(),
        s("--input"),
        s(input.display()),
        s("--output"),
        s(output.display()),
        s("--metrics"),
        stub.source(),
        s("--max-concurrency"),
        s(5),
        s("--metrics-interval"),
        s("200ms"),
        s("--budget-log"),
        s(log.display()),
    ]);
    std::thread::sleep(Duration::from_millis(1500));
    let closed = budget_log(&log);
    assert!(closed.len() >= 3, "{closed:?}");
    assert!(
        closed
            .iter()
            .all(|d| d["error"].is_string() && d["dispatched"] == 0),
        "{closed:?}"
    );
    assert_eq!(
        gw.upstream_requests(),
        before,
        "a request was sent with unreadable metrics"
    );
    stub.set(Some(0));
    let summary = p.wait(30);
    assert_eq!(summary["answered"], 5, "{summary}");
    assert_eq!(statuses(&output).len(), 5);
}
