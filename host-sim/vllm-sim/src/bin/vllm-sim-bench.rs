//! Load generator for measuring how much one vllm-sim process serves.
//!
//! ```text
//! taskset -c 0 target/release/vllm-sim --port 8000 --profile zero &
//! taskset -c 1 target/release/vllm-sim-bench --url 127.0.0.1:8000 --mode stream
//! ```
//!
//! Bounded: stops after `--requests` requests or `--duration`, whichever first.
//! Reports requests/s, streamed tokens/s and latency percentiles.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const USAGE: &str = "\
vllm-sim-bench: load generator for a running vllm-sim

  --url HOST:PORT      server [127.0.0.1:8000]
  --mode short|stream|metrics
                       short: non-streamed completions, max_tokens 1;
                       stream: streamed completions of --tokens tokens;
                       metrics: GET /metrics, as a gateway's scrape [stream]
  --tokens N           tokens per streamed request [64]
  --concurrency N      connections, one request at a time each [32]
  --requests N         stop after this many requests [20000]
  --duration DUR       stop after this long [10s]
";

struct Args {
    addr: SocketAddr,
    stream: bool,
    metrics: bool,
    tokens: u32,
    concurrency: usize,
    requests: u64,
    duration: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        addr: "127.0.0.1:8000".parse().map_err(|_| "addr")?,
        stream: true,
        metrics: false,
        tokens: 64,
        concurrency: 32,
        requests: 20_000,
        duration: Duration::from_secs(10),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" {
            print!("{USAGE}");
            std::process::exit(0);
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let bad = || format!("bad value for {flag}: {value:?}");
        match flag.as_str() {
            "--url" => {
                let v = value.trim_start_matches("http://").trim_end_matches('/');
                args.addr = v.parse().map_err(|_| bad())?;
            }
            "--mode" => {
                (args.stream, args.metrics) = match value.as_str() {
                    "stream" => (true, false),
                    "short" => (false, false),
                    "metrics" => (false, true),
                    _ => return Err(bad()),
                }
            }
            "--tokens" => args.tokens = value.parse().map_err(|_| bad())?,
            "--concurrency" => args.concurrency = value.parse().map_err(|_| bad())?,
            "--requests" => args.requests = value.parse().map_err(|_| bad())?,
            "--duration" => args.duration = vllm_sim::time::parse_duration(&value)?,
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    Ok(args)
}

#[derive(Default)]
struct Totals {
    requests: AtomicU64,
    tokens: AtomicU64,
    errors: AtomicU64,
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("vllm-sim-bench: {e}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(run(args));
}

async fn run(args: Args) {
    let body = if args.stream {
        format!(
            r#"{{"model":"sim-model","prompt":"benchmark prompt","max_tokens":{},"ignore_eos":true,"stream":true}}"#,
            args.tokens
        )
    } else {
        r#"{"model":"sim-model","prompt":"benchmark prompt","max_tokens":1}"#.to_string()
    };
    let body = Bytes::from(body);
    let totals = Arc::new(Totals::default());
    let issued = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + args.duration;
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency.max(1) {
        let (totals, issued, body) = (totals.clone(), issued.clone(), body.clone());
        let (addr, limit, metrics) = (args.addr, args.requests, args.metrics);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            if let Err(e) = worker(
                addr,
                if metrics { None } else { Some(body) },
                limit,
                deadline,
                &issued,
                &totals,
                &mut latencies,
            )
            .await
            {
                eprintln!("vllm-sim-bench: connection error: {e}");
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        if let Ok(mut l) = t.await {
            latencies.append(&mut l);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    latencies.sort();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |d: &Duration| d.as_secs_f64() * 1e3)
    };
    let requests = totals.requests.load(Ordering::Relaxed);
    let tokens = totals.tokens.load(Ordering::Relaxed);
    println!(
        "mode={} concurrency={} requests={} errors={} seconds={:.2} requests/s={:.0} streamed_tokens/s={:.0} latency_ms p50={:.2} p99={:.2}",
        if args.metrics {
            "metrics"
        } else if args.stream {
            "stream"
        } else {
            "short"
        },
        args.concurrency,
        requests,
        totals.errors.load(Ordering::Relaxed),
        secs,
        requests as f64 / secs,
        tokens as f64 / secs,
        pct(0.5),
        pct(0.99),
    );
}

/// One connection's loop: POST `/v1/completions` with `body`, or (`None`) GET `/metrics`.
async fn worker(
    addr: SocketAddr,
    body: Option<Bytes>,
    limit: u64,
    deadline: Instant,
    issued: &AtomicU64,
    totals: &Totals,
    latencies: &mut Vec<Duration>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    while Instant::now() < deadline && issued.fetch_add(1, Ordering::Relaxed) < limit {
        let req = match &body {
            None => Request::get("/metrics")
                .header("host", "localhost")
                .body(Full::new(Bytes::new()))?,
            Some(body) => Request::post("/v1/completions")
                .header("host", "localhost")
                .header("content-type", "application/json")
                .body(Full::new(body.clone()))?,
        };
        let t0 = Instant::now();
        sender.ready().await?;
        let resp = sender.send_request(req).await?;
        let ok = resp.status().is_success();
        let mut body = resp.into_body();
        let mut chunks = 0u64;
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame?.into_data() {
                // One SSE event per token; count them (less the finish chunk and [DONE]).
                chunks += data.windows(6).filter(|w| w == b"data: ").count() as u64;
            }
        }
        latencies.push(t0.elapsed());
        if ok {
            totals.requests.fetch_add(1, Ordering::Relaxed);
            totals
                .tokens
                .fetch_add(chunks.saturating_sub(2), Ordering::Relaxed);
        } else {
            totals.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}
