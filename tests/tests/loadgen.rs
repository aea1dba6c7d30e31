//! The `loadgen` binary end to end against real `vllm-sim` servers: what it counts
//! must match what the servers say they did. No timing assertions.

use serde_json::Value;
use std::process::Command;
use tests::vllm_sim_server::VllmSimServer;

fn loadgen(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(args)
        .output()
        .expect("run loadgen");
    assert!(
        out.status.success(),
        "loadgen {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "loadgen printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn a_closed_loop_streamed_run_is_counted_like_the_servers_count_it() {
    let servers = VllmSimServer::pool(2, &["--profile", "zero"]);
    let urls = format!("{},{}", servers[0].address, servers[1].address);
    let records = tests::scratch_dir("loadgen").join("records.jsonl");
    let s = loadgen(&[
        "--url",
        &urls,
        "--server-metrics",
        &urls,
        "--concurrency",
        "4",
        "--requests",
        "40",
        "--duration",
        "60s",
        "--groups",
        "2",
        "--prompts-per-group",
        "3",
        "--system-prompt-len",
        "64",
        "--question-len",
        "8",
        "--output-len",
        "5",
        "--records",
        records.to_str().unwrap(),
        "--label",
        "e2e",
    ]);
    assert_eq!(s["label"], "e2e");
    assert_eq!(s["requests"]["sent"], 40);
    assert_eq!(s["requests"]["ok"], 40, "{s:#}");
    assert_eq!(s["status"]["200"], 40);
    assert_eq!(s["output_tokens"], 200, "5 tokens each, ignore_eos");
    assert_eq!(s["ttft_ms"]["count"], 40);
    // 4 token reads or more per request: at least 4 gaps each.
    assert!(s["itl_ms"]["count"].as_u64().unwrap() >= 40 * 4, "{s:#}");
    // Round-robin over the two targets; the servers name themselves by address.
    for server in &servers {
        assert_eq!(s["servers"][&server.address]["requests"], 20, "{s:#}");
        let m = &s["server_metrics"][&server.address];
        assert_eq!(m["requests"], 20.0, "{s:#}");
        assert_eq!(m["generation_tokens"], 100.0, "{s:#}");
        assert_eq!(m["share"], 0.5);
    }
    // Two groups of 64-token system prompts, repeated: the servers report prefix hits,
    // and the client saw the same cached tokens in the responses' usage.
    let rate = s["prefix_cache_hit_rate"].as_f64().unwrap();
    assert!(rate > 0.3 && rate < 1.0, "{s:#}");
    let client_rate = s["client_cached_token_rate"].as_f64().unwrap();
    assert!((client_rate - rate).abs() < 0.02, "{s:#}");
    let lines: Vec<Value> = std::fs::read_to_string(&records)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 40);
    assert!(lines
        .iter()
        .all(|r| r["status"] == 200 && r["output_tokens"] == 5));
    let indexes: Vec<u64> = lines.iter().map(|r| r["index"].as_u64().unwrap()).collect();
    assert_eq!(indexes, (0..40).collect::<Vec<_>>());
}

#[test]
fn an_open_loop_chat_run_with_tenants_and_priorities() {
    let servers = VllmSimServer::pool(1, &["--profile", "zero"]);
    let url = servers[0].address.as_str();
    let s = loadgen(&[
        "--url",
        url,
        "--api",
        "chat",
        "--no-stream",
        "--qps",
        "200",
        "--requests",
        "30",
        "--duration",
        "60s",
        "--tenants",
        "3",
        "--priorities",
        "critical,sheddable",
        "--output-len",
        "3",
        "--new-connection",
        "--seed",
        "4",
    ]);
    assert_eq!(s["mode"], "open");
    assert_eq!(s["requests"]["ok"], 30, "{s:#}");
    assert_eq!(s["requests"]["new_connections"], 30);
    assert_eq!(s["output_tokens"], 90);
    assert_eq!(s["ttft_ms"], Value::Null, "no TTFT without streaming");
    assert_eq!(s["latency_ms"]["count"], 30);
    assert_eq!(s["workload"]["api"], "/v1/chat/completions");
    assert_eq!(s["servers"][url]["share"], 1.0);
}

#[test]
fn failures_are_counted_not_fatal() {
    // A port nobody listens on: every request fails to connect.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let s = loadgen(&[
        "--url",
        &dead,
        "--concurrency",
        "2",
        "--requests",
        "6",
        "--server-metrics",
        &dead,
    ]);
    assert_eq!(s["requests"]["sent"], 6);
    assert_eq!(s["requests"]["ok"], 0);
    assert_eq!(s["errors"]["connect"], 6, "{s:#}");
    assert_eq!(s["prefix_cache_hit_rate"], Value::Null);
    assert!(s["server_metrics"][&dead]["error"].is_string());

    // A server that answers 429 to everything (failure injection).
    let servers = VllmSimServer::pool(
        1,
        &[
            "--profile",
            "zero",
            "--failure-injection-rate",
            "100",
            "--failure-types",
            "rate_limit",
        ],
    );
    let s = loadgen(&["--url", &servers[0].address, "--requests", "5"]);
    assert_eq!(s["requests"]["ok"], 0);
    assert_eq!(s["status"]["429"], 5, "{s:#}");
}

#[test]
fn bad_command_lines_exit_with_status_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(["--qps", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--url"));
    let out = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("--prompts-per-group"));
}
