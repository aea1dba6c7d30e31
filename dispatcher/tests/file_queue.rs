//! The embedded queue end to end: an OpenAI Batch input file through real Envoy, the
//! filter and vllm-sim, gated by the filter's own saturation read from Envoy's stats; a kill -9
//! mid-run and a restart lose and repeat nothing.

mod common;

use common::{completion, s, Gateway, Processor};
use std::collections::HashMap;
use tests::scratch_dir;

#[test]
fn the_file_path_resumes_after_a_kill_9_without_losing_or_repeating_a_request() {
    let gw = Gateway::start(
        2,
        5,
        &[
            "--time-to-first-token",
            "20ms",
            "--inter-token-latency",
            "10ms",
        ],
    );
    let dir = scratch_dir("file-queue");
    let (input, output) = (dir.join("in.jsonl"), dir.join("out.jsonl"));
    const N: usize = 150;
    let lines: Vec<String> = (0..N)
        .map(|i| {
            let (url, body) = if i % 3 == 0 {
                ("/v1/chat/completions", serde_json::json!({"model": tests::openai::MODEL,
                    "messages": [{"role": "user", "content": format!("q{i}")}], "max_tokens": 4}))
            } else {
                ("/v1/completions", completion(&format!("p{i}"), 4))
            };
            serde_json::json!({"custom_id": format!("c{i}"), "method": "POST", "url": url, "body": body}).to_string()
        })
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let args = [
        s("--gateway"),
        gw.url(),
        s("--input"),
        s(input.display()),
        s("--output"),
        s(output.display()),
        s("--metrics"),
        gw.stats_url(),
        s("--max-concurrency"),
        s(5),
        s("--metrics-interval"),
        s("200ms"),
    ];
    let count = || {
        std::fs::read_to_string(&output)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    let mut first = Processor::start(&args);
    assert!(
        tests::eventually(30, || count() >= N / 3),
        "no progress:\n{}",
        first.log_text()
    );
    first.kill9();
    let summary = Processor::start(&args).wait(60);
    assert!(
        summary["answered"].as_u64().unwrap() < N as u64,
        "the restart redid everything: {summary}"
    );
    let mut m: HashMap<String, Vec<serde_json::Value>> = HashMap::new();
    for l in std::fs::read_to_string(&output).unwrap().lines() {
        let v: serde_json::Value =
            serde_json::from_str(l).expect("every output line is whole JSON");
        m.entry(v["custom_id"].as_str().unwrap().to_string())
            .or_default()
            .push(v);
    }
    assert_eq!(m.len(), N);
    for i in 0..N {
        let r = &m[&format!("c{i}")];
        assert_eq!(r.len(), 1, "c{i} answered {} times", r.len());
        assert_eq!(r[0]["response"]["status_code"], 200, "{}", r[0]);
        assert!(r[0]["error"].is_null());
        let object = if i % 3 == 0 {
            "chat.completion"
        } else {
            "text_completion"
        };
        assert_eq!(r[0]["response"]["body"]["object"], object, "{}", r[0]);
    }
}
