//! The adversarial suite: seeded hostile requests through the real Envoy with the filter,
//! in batches, while well-formed traffic runs; after each batch the gateway's invariants.
//!
//! - [`gen`]: the generator (classes of hostile request, each draw a function of the seed);
//! - [`send`]: delivery over HTTP/1.1 (whole, slow, cut) and HTTP/2;
//! - [`watch`]: what the invariants read (RSS, stats, forged names, in-flight gauges).
//!
//! [`run`] is the campaign; `tests/tests/envoy_adversarial.rs` runs a bounded slice of it
//! and `scripts/fuzz envoy` a longer one.

pub mod gen;
pub mod send;
pub mod watch;

use crate::envoy::Envoy;
use crate::http;
use crate::openai::MODEL;
use gen::{Class, Delivery, Gen, Hostile};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Every path the gateway routes, hostile requests go to each. Extend it with each new API
/// the gateway serves.
pub const PATHS: &[&str] = &[
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/models",
    "/v1/embeddings",
    "/v1/conversations",
    "/v1/rerank",
    "/v1/score",
    "/v1/audio/transcriptions",
    "/tokenize",
    "/health",
    "/v1/unknown-api",
];

/// The bounds the invariants hold the gateway to.
#[derive(Clone, Debug)]
pub struct Bounds {
    /// A well-formed request may take at most this much longer than the quiet p99.
    pub stall: Duration,
    /// A hostile request (fully sent) gets its response head or a close within this.
    pub answer: Duration,
    /// Envoy's RSS once idle may exceed its warm value by at most this (KiB).
    pub rss_growth_kib: u64,
    /// The admin `/stats` may gain at most this many stats over its warm count. Client
    /// text reaches Envoy's stats only as capped label values (a fairness id: 1,000 values
    /// per VM for its lifetime in counters and gauges, 32 in histograms; a model name no
    /// server serves: 100 and 4), so the growth has a ceiling whatever the traffic: 3 VMs
    /// (2 workers and the main thread) × 1,000 fairness ids × 4 stats each. Without the
    /// caps every new name is new stats (main grew by 8,000 in 240 requests).
    pub stat_growth: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            stall: Duration::from_millis(2000),
            answer: Duration::from_secs(5),
            rss_growth_kib: 160 * 1024,
            stat_growth: 12_000,
        }
    }
}

/// A campaign's settings.
#[derive(Clone, Debug)]
pub struct Settings {
    pub seed: u64,
    /// Batches to run; the classes rotate, every `Class::ALL.len() + 1`-th batch mixes them.
    pub batches: usize,
    /// Stop starting batches after this long.
    pub budget: Duration,
    /// Hostile requests per batch.
    pub per_batch: usize,
    /// Concurrent hostile senders.
    pub senders: usize,
    /// Concurrent well-formed clients.
    pub clients: usize,
    pub bounds: Bounds,
    /// The gateway's body limit (`pool.maxRequestBodyBytes`).
    pub body_limit: usize,
    /// Where a failing batch's requests are written.
    pub findings_dir: std::path::PathBuf,
}

/// One batch's record.
#[derive(Clone, Debug)]
pub struct BatchReport {
    pub index: usize,
    pub class: Option<Class>,
    pub sent: usize,
    pub statuses: BTreeMap<String, usize>,
    pub worst_answer: Duration,
    pub well_formed: usize,
    pub wf_p99: Duration,
    pub wf_max: Duration,
    pub after: watch::Snapshot,
    pub failures: Vec<String>,
}

/// The campaign's result.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub seed: u64,
    pub batches: Vec<BatchReport>,
    /// Quiet well-formed latency before any hostile request (p99).
    pub quiet_p99: Duration,
    pub warm: watch::Snapshot,
    /// Hostile requests per class, and statuses per class.
    pub by_class: BTreeMap<String, BTreeMap<String, usize>>,
    pub well_formed: usize,
    /// Well-formed latencies while hostile requests ran.
    pub wf_p99: Duration,
    pub wf_max: Duration,
    pub rss_max_kib: u64,
    pub stats_max: usize,
    pub elapsed: Duration,
}

impl Report {
    pub fn failures(&self) -> Vec<String> {
        self.batches
            .iter()
            .flat_map(|b| {
                b.failures.iter().map(move |f| {
                    format!(
                        "batch {} ({}): {f}",
                        b.index,
                        b.class.map_or("mixed", |c| c.name())
                    )
                })
            })
            .collect()
    }

    pub fn sent(&self) -> usize {
        self.batches.iter().map(|b| b.sent).sum()
    }

    /// A plain-text summary (what BENCHMARKS.md records).
    pub fn summary(&self) -> String {
        let mut out = format!(
            "adversarial: seed {}, {} batches, {} hostile requests, {} well-formed, {:.0} s\n",
            self.seed,
            self.batches.len(),
            self.sent(),
            self.well_formed,
            self.elapsed.as_secs_f64()
        );
        out.push_str(&format!(
            "well-formed latency: quiet p99 {} ms; under attack p99 {} ms, max {} ms\n",
            self.quiet_p99.as_millis(),
            self.wf_p99.as_millis(),
            self.wf_max.as_millis()
        ));
        out.push_str(&format!(
            "Envoy RSS warm {} MiB, max after a batch {} MiB; /stats warm {}, max {}\n",
            self.warm.rss_kib / 1024,
            self.rss_max_kib / 1024,
            self.warm.stats,
            self.stats_max
        ));
        for (class, statuses) in &self.by_class {
            let n: usize = statuses.values().sum();
            let list: Vec<String> = statuses.iter().map(|(s, c)| format!("{s}×{c}")).collect();
            out.push_str(&format!("  {class:<14} {n:>5}  {}\n", list.join(" ")));
        }
        let failures = self.failures();
        out.push_str(&format!("findings: {}\n", failures.len()));
        for f in failures.iter().take(40) {
            out.push_str(&format!("  {f}\n"));
        }
        out
    }
}

/// A well-formed request the clients send, and its check: its latency, or why it failed
/// and after how long.
fn well_formed(addr: &str, i: usize) -> Result<Duration, (String, Duration)> {
    let start = Instant::now();
    check_well_formed(addr, i, start).map_err(|e| (e, start.elapsed()))
}

fn check_well_formed(addr: &str, i: usize, start: Instant) -> Result<Duration, String> {
    let (path, body, stream) = match i % 5 {
        0 => (
            "/v1/completions",
            format!(r#"{{"model":"{MODEL}","prompt":"well formed {i}","max_tokens":3}}"#),
            false,
        ),
        1 => (
            "/v1/chat/completions",
            format!(
                r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"well formed {i}"}}],"max_tokens":3}}"#
            ),
            false,
        ),
        2 => (
            "/v1/completions",
            format!(
                r#"{{"model":"{MODEL}","prompt":"well formed {i}","max_tokens":3,"stream":true}}"#
            ),
            true,
        ),
        3 => (
            "/v1/responses",
            format!(r#"{{"model":"{MODEL}","input":"well formed {i}","max_output_tokens":3}}"#),
            false,
        ),
        _ => ("/v1/models", String::new(), false),
    };
    let r = if body.is_empty() {
        http::get(addr, path)
    } else {
        http::post_json(addr, path, &body)
    }
    .map_err(|e| format!("{path}: {e}"))?;
    let took = start.elapsed();
    if r.status != 200 {
        return Err(format!("{path}: status {} {}", r.status, r.text()));
    }
    let text = r.text();
    let ok = if stream {
        text.contains("data: [DONE]") && text.contains(MODEL)
    } else if path == "/v1/models" {
        r.json()["data"]
            .as_array()
            .is_some_and(|d| d.iter().any(|m| m["id"] == MODEL))
    } else {
        serde_json::from_str::<serde_json::Value>(&text)
            .map(|v| v["model"] == MODEL)
            .unwrap_or(false)
    };
    if !ok {
        return Err(format!(
            "{path}: unexpected body {}",
            &text[..text.len().min(300)]
        ));
    }
    Ok(took)
}

/// Well-formed clients, paused between batches.
struct Clients {
    stop: Arc<AtomicBool>,
    pause: Arc<AtomicBool>,
    busy: Arc<std::sync::atomic::AtomicUsize>,
    /// (batch index at the time, latency or error).
    results: Arc<Mutex<Vec<(usize, WellFormed)>>>,
    batch: Arc<std::sync::atomic::AtomicUsize>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Clients {
    fn start(addr: &str, n: usize) -> Clients {
        let c = Clients {
            stop: Arc::new(AtomicBool::new(false)),
            pause: Arc::new(AtomicBool::new(true)),
            busy: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            results: Arc::new(Mutex::new(Vec::new())),
            batch: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            threads: Vec::new(),
        };
        let mut threads = Vec::new();
        for t in 0..n {
            let (stop, pause, busy, results, batch) = (
                c.stop.clone(),
                c.pause.clone(),
                c.busy.clone(),
                c.results.clone(),
                c.batch.clone(),
            );
            let addr = addr.to_string();
            threads.push(std::thread::spawn(move || {
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    if pause.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    busy.fetch_add(1, Ordering::SeqCst);
                    if pause.load(Ordering::SeqCst) {
                        busy.fetch_sub(1, Ordering::SeqCst);
                        continue;
                    }
                    let b = batch.load(Ordering::Relaxed);
                    let r = well_formed(&addr, i);
                    results.lock().unwrap().push((b, r));
                    busy.fetch_sub(1, Ordering::SeqCst);
                    i += n;
                    std::thread::sleep(Duration::from_millis(20));
                }
            }));
        }
        Clients { threads, ..c }
    }

    fn resume(&self, batch: usize) {
        self.batch.store(batch, Ordering::SeqCst);
        self.pause.store(false, Ordering::SeqCst);
    }

    /// Stops sending and waits (up to 40 s) for the requests in flight.
    fn quiesce(&self) {
        self.pause.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(40);
        while self.busy.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn take(&self, batch: usize) -> Vec<WellFormed> {
        let mut all = self.results.lock().unwrap();
        let (mine, rest): (Vec<_>, Vec<_>) = all.drain(..).partition(|(b, _)| *b == batch);
        *all = rest;
        mine.into_iter().map(|(_, r)| r).collect()
    }

    fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

type WellFormed = Result<Duration, (String, Duration)>;

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// Sends one batch of hostile requests with `senders` threads; outcomes in batch order.
fn send_batch(
    addr: &str,
    batch: &[Hostile],
    senders: usize,
    limit: Duration,
) -> Vec<send::Outcome> {
    let (h2, h1): (Vec<usize>, Vec<usize>) =
        (0..batch.len()).partition(|&i| matches!(batch[i].delivery, Delivery::H2 { .. }));
    let out: Arc<Mutex<Vec<Option<send::Outcome>>>> = Arc::new(Mutex::new(vec![None; batch.len()]));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h1 = Arc::new(h1);
    let batch_arc: Arc<Vec<Hostile>> = Arc::new(batch.to_vec());
    let mut threads = Vec::new();
    for _ in 0..senders.max(1) {
        let (out, next, h1, batch, addr) = (
            out.clone(),
            next.clone(),
            h1.clone(),
            batch_arc.clone(),
            addr.to_string(),
        );
        threads.push(std::thread::spawn(move || loop {
            let k = next.fetch_add(1, Ordering::SeqCst);
            let Some(&i) = h1.get(k) else { break };
            let o = send::http1(&addr, &batch[i], limit);
            out.lock().unwrap()[i] = Some(o);
        }));
    }
    // HTTP/2: streams multiplexed on a few connections, beside the HTTP/1.1 senders.
    for chunk in h2.chunks(16) {
        let refs: Vec<&Hostile> = chunk.iter().map(|&i| &batch[i]).collect();
        let outs = send::http2(addr, &refs, limit);
        let mut all = out.lock().unwrap();
        for (&i, o) in chunk.iter().zip(outs) {
            all[i] = Some(o);
        }
    }
    for t in threads {
        let _ = t.join();
    }
    let all = std::mem::take(&mut *out.lock().unwrap());
    all.into_iter()
        .map(|o| {
            o.unwrap_or(send::Outcome {
                status: None,
                answer: None,
                closed: true,
            })
        })
        .collect()
}

/// Writes a failing batch's requests (HTTP/1.1 bytes, one file each) for replay.
fn save_finding(dir: &std::path::Path, seed: u64, index: usize, batch: &[Hostile], host: &str) {
    let d = dir.join(format!("seed-{seed}-batch-{index}"));
    if std::fs::create_dir_all(&d).is_err() {
        return;
    }
    for (i, h) in batch.iter().enumerate() {
        let _ = std::fs::write(
            d.join(format!("{i:04}-{}.http", h.class.name())),
            h.http1(host),
        );
    }
}

/// Runs the campaign against `envoy` (its filter configured with `metrics` as
/// `pool.metricsEndpoint`, when given); `addresses` are names the generator may target
/// (the servers, the admin API).
pub fn run(envoy: &Envoy, metrics: Option<&str>, addresses: Vec<String>, s: &Settings) -> Report {
    let started = Instant::now();
    let mut gen = Gen::new(s.seed, s.body_limit, MODEL, addresses);
    let marker = gen.marker.clone();
    let addr = envoy.listen.clone();
    let mut report = Report {
        seed: s.seed,
        ..Report::default()
    };
    let clients = Clients::start(&addr, s.clients);

    // Warm: well-formed traffic alone, its latency the quiet reference.
    clients.resume(usize::MAX);
    std::thread::sleep(Duration::from_secs(3));
    clients.quiesce();
    let quiet = clients.take(usize::MAX);
    let mut quiet_ok: Vec<Duration> = quiet
        .iter()
        .filter_map(|r| r.as_ref().ok().copied())
        .collect();
    quiet_ok.sort();
    report.quiet_p99 = pct(&quiet_ok, 0.99);
    let quiet_errors: Vec<&String> = quiet
        .iter()
        .filter_map(|r| r.as_ref().err().map(|e| &e.0))
        .collect();
    assert!(
        quiet_errors.is_empty() && !quiet_ok.is_empty(),
        "well-formed requests fail before any hostile one: {quiet_errors:?}"
    );
    settle(envoy, metrics, &marker);
    report.warm = watch::snapshot(envoy, metrics, &marker);
    let mut all_wf = Vec::new();

    let rotation = Class::ALL.len() + 1;
    for index in 0..s.batches {
        if started.elapsed() > s.budget {
            break;
        }
        let class = Class::ALL.get(index % rotation).copied();
        let batch: Vec<Hostile> = (0..s.per_batch)
            .map(|k| {
                let c = class.unwrap_or(Class::ALL[k % Class::ALL.len()]);
                gen.next(c)
            })
            .collect();
        clients.resume(index);
        let outcomes = send_batch(&addr, &batch, s.senders, s.bounds.answer);
        clients.quiesce();
        let wf = clients.take(index);
        let mut failures = Vec::new();
        let mut lat: Vec<Duration> = Vec::new();
        for r in &wf {
            match r {
                Ok(d) => lat.push(*d),
                Err((e, d)) => {
                    lat.push(*d);
                    failures.push(format!(
                        "well-formed request failed after {} ms: {e}",
                        d.as_millis()
                    ));
                }
            }
        }
        lat.sort();
        let bound = report.quiet_p99 + s.bounds.stall;
        if let Some(worst) = lat.last().filter(|w| **w > bound) {
            failures.push(format!(
                "a well-formed request took {} ms (bound: quiet p99 {} ms + {} ms)",
                worst.as_millis(),
                report.quiet_p99.as_millis(),
                s.bounds.stall.as_millis()
            ));
        }
        let mut statuses = BTreeMap::new();
        let mut worst_answer = Duration::ZERO;
        for (h, o) in batch.iter().zip(&outcomes) {
            let key = match (o.status, o.closed, o.answer) {
                (Some(code), _, _) => code.to_string(),
                (None, true, _) => "closed".to_string(),
                (None, false, _) => "abandoned".to_string(),
            };
            *statuses.entry(key.clone()).or_insert(0) += 1;
            *report
                .by_class
                .entry(h.class.name().to_string())
                .or_default()
                .entry(key)
                .or_insert(0) += 1;
            if let Some(a) = o.answer {
                worst_answer = worst_answer.max(a);
                if a > s.bounds.answer {
                    failures.push(format!(
                        "{} {} ({} body bytes) answered after {} ms",
                        h.method,
                        h.path.chars().take(60).collect::<String>(),
                        h.body.len(),
                        a.as_millis()
                    ));
                }
            }
            if matches!(o.status, Some(500) | Some(502)) {
                failures.push(format!(
                    "{} {} got {}",
                    h.method,
                    h.path.chars().take(60).collect::<String>(),
                    o.status.unwrap_or(0)
                ));
            }
        }
        let after = settle(envoy, metrics, &marker);
        if after.running != 0.0 || after.queued != 0.0 {
            failures.push(format!(
                "idle, yet {} requests counted running and {} queued",
                after.running, after.queued
            ));
        }
        if after.vm_reloads > report.warm.vm_reloads || after.vms_created != report.warm.vms_created
        {
            failures.push(format!(
                "a VM was replaced: reloads {} → {}, VMs created {} → {}",
                report.warm.vm_reloads,
                after.vm_reloads,
                report.warm.vms_created,
                after.vms_created
            ));
        }
        if after.rss_kib > report.warm.rss_kib + s.bounds.rss_growth_kib {
            failures.push(format!(
                "Envoy's RSS {} MiB, warm {} MiB (bound +{} MiB)",
                after.rss_kib / 1024,
                report.warm.rss_kib / 1024,
                s.bounds.rss_growth_kib / 1024
            ));
        }
        if after.stats > report.warm.stats + s.bounds.stat_growth {
            failures.push(format!(
                "{} stats, warm {} (bound +{})",
                after.stats, report.warm.stats, s.bounds.stat_growth
            ));
        }
        for u in &after.unanswered {
            failures.push(format!("idle, yet {u}"));
        }
        for f in after.forged.iter().take(5) {
            failures.push(format!("forged stat: {f}"));
        }
        if !failures.is_empty() {
            save_finding(&s.findings_dir, s.seed, index, &batch, &addr);
        }
        report.rss_max_kib = report.rss_max_kib.max(after.rss_kib);
        report.stats_max = report.stats_max.max(after.stats);
        report.well_formed += wf.len();
        all_wf.extend(lat.iter().copied());
        report.batches.push(BatchReport {
            index,
            class,
            sent: batch.len(),
            statuses,
            worst_answer,
            well_formed: wf.len(),
            wf_p99: pct(&lat, 0.99),
            wf_max: lat.last().copied().unwrap_or_default(),
            after,
            failures,
        });
    }
    clients.stop();
    all_wf.sort();
    report.wf_p99 = pct(&all_wf, 0.99);
    report.wf_max = all_wf.last().copied().unwrap_or_default();
    report.elapsed = started.elapsed();
    report
}

/// Waits (up to 15 s) for the gateway to go idle (nothing running or queued), then reads it.
fn settle(envoy: &Envoy, metrics: Option<&str>, marker: &str) -> watch::Snapshot {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = watch::snapshot(envoy, metrics, marker);
        let idle = s.running == 0.0 && s.queued == 0.0 && s.unanswered.is_empty();
        if idle || Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
