//! The client limits of the shipped Envoy bootstrap (`envoy/bootstrap.yaml.in`), through a
//! real Envoy with the filter: half-sent requests are closed at the header timeout while a
//! slow but live stream longer than that timeout runs to its end; connections beyond the
//! overload manager's limit are refused while the admin API still answers.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use tests::envoy::Envoy;
use tests::openai::{completion, MODEL};
use tests::vllm_sim_server::VllmSimServer;
use tests::{http, paths, scratch_dir};

/// A duration field of the shipped bootstrap (seconds), if it is set.
fn shipped_seconds(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(paths::root().join("envoy/bootstrap.yaml.in")).ok()?;
    text.lines().find_map(|l| {
        l.trim()
            .strip_prefix(&format!("{field}: "))?
            .strip_suffix('s')?
            .parse()
            .ok()
    })
}

fn launch(servers: &[&str], edit: impl FnOnce(&str) -> Result<String, String>) -> Envoy {
    let dir = scratch_dir("limits");
    let path = dir.join("filter.json");
    std::fs::write(&path, "{}").unwrap();
    Envoy::launch_edited(&path, servers, 2, &[], edit).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn half_sent_requests_are_closed_at_the_header_timeout_and_a_long_stream_is_not_cut() {
    // The bound this test holds the configuration to: 200 half-sent heads are gone within
    // the header timeout (at most 10 s) and a little slack, not held for minutes.
    let timeout = shipped_seconds("request_headers_timeout").unwrap_or(10);
    assert!(
        timeout <= 10,
        "request_headers_timeout {timeout} s is longer than 10 s"
    );
    // A stream of about 14 s: a token every 100 ms.
    let server = VllmSimServer::start(&[
        "--model",
        MODEL,
        "--time-to-first-token",
        "5ms",
        "--inter-token-latency",
        "100ms",
    ]);
    let envoy = launch(&[&server.address], |b| Ok(b.to_string()));
    let listen = envoy.listen.clone();
    let stream = std::thread::spawn(move || {
        let started = Instant::now();
        let r = http::post_json(&listen, "/v1/completions", &completion("long", 140, true));
        (started, r)
    });

    let started = Instant::now();
    let mut open: Vec<(TcpStream, Option<Duration>)> = (0..200)
        .map(|i| {
            let mut s = TcpStream::connect(&envoy.listen).expect("connect");
            let head = format!(
                "POST /v1/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\nx-half: {i}\r\n"
            );
            s.write_all(head.as_bytes()).expect("write a half head");
            s.set_nonblocking(true).unwrap();
            (s, None)
        })
        .collect();
    let deadline = started + Duration::from_secs(timeout + 8);
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline && open.iter().any(|(_, closed)| closed.is_none()) {
        for (s, closed) in open.iter_mut().filter(|(_, c)| c.is_none()) {
            match s.read(&mut buf) {
                Ok(0) => *closed = Some(started.elapsed()),
                Ok(_) => {} // Envoy's 408; the close follows
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => *closed = Some(started.elapsed()),
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let closed: Vec<Duration> = open.iter().filter_map(|(_, c)| *c).collect();
    assert_eq!(
        closed.len(),
        200,
        "{} of 200 half-sent requests still held after {} s",
        200 - closed.len(),
        timeout + 8
    );
    let first = closed.iter().min().copied().unwrap_or_default();
    assert!(
        first >= Duration::from_secs(timeout.saturating_sub(1)),
        "closed after {first:?}, before the header timeout"
    );
    assert!(envoy.stat("http.inference.downstream_rq_header_timeout") >= 200);

    let (stream_started, r) = stream.join().unwrap();
    let r = r.expect("the long stream");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.text().contains("data: [DONE]"),
        "stream cut: {}",
        r.text()
    );
    let last = r.pieces.last().map(|(at, _)| *at).unwrap();
    assert!(
        last.duration_since(stream_started) > Duration::from_secs(timeout),
        "the stream ended within the header timeout; it does not show that a long one lives"
    );
    assert!(tests::eventually(5, || envoy
        .stat("http.inference.downstream_cx_active")
        == 0));
}

#[test]
fn connections_beyond_the_limit_are_refused_and_the_admin_api_still_answers() {
    let server = VllmSimServer::start(&["--model", MODEL]);
    // The shipped limit (50,000) scaled down to 20 so the test can reach it.
    let envoy = launch(&[&server.address], |b| {
        let from = "max_active_downstream_connections: 50000";
        if !b.contains(from) {
            return Err(format!("the bootstrap has no `{from}`"));
        }
        Ok(b.replace(from, "max_active_downstream_connections: 20"))
    });
    let held: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(&envoy.listen).expect("connect"))
        .collect();
    assert!(tests::eventually(5, || envoy
        .stat("http.inference.downstream_cx_active")
        == 20));
    // Over the limit: accepted by the kernel, closed by Envoy without an answer.
    for _ in 0..5 {
        let r = http::post_json(&envoy.listen, "/v1/completions", &completion("x", 2, false));
        assert!(
            r.is_err(),
            "a connection over the limit was served: {:?}",
            r.map(|r| r.status)
        );
    }
    let overflow: u64 = http::get(&envoy.admin, "/stats?filter=downstream_global_cx_overflow")
        .expect("the admin API answers at the limit")
        .text()
        .lines()
        .filter_map(|l| l.rsplit(": ").next()?.trim().parse::<u64>().ok())
        .sum();
    assert!(overflow >= 5, "global_cx_overflow {overflow}");
    drop(held);
    assert!(tests::eventually(5, || {
        http::post_json(&envoy.listen, "/v1/completions", &completion("x", 2, false))
            .is_ok_and(|r| r.status == 200)
    }));
}
