//! `--request-priority`: vLLM's body `priority` reaches the model server through Envoy and
//! the filter. A server with `--scheduling-policy priority` serves the requests; one with
//! vLLM's default `fcfs` refuses them with vLLM's 400, which shows the field arrived.

mod common;

use common::{completion, s, Gateway, Processor};
use serde_json::Value;
use tests::scratch_dir;

fn run(policy: &str) -> Vec<Value> {
    let gw = Gateway::start(1, 8, &["--profile", "zero", "--scheduling-policy", policy]);
    let dir = scratch_dir(&format!("request-priority-{policy}"));
    let (input, output) = (dir.join("in.jsonl"), dir.join("out.jsonl"));
    let lines: Vec<String> = (0..6)
        .map(|i| {
            serde_json::json!({"custom_id": format!("c{i}"), "method": "POST",
                "url": "/v1/completions", "body": completion(&format!("p{i}"), 2)})
            .to_string()
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
        s("--gate"),
        s("constant:1"),
        s("--workers"),
        s(2),
        s("--request-priority"),
        s(10),
    ];
    Processor::start(&args).wait(60);
    std::fs::read_to_string(&output)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn the_request_priority_reaches_the_model_server_in_the_body() {
    let served = run("priority");
    assert_eq!(served.len(), 6);
    for r in &served {
        assert_eq!(r["response"]["status_code"], 200, "{r}");
    }
    let refused = run("fcfs");
    assert_eq!(refused.len(), 6);
    for r in &refused {
        assert_eq!(r["response"]["status_code"], 400, "{r}");
        assert_eq!(
            r["response"]["body"]["error"]["message"],
            "Got priority 10 but Priority scheduling is not enabled.",
            "{r}"
        );
    }
}
