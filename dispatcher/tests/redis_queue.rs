//! The Redis queue end to end: a real `redis-server`, real Envoy with the filter, real
//! `vllm-sim`s, the `dispatcher` binary. Requests are enqueued as llm-d-async's producer
//! does; results are read from `result-list` as its consumers do.

mod common;

use common::{completion, s, unix_now, Gateway, Processor, Redis};
use std::collections::HashMap;

/// Sims answering a 4-token completion in about 60 ms; 5 requests per endpoint.
fn gateway() -> Gateway {
    Gateway::start(
        2,
        5,
        &[
            "--time-to-first-token",
            "20ms",
            "--inter-token-latency",
            "10ms",
        ],
    )
}

fn args(gw: &Gateway, redis: &Redis, extra: &[&str]) -> Vec<String> {
    let mut a = vec![
        s("--gateway"),
        gw.url(),
        s("--redis"),
        redis.url(),
        s("--metrics"),
        gw.stats_url(),
        s("--max-concurrency"),
        s(5),
        s("--metrics-interval"),
        s("200ms"),
    ];
    a.extend(extra.iter().map(|x| x.to_string()));
    a
}

/// Results per id.
fn by_id(redis: &Redis) -> HashMap<String, Vec<serde_json::Value>> {
    let mut m: HashMap<String, Vec<serde_json::Value>> = HashMap::new();
    for r in redis.results() {
        m.entry(r["id"].as_str().unwrap().to_string())
            .or_default()
            .push(r);
    }
    m
}

fn assert_one_result_each(redis: &Redis, n: usize) {
    let m = by_id(redis);
    for i in 0..n {
        let id = format!("r{i}");
        let rs = m.get(&id).unwrap_or_else(|| panic!("no result for {id}"));
        assert_eq!(rs.len(), 1, "{id} answered {} times: {rs:?}", rs.len());
        assert_eq!(rs[0]["status_code"], 200, "{id}: {}", rs[0]);
        let body: serde_json::Value =
            serde_json::from_str(rs[0]["payload"].as_str().unwrap()).unwrap();
        assert_eq!(body["object"], "text_completion", "{body}");
    }
    assert_eq!(m.len(), n, "results for unknown ids");
}

#[test]
fn every_message_gets_exactly_one_result_even_across_a_kill_9_and_a_restart() {
    let gw = gateway();
    let redis = Redis::start();
    const N: usize = 120;
    let deadline = unix_now() + 600;
    for i in 0..N {
        redis.push(
            &format!("r{i}"),
            deadline,
            &completion(&format!("p{i}"), 4),
            "alice",
        );
    }
    // A short lease so the killed processor's requests come back quickly.
    let mut first = Processor::start(&args(&gw, &redis, &["--lease", "2s"]));
    assert!(
        tests::eventually(30, || redis.results().len() >= N / 3),
        "no progress:\n{}",
        first.log_text()
    );
    first.kill9();
    // Killed with requests leased and in flight: none is lost, none answered twice.
    let second = Processor::start(&args(
        &gw,
        &redis,
        &["--lease", "2s", "--exit-when-drained"],
    ));
    let summary = second.wait(60);
    assert_one_result_each(&redis, N);
    let mut c = redis.conn();
    let left: (u64, u64, u64) = redis::pipe()
        .zcard("request-sortedset")
        .zcard("retry-sortedset")
        .zcard("dispatcher:leases:request-sortedset")
        .query(&mut c)
        .unwrap();
    assert_eq!(left, (0, 0, 0));
    // The producer's active-token keys are cleaned up as llm-d-async's processor does.
    let active: Vec<String> = redis::cmd("KEYS")
        .arg("request-active:*")
        .query(&mut c)
        .unwrap();
    assert!(active.is_empty(), "{active:?}");
    assert_eq!(summary["status_429"], 0, "{summary}");
}

#[test]
fn two_processors_on_one_redis_split_the_work() {
    let gw = gateway();
    let redis = Redis::start();
    const N: usize = 160;
    let deadline = unix_now() + 600;
    for i in 0..N {
        redis.push(
            &format!("r{i}"),
            deadline,
            &completion(&format!("p{i}"), 4),
            "bob",
        );
    }
    let extra = [
        "--exit-when-drained",
        "--workers",
        "8",
        "--poll-interval",
        "50ms",
    ];
    let a = Processor::start(&args(&gw, &redis, &extra));
    let b = Processor::start(&args(&gw, &redis, &extra));
    let (sa, sb) = (a.wait(60), b.wait(60));
    assert_one_result_each(&redis, N);
    let (na, nb) = (
        sa["answered"].as_u64().unwrap(),
        sb["answered"].as_u64().unwrap(),
    );
    assert_eq!(na + nb, N as u64, "{sa} {sb}");
    assert!(
        na > 0 && nb > 0,
        "one processor did all the work: {sa} {sb}"
    );
}

#[test]
fn an_expired_deadline_gets_deadline_exceeded_and_is_never_dispatched() {
    let gw = gateway();
    let redis = Redis::start();
    let past = unix_now() - 5;
    for i in 0..5 {
        redis.push(&format!("late{i}"), past, &completion("late", 4), "carol");
    }
    redis.push("on-time", unix_now() + 600, &completion("fine", 4), "carol");
    let before = gw.upstream_requests();
    let summary = Processor::start(&args(&gw, &redis, &["--exit-when-drained"])).wait(30);
    let m = by_id(&redis);
    for i in 0..5 {
        let r = &m[&format!("late{i}")];
        assert_eq!(r.len(), 1);
        assert_eq!(r[0]["error_code"], "DEADLINE_EXCEEDED", "{}", r[0]);
        assert!(r[0].get("status_code").is_none(), "{}", r[0]);
    }
    assert_eq!(m["on-time"][0]["status_code"], 200);
    assert_eq!(summary["dispatched"], 1, "{summary}");
    assert_eq!(
        gw.upstream_requests() - before,
        1,
        "an expired request reached the pool"
    );
}

#[test]
fn requests_enter_as_sheddable_traffic_of_the_messages_tenant() {
    // With flow control on, the gateway records each request's flow: its fairness id
    // (from the message's metadata `userid`) and its priority (the `batch` objective, -10).
    let gw = Gateway::start_with(
        1,
        5,
        &[
            "--time-to-first-token",
            "10ms",
            "--inter-token-latency",
            "5ms",
        ],
        true,
    );
    let redis = Redis::start();
    for i in 0..3 {
        redis.push(
            &format!("r{i}"),
            unix_now() + 600,
            &completion("x", 2),
            "tenant-x",
        );
    }
    let summary = Processor::start(&args(&gw, &redis, &["--exit-when-drained"])).wait(30);
    assert_eq!(summary["answered"], 3, "{summary}");
    let flow = |prom: &str| {
        prom.lines().any(|l| {
            l.starts_with("inference_extension_flow_control_request_queue_duration_seconds_count{")
                && l.contains("fairness_id=\"tenant-x\"")
                && l.contains("priority=\"-10\"")
                && l.ends_with(" 3")
        })
    };
    // Histograms reach /stats/prometheus at Envoy's next stats flush.
    let mut prom = String::new();
    let seen = tests::eventually(10, || {
        prom = gw.envoy.prometheus();
        flow(&prom)
    });
    assert!(seen, "no flow (tenant-x, -10) with 3 requests:\n{prom}");
}
