//! Drives a run: warm-up, server counters before, open- or closed-loop load bounded by
//! count and duration, server counters after, records and summary.

use super::args::{Config, Load};
use super::client::Client;
use super::metrics::Counters;
use super::report::{summarize, Record, RunResult, Scrape};
use super::workload::{Arrivals, Request, Workload, FAIRNESS_HEADER, OBJECTIVE_HEADER};
use bytes::Bytes;
use serde_json::Value;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

struct Shared {
    config: Config,
    client: Client,
    t0: Instant,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Sends one request and turns what happened into a record.
async fn one(shared: &Shared, req: Request, scheduled: Duration) -> Record {
    let c = &shared.config;
    let target = (req.index % c.targets.len() as u64) as usize;
    let mut headers = c.headers.clone();
    if !c.destinations.is_empty() {
        let d = &c.destinations[(req.index % c.destinations.len() as u64) as usize];
        headers.push((c.destination_header.clone(), d.clone()));
    }
    if let Some(t) = &req.tenant {
        headers.push((FAIRNESS_HEADER.into(), t.clone()));
    }
    if let Some(o) = &req.objective {
        headers.push((OBJECTIVE_HEADER.into(), o.clone()));
    }
    let mut rec = Record {
        index: req.index,
        group: req.group,
        tenant: req.tenant.clone(),
        objective: req.objective.clone(),
        target: shared.client.targets()[target].clone(),
        scheduled_ms: ms(scheduled),
        ..Record::default()
    };
    let sent = Instant::now();
    rec.sent_ms = ms(sent - shared.t0);
    let post = shared.client.post(
        target,
        c.spec.api.path(),
        &headers,
        Bytes::from(req.body),
        c.spec.stream,
        req.cancel,
    );
    let out = match tokio::time::timeout(c.timeout, post).await {
        Ok(out) => out,
        Err(_) => {
            rec.timed_out = true;
            rec.error = Some("timeout".into());
            return rec;
        }
    };
    rec.status = out.status;
    rec.error = out.error;
    rec.server = out.server;
    rec.new_connection = out.new_connection;
    rec.cancelled = out.cancelled;
    rec.latency_ms = out.end_at.map(|t| ms(t - sent));
    if let Some(u) = out.usage {
        rec.prompt_tokens = u.prompt_tokens;
        rec.cached_tokens = u.cached_tokens;
        rec.output_tokens = u.completion_tokens;
    }
    if c.spec.stream {
        if out.usage.is_none() {
            rec.output_tokens = out.streamed_tokens;
        }
        rec.ttft_ms = out.token_reads.first().map(|(t, _)| ms(*t - sent));
        rec.itl_ms = out
            .token_reads
            .windows(2)
            .map(|w| ms(w[1].0 - w[0].0))
            .collect();
        if let (Some(first), Some(last)) = (out.token_reads.first(), out.token_reads.last()) {
            let tokens = rec.output_tokens.max(out.streamed_tokens);
            if tokens > 1 {
                rec.tpot_ms = Some(ms(last.0 - first.0) / (tokens - 1) as f64);
            }
        }
    }
    if rec.status.is_some_and(|s| s != 200) && rec.error.is_none() {
        rec.error = Some(format!("status {}", rec.status.unwrap_or(0)));
    }
    rec
}

async fn scrape(client: &Client, servers: &[String]) -> Scrape {
    let mut out = Vec::new();
    for s in servers {
        let r = match tokio::time::timeout(Duration::from_secs(5), client.get(s, "/metrics")).await
        {
            Ok(Ok(f)) if f.status == 200 => Ok(Counters::parse(&String::from_utf8_lossy(&f.body))),
            Ok(Ok(f)) => Err(format!("/metrics answered {}", f.status)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("timeout".into()),
        };
        out.push((s.clone(), r));
    }
    out
}

/// Closed loop over `workload` until `limit` requests or `deadline`; returns records.
async fn closed_loop(
    shared: Arc<Shared>,
    workload: Arc<Mutex<(Workload, u64)>>,
    concurrency: usize,
    limit: u64,
    deadline: Instant,
) -> Vec<Record> {
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (shared, workload) = (shared.clone(), workload.clone());
        tasks.push(tokio::spawn(async move {
            let mut records = Vec::new();
            loop {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                let req = {
                    let Ok(mut w) = workload.lock() else { break };
                    if w.1 >= limit {
                        break;
                    }
                    let i = w.1;
                    w.1 += 1;
                    w.0.next_request(i)
                };
                records.push(one(&shared, req, now - shared.t0).await);
            }
            records
        }));
    }
    let mut records = Vec::new();
    for t in tasks {
        if let Ok(mut r) = t.await {
            records.append(&mut r);
        }
    }
    records
}

/// Runs the load described by `config` and returns the summary (and writes records).
pub async fn run(config: Config) -> Result<Value, String> {
    let mut client = Client::new(&config.targets, config.keep_alive);
    let records_file = match &config.records {
        Some(p) => Some(
            std::fs::File::create(p).map_err(|e| format!("cannot create {}: {e}", p.display()))?,
        ),
        None => None,
    };

    // Warm-up: the same shapes from another seed, closed loop, not measured; the
    // measured run reuses its connections.
    if config.warmup > 0 {
        let concurrency = match config.load {
            Load::Closed { concurrency } => concurrency,
            Load::Open { qps } => (qps.ceil() as usize).clamp(1, 8),
        };
        let shared = Arc::new(Shared {
            config: config.clone(),
            client,
            t0: Instant::now(),
        });
        let w = Workload::new(config.spec.clone(), config.seed ^ 0x5eed_0f3a_5a17);
        let deadline = Instant::now() + config.duration.max(Duration::from_secs(1));
        let warm = closed_loop(
            shared.clone(),
            Arc::new(Mutex::new((w, 0))),
            concurrency,
            config.warmup,
            deadline,
        )
        .await;
        let failed = warm.iter().filter(|r| !r.ok()).count();
        if failed > 0 {
            eprintln!(
                "loadgen: {failed} of {} warm-up requests failed",
                warm.len()
            );
        }
        client = Arc::try_unwrap(shared)
            .map_err(|_| "warm-up still running".to_string())?
            .client;
    }
    measure(config, client, records_file).await
}

async fn measure(
    config: Config,
    client: Client,
    mut records_file: Option<std::fs::File>,
) -> Result<Value, String> {
    let before = scrape(&client, &config.server_metrics).await;
    let t0 = Instant::now();
    let deadline = t0 + config.duration;
    let shared = Arc::new(Shared {
        config: config.clone(),
        client,
        t0,
    });
    let workload = Workload::new(config.spec.clone(), config.seed);
    let mut overflow = 0;
    let mut records = match config.load {
        Load::Closed { concurrency } => {
            closed_loop(
                shared.clone(),
                Arc::new(Mutex::new((workload, 0))),
                concurrency,
                config.requests,
                deadline,
            )
            .await
        }
        Load::Open { qps } => {
            let mut workload = workload;
            let in_flight = Arc::new(AtomicUsize::new(0));
            let mut tasks = Vec::new();
            for (i, at) in (0..config.requests).zip(Arrivals::new(qps, config.seed)) {
                if at >= config.duration {
                    break;
                }
                tokio::time::sleep_until((t0 + at).into()).await;
                let req = workload.next_request(i);
                if in_flight.load(Ordering::Relaxed) >= config.max_in_flight {
                    overflow += 1;
                    continue;
                }
                in_flight.fetch_add(1, Ordering::Relaxed);
                let (shared, in_flight) = (shared.clone(), in_flight.clone());
                tasks.push(tokio::spawn(async move {
                    let r = one(&shared, req, at).await;
                    in_flight.fetch_sub(1, Ordering::Relaxed);
                    r
                }));
            }
            let mut records = Vec::with_capacity(tasks.len());
            for t in tasks {
                if let Ok(r) = t.await {
                    records.push(r);
                }
            }
            records
        }
    };
    let end = records
        .iter()
        .filter_map(|r| r.latency_ms.map(|l| r.sent_ms + l))
        .fold(0.0, f64::max);
    let elapsed = Duration::from_secs_f64((end / 1e3).max(1e-3));
    let after = scrape(&shared.client, &config.server_metrics).await;
    records.sort_by_key(|r| r.index);
    if let Some(f) = records_file.as_mut() {
        for r in &records {
            writeln!(f, "{}", r.to_json()).map_err(|e| format!("writing records: {e}"))?;
        }
    }
    Ok(summarize(&RunResult {
        config: &config,
        records: &records,
        elapsed,
        overflow,
        before,
        after,
    }))
}
