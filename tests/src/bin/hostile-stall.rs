//! The worst stall hostile requests cause well-formed ones, through a real Envoy with the
//! filter (2 workers) in front of one `vllm-sim`: for each class of hostile request, a
//! few well-formed clients send completions back to back while hostile clients send
//! theirs, and the well-formed requests' latency (p50, p99, max) is printed beside a
//! phase without hostile traffic, with Envoy's heap before and after; then the same
//! phases through Envoy without the filter (what Envoy and the server alone cost on this
//! machine).
//!
//! ```sh
//! cargo run -p tests --release --bin hostile-stall -- [SECONDS_PER_PHASE]   # default 10
//! ```
//!
//! Needs the release `.wasm`, release `vllm-sim` and Envoy in `.venv` (`scripts/test` or
//! `scripts/bench` build them).

use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tests::envoy::Envoy;
use tests::http;
use tests::openai::MODEL;
use tests::vllm_sim_server::VllmSimServer;

/// Well-formed clients, each sending one request after the other.
const CLIENTS: usize = 4;

/// A hostile request's body, the `n`th of its class.
fn hostile_body(class: &str, n: u64) -> String {
    let model = match class {
        // A new model name of nearly 4 MiB (the body just under the 4 MiB limit).
        "4mib-names" => format!("{n}-{}", "m".repeat((4 << 20) - 200)),
        // New names with newlines, NULs and carriage returns.
        "control-chars" => format!("m{n}\nwasm.epp.vm_reload: 999\n\0forged_family 1\r\n"),
        // Short new names, as many as the clients can send.
        _ => format!("junk-{n}"),
    };
    json!({"model": model, "prompt": "x", "max_tokens": 1}).to_string()
}

/// Hostile clients of each class.
fn hostile_clients(class: &str) -> usize {
    match class {
        "4mib-names" => 2,
        "none" => 0,
        _ => 4,
    }
}

fn heap(envoy: &Envoy) -> u64 {
    http::get(&envoy.admin, "/memory")
        .ok()
        .and_then(|r| r.json()["allocated"].as_str().and_then(|s| s.parse().ok()))
        .unwrap_or(0)
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn main() {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let server = VllmSimServer::start(&["--model", MODEL]);
    println!(
        "{:<10} {:<14} {:>6} {:>9} {:>9} {:>9} {:>8} {:>14} {:>12}",
        "envoy", "hostile", "good", "p50 ms", "p99 ms", "max ms", "hostile", "statuses", "heap MB"
    );
    for with_filter in [true, false] {
        let envoy = Envoy::start_with(&json!({}), &[&server.address], 2, with_filter);
        phases(
            &envoy,
            seconds,
            if with_filter { "filter" } else { "no filter" },
        );
    }
}

/// Runs every phase against `envoy` and prints a row each.
fn phases(envoy: &Envoy, seconds: u64, tag: &str) {
    let good = json!({"model": MODEL, "prompt": "hello", "max_tokens": 2}).to_string();
    let mut counter = 0u64;
    for class in ["none", "4mib-names", "control-chars", "many-names"] {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let before = heap(envoy);
        let hostile: Vec<_> = (0..hostile_clients(class))
            .map(|c| {
                let (listen, stop, sent) = (envoy.listen.clone(), stop.clone(), sent.clone());
                let class = class.to_string();
                let base = counter + c as u64 * 1_000_000;
                std::thread::spawn(move || {
                    let mut statuses = std::collections::BTreeMap::new();
                    let mut n = base;
                    while !stop.load(Ordering::SeqCst) {
                        let body = hostile_body(&class, n);
                        n += 1;
                        let status = http::post_json(&listen, "/v1/completions", &body)
                            .map_or(0, |r| r.status);
                        *statuses.entry(status).or_insert(0u64) += 1;
                        sent.fetch_add(1, Ordering::SeqCst);
                    }
                    statuses
                })
            })
            .collect();
        counter += 10_000_000;
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let (listen, stop, good) = (envoy.listen.clone(), stop.clone(), good.clone());
                std::thread::spawn(move || {
                    let mut lat = Vec::new();
                    while !stop.load(Ordering::SeqCst) {
                        let t = Instant::now();
                        let r = http::post_json(&listen, "/v1/completions", &good);
                        assert!(
                            r.is_ok_and(|r| r.status == 200),
                            "a well-formed request failed"
                        );
                        lat.push(t.elapsed());
                    }
                    lat
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(seconds));
        stop.store(true, Ordering::SeqCst);
        let mut lat: Vec<Duration> = clients
            .into_iter()
            .flat_map(|c| c.join().expect("client"))
            .collect();
        let mut statuses = std::collections::BTreeMap::new();
        for h in hostile {
            for (s, n) in h.join().expect("hostile client") {
                *statuses.entry(s).or_insert(0) += n;
            }
        }
        lat.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let statuses: Vec<String> = statuses.iter().map(|(s, n)| format!("{s}x{n}")).collect();
        println!(
            "{:<10} {:<14} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>8} {:>14} {:>5.0}->{:<5.0}",
            tag,
            class,
            lat.len(),
            ms(percentile(&lat, 0.5)),
            ms(percentile(&lat, 0.99)),
            ms(lat.last().copied().unwrap_or_default()),
            sent.load(Ordering::SeqCst),
            statuses.join(","),
            before as f64 / 1e6,
            heap(envoy) as f64 / 1e6,
        );
    }
}
