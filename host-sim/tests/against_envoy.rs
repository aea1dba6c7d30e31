//! The same scenarios through the real Envoy 1.40 (end to end, loopback) and through
//! host-sim, with the same observable outcomes: statuses, error bodies, the headers the
//! filter writes, and the filter's metric lines in `/stats/prometheus`.
//!
//! Needs the release `.wasm` and `.venv/bin/envoy` (scripts/setup, scripts/test).

mod common;

use common::{sum_series, MODEL};
use host_sim::{ms, Outcome, RequestSpec, Sim, SimConfig, SimpleUpstream};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tests::envoy::Envoy;
use tests::http;
use tests::openai::completion;

/// A minimal OpenAI-style model server on loopback (non-streaming JSON answers after
/// `delay`), naming itself in `x-sim-server` like vllm-sim.
struct Server {
    address: String,
    stop: Arc<AtomicBool>,
}

impl Server {
    fn start(delay: Duration) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let (addr, stop2) = (address.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let addr = addr.clone();
                std::thread::spawn(move || serve(conn, &addr, delay));
            }
        });
        Server { address, stop }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(&self.address);
    }
}

fn serve(conn: TcpStream, addr: &str, delay: Duration) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut out = conn;
    for _ in 0..10_000 {
        let mut len = 0usize;
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        std::thread::sleep(delay);
        let answer = json!({"id": "cmpl-1", "object": "text_completion", "model": MODEL,
            "choices": [{"index": 0, "text": "tok", "finish_reason": "length"}]})
        .to_string();
        let resp = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-sim-server: {addr}\r\ncontent-length: {}\r\n\r\n{answer}",
            answer.len()
        );
        if out.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

/// A loopback address nobody listens on.
fn dead_address() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// The filter's own metric lines (sorted), from a Prometheus text.
/// The filter's metric lines that do not depend on real time: counters, gauges kept by
/// requests, and histogram counts. Left out: histogram buckets and sums (durations are
/// real in Envoy, virtual in host-sim) and the gauges a timer publishes (pool averages,
/// prefix index size), which appear only once that timer has run.
fn filter_lines(prom: &str) -> Vec<String> {
    // Set on the scrape-lease holder's timer, whose phase differs between the two runs.
    let periodic = [
        "inference_pool_",
        "inference_extension_prefix_indexer_size",
        "inference_extension_flow_control_pool_saturation",
    ];
    let mut v: Vec<String> = prom
        .lines()
        .filter(|l| l.starts_with("inference_") || l.starts_with("# TYPE inference_"))
        .filter(|l| {
            !periodic
                .iter()
                .any(|p| l.trim_start_matches("# TYPE ").starts_with(p))
        })
        .filter(|l| !l.contains("_bucket{") && !l.contains("_sum{"))
        // One series per endpoint: which endpoint served depends on real timing; the
        // totals are compared separately (`attempts`).
        .filter(|l| !l.starts_with("inference_extension_scheduler_attempts_total{"))
        // Each VM times its first decision's plugins: the count is how many workers made a
        // decision, which depends on how the kernel spread the client's connections over
        // Envoy's workers (compared separately: `plugin_timings`).
        .filter(|l| !l.starts_with("inference_extension_plugin_duration_seconds_count{"))
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

/// The plugins timed, each with its count of timed decisions.
fn plugin_timings(prom: &str) -> Vec<(String, f64)> {
    let mut v: Vec<(String, f64)> = prom
        .lines()
        .filter_map(|l| l.strip_prefix("inference_extension_plugin_duration_seconds_count{"))
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(labels, n)| (labels.to_string(), n.parse().unwrap_or(f64::NAN)))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// Scheduling attempts with `status`, summed over the per-endpoint series.
fn attempts(prom: &str, status: &str) -> f64 {
    sum_series(
        prom,
        &format!("inference_extension_scheduler_attempts_total{{status=\"{status}\","),
    )
}

/// What a client observes of one answer, comparable across Envoy and host-sim.
#[derive(Debug, PartialEq)]
struct Seen {
    status: u16,
    content_type: Option<String>,
    error_type: Value,
    error_param: Value,
    served_is_set: bool,
}

fn seen_envoy(r: &http::Response) -> Seen {
    let j: Value = serde_json::from_slice(&r.body).unwrap_or_default();
    Seen {
        status: r.status,
        content_type: r.header("content-type").map(str::to_string),
        error_type: j["error"]["type"].clone(),
        error_param: j["error"]["param"].clone(),
        served_is_set: r.header("x-gateway-destination-endpoint-served").is_some(),
    }
}

fn seen_sim(o: &Outcome) -> Seen {
    let j = o.json();
    Seen {
        status: o.status.unwrap_or(0),
        content_type: o.header("content-type").map(str::to_string),
        error_type: j["error"]["type"].clone(),
        error_param: j["error"]["param"].clone(),
        served_is_set: o.header("x-gateway-destination-endpoint-served").is_some(),
    }
}

fn requests() -> Vec<(&'static str, String)> {
    let good = |i: usize| completion(&format!("hello {i}"), 2, false);
    let mut v: Vec<(&'static str, String)> = (0..5).map(|i| ("/v1/completions", good(i))).collect();
    v.push(("/v1/completions", "{not json".into()));
    v.push(("/v1/completions", r#"{"prompt":"no model"}"#.into()));
    v.push((
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": []}).to_string(),
    ));
    v.push(("/v1/completions", completion(&"x".repeat(8000), 1, false)));
    v.push((
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).to_string(),
    ));
    v
}

#[test]
fn the_same_requests_give_the_same_answers_and_metrics_in_envoy_and_in_host_sim() {
    let servers: Vec<Server> = (0..3)
        .map(|_| Server::start(Duration::from_millis(5)))
        .collect();
    let eps: Vec<String> = servers.iter().map(|s| s.address.clone()).collect();
    let ep_refs: Vec<&str> = eps.iter().map(String::as_str).collect();
    let pool = json!({"maxRequestBodyBytes": 4096});
    let envoy = Envoy::start(&json!({"pool": pool}), &ep_refs, 2);
    let mut from_envoy = Vec::new();
    for (path, body) in requests() {
        let r = http::post_json(&envoy.listen, path, &body).unwrap();
        if r.status == 200 {
            assert_eq!(
                r.header("x-gateway-destination-endpoint-served"),
                r.header("x-sim-server"),
                "Envoy: served where the gateway said"
            );
        }
        from_envoy.push(seen_envoy(&r));
    }
    // Envoy shows histograms at its next stats flush (1 s in this bootstrap).
    std::thread::sleep(Duration::from_millis(1300));
    let envoy_prom = envoy.prometheus();
    let envoy_metrics = filter_lines(&envoy_prom);

    let config = json!({"pool": {"maxRequestBodyBytes": 4096, "endpoints": eps}}).to_string();
    let mut sim = Sim::new(SimConfig::new(&config).workers(2)).unwrap();
    for e in &eps {
        sim.add_endpoint(e, Box::new(SimpleUpstream::new(e).ttft(ms(5))));
    }
    sim.add_invariant(common::within_ledger());
    // One at a time, as the Envoy client sent them.
    sim.add_requests(
        requests()
            .into_iter()
            .enumerate()
            .map(|(i, (path, body))| RequestSpec::post(path, body).at(ms(10 + 100 * i as u64))),
    );
    sim.run().unwrap();
    let from_sim: Vec<Seen> = sim.outcomes().iter().map(seen_sim).collect();
    for o in sim.outcomes().iter().filter(|o| o.status == Some(200)) {
        assert_eq!(
            o.header("x-gateway-destination-endpoint-served"),
            o.header("x-sim-server")
        );
    }
    assert_eq!(from_sim, from_envoy);
    let statuses: Vec<u16> = from_envoy.iter().map(|s| s.status).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 400, 400, 400, 413, 200]);
    assert_eq!(filter_lines(&sim.prometheus()), envoy_metrics);
    // The same plugins timed, each in the first decision of one or both workers.
    let (envoy_timed, sim_timed) = (
        plugin_timings(&envoy_prom),
        plugin_timings(&sim.prometheus()),
    );
    let names = |v: &[(String, f64)]| v.iter().map(|(l, _)| l.clone()).collect::<Vec<_>>();
    assert_eq!(names(&envoy_timed), names(&sim_timed));
    assert_eq!(envoy_timed.len(), 5, "{envoy_prom}");
    for (labels, n) in envoy_timed.iter().chain(&sim_timed) {
        assert!((1.0..=2.0).contains(n), "{labels}: timed {n} times");
    }
    assert_eq!(attempts(&envoy_prom, "success"), 6.0, "{envoy_prom}");
    assert_eq!(attempts(&sim.prometheus(), "success"), 6.0);
}

#[test]
fn a_router_503_for_a_dead_endpoint_looks_the_same_in_envoy_and_in_host_sim() {
    let dead = dead_address();
    // No scrapes: a failed scrape would take the endpoint out of the candidates (the
    // filter's own 503) at a moment that depends on real timing; this compares the router's.
    let no_scrapes = json!({"dataLayer": {"sources": []}});
    let envoy = Envoy::start(&no_scrapes, &[dead.as_str()], 1);
    let body = completion("hi", 1, false);
    let r = http::post_json(&envoy.listen, "/v1/completions", &body).unwrap();
    // Envoy shows histograms at its next stats flush (1 s in this bootstrap).
    std::thread::sleep(Duration::from_millis(1300));
    let envoy_prom = envoy.prometheus();
    let envoy_metrics = filter_lines(&envoy_prom);

    let config = json!({"dataLayer": {"sources": []}, "pool": {"endpoints": [dead]}}).to_string();
    let mut sim = Sim::new(SimConfig::new(&config).workers(1)).unwrap();
    sim.add_requests([RequestSpec::post("/v1/completions", body.clone()).at(ms(5))]);
    sim.run().unwrap();
    let o = sim.outcome(0);
    assert_eq!(seen_sim(o), seen_envoy(&r));
    assert_eq!(r.status, 503);
    assert_eq!(
        r.header("x-gateway-destination-endpoint-served"),
        o.header("x-gateway-destination-endpoint-served")
    );
    assert!(
        r.text().starts_with("upstream connect error"),
        "{}",
        r.text()
    );
    assert!(
        o.text().starts_with("upstream connect error"),
        "{}",
        o.text()
    );
    assert_eq!(filter_lines(&sim.prometheus()), envoy_metrics);
    // The filter scheduled it (the router, not the filter, failed it), in both.
    assert_eq!(attempts(&envoy_prom, "success"), 1.0, "{envoy_prom}");
    assert_eq!(attempts(&sim.prometheus(), "success"), 1.0);
}

#[test]
fn a_client_that_disconnects_mid_request_is_released_in_envoy_and_in_host_sim() {
    let slow = Server::start(Duration::from_millis(1500));
    let envoy = Envoy::start(&json!({}), &[slow.address.as_str()], 2);
    let running = format!("inference_objective_running_requests{{model_name=\"{MODEL}\"}}");
    let body = completion("slow", 1, false);
    let mut s = TcpStream::connect(&envoy.listen).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let during = host_sim::prometheus::value(&envoy.prometheus(), &running);
    drop(s);
    std::thread::sleep(Duration::from_millis(300));
    let after = host_sim::prometheus::value(&envoy.prometheus(), &running);
    assert_eq!((during, after), (Some(1.0), Some(0.0)), "Envoy");

    let config = json!({"pool": {"endpoints": [slow.address]}}).to_string();
    let mut sim = Sim::new(SimConfig::new(&config).workers(2)).unwrap();
    sim.add_endpoint(
        &slow.address,
        Box::new(SimpleUpstream::new(&slow.address).ttft(ms(1500))),
    );
    sim.add_requests([RequestSpec::post("/v1/completions", body)
        .at(ms(5))
        .disconnect_after(ms(300))]);
    sim.run_until(ms(200)).unwrap();
    let during_sim = sim.metric(&running);
    sim.run().unwrap();
    assert_eq!(
        (during_sim, sim.metric(&running)),
        (during, after),
        "host-sim"
    );
}

#[test]
fn concurrent_requests_are_spread_the_same_way_in_envoy_and_in_host_sim() {
    // Twelve requests in flight together over three servers: whichever worker picks,
    // least-in-flight across workers gives each server exactly four.
    let servers: Vec<Server> = (0..3)
        .map(|_| Server::start(Duration::from_millis(800)))
        .collect();
    let eps: Vec<String> = servers.iter().map(|s| s.address.clone()).collect();
    let ep_refs: Vec<&str> = eps.iter().map(String::as_str).collect();
    let envoy = Envoy::start(&json!({}), &ep_refs, 2);
    let body = completion("p", 1, false);
    let served: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..12)
            .map(|_| {
                let (listen, body) = (&envoy.listen, &body);
                s.spawn(move || {
                    let r = http::post_json(listen, "/v1/completions", body).unwrap();
                    assert_eq!(r.status, 200);
                    r.header("x-sim-server").unwrap().to_string()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let count = |list: &[String]| {
        let mut c: Vec<usize> = eps
            .iter()
            .map(|e| list.iter().filter(|s| *s == e).count())
            .collect();
        c.sort_unstable();
        c
    };
    assert_eq!(count(&served), vec![4, 4, 4], "Envoy: {served:?}");

    let config = json!({"pool": {"endpoints": eps}}).to_string();
    let mut sim = Sim::new(SimConfig::new(&config).workers(2).preempt(0.5)).unwrap();
    for e in &eps {
        sim.add_endpoint(e, Box::new(SimpleUpstream::new(e).ttft(ms(800))));
    }
    sim.add_invariant(common::within_ledger());
    sim.add_requests(
        (0..12).map(|i| RequestSpec::post("/v1/completions", body.clone()).at(ms(10) + i * 20_000)),
    );
    sim.run().unwrap();
    let sim_served: Vec<String> = sim
        .outcomes()
        .iter()
        .map(|o| o.header("x-sim-server").unwrap().to_string())
        .collect();
    assert_eq!(
        count(&sim_served),
        vec![4, 4, 4],
        "host-sim: {sim_served:?}"
    );
}
