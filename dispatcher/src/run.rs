//! The dispatch loop: ask the gate, take what fits from the queue, answer expired
//! requests with DEADLINE_EXCEEDED instead of sending them, send the rest into the
//! gateway, record each result once.
//!
//! * The gate is asked once per metrics interval; a 429 from the gateway closes it
//!   (budget 0) until the next metrics update, and the request goes back to the queue
//!   (taken again after the gateway's `Retry-After`, if any, once the gate reopens).
//! * 503 and transport errors are retried with exponential backoff (1 s, 2 s, … 30 s)
//!   up to `max_attempts`, then answered (the 503, or INFERENCE_ERROR).
//! * Progress (answered / in flight / budget / ETA) goes to stderr every
//!   `progress_every`; each gate decision can be logged as a JSON line (budget over time).

use crate::gate::{Allowance, Decision, Gate, Load};
use crate::gateway::{Gateway, Sent};
use crate::message::{Job, Outcome, DEADLINE_EXCEEDED, INFERENCE_ERROR, INVALID_REQUEST};
use crate::queue::{Backlog, Queue};
use serde_json::json;
use std::collections::VecDeque;
use std::future::Future;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

pub struct Options {
    /// Most requests in flight from this process, whatever the gate says.
    pub workers: u64,
    pub metrics_interval: Duration,
    /// How often an empty queue is polled.
    pub poll_interval: Duration,
    pub max_attempts: u32,
    pub progress_every: Option<Duration>,
    /// Exit once the queue holds nothing unanswered (always so for a file).
    pub exit_when_drained: bool,
    /// Where each gate decision is appended as a JSON line.
    pub budget_log: Option<std::path::PathBuf>,
    /// How long in-flight requests may finish after a shutdown signal.
    pub drain_timeout: Duration,
    /// How long a dispatched request takes to show in the metrics (the filter's scrape
    /// period and the path to the reader): requests younger than this are not counted as
    /// already in `S` when the gate decides, so they use up the new budget instead.
    pub metrics_lag: Duration,
}

/// What a run did.
#[derive(Debug, Default, Clone)]
pub struct Summary {
    pub answered: u64,
    pub dispatched: u64,
    pub status_429: u64,
    pub deadline_exceeded: u64,
    pub duplicates_suppressed: u64,
    pub decisions: u64,
    pub closed_decisions: u64,
    pub elapsed: Duration,
}

impl Summary {
    pub fn json(&self) -> serde_json::Value {
        json!({
            "answered": self.answered,
            "dispatched": self.dispatched,
            "status_429": self.status_429,
            "deadline_exceeded": self.deadline_exceeded,
            "duplicates_suppressed": self.duplicates_suppressed,
            "gate_decisions": self.decisions,
            "gate_closed_decisions": self.closed_decisions,
            "elapsed_s": (self.elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
        })
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn backoff(attempts: u32) -> Duration {
    Duration::from_secs(1u64 << attempts.saturating_sub(1).min(5)).min(Duration::from_secs(30))
}

/// Runs until the queue is drained (file, or `exit_when_drained`) or `shutdown` resolves.
pub async fn run(
    mut queue: Box<dyn Queue>,
    mut gate: Box<dyn Gate>,
    gateway: Arc<Gateway>,
    opts: Options,
    shutdown: impl Future<Output = ()>,
) -> Result<Summary, String> {
    let start = Instant::now();
    let mut sum = Summary::default();
    let mut load = Load::default();
    // Dispatch time and size of each request in flight, by dispatch number.
    let mut flying: std::collections::HashMap<u64, (Instant, u64)> = Default::default();
    let mut ready: VecDeque<Job> = VecDeque::new();
    let mut decision = Decision::of(Allowance::closed());
    let mut next_decision = Instant::now();
    let mut pressured = false;
    let mut next_progress = opts.progress_every.map(|p| Instant::now() + p);
    let mut stopping: Option<Instant> = None;
    let mut log = match &opts.budget_log {
        Some(p) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| format!("cannot open {}: {e}", p.display()))?,
        ),
        None => None,
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<(Job, u64, u64, Sent)>();
    tokio::pin!(shutdown);
    let workers_cap = Allowance {
        requests: Some(opts.workers),
        bytes: None,
    };

    loop {
        let now = Instant::now();
        if now >= next_decision && stopping.is_none() {
            // What the metrics can already have seen.
            let seen_before = Instant::now() - opts.metrics_lag;
            let visible = flying.values().filter(|(t, _)| *t <= seen_before).fold(
                Load::default(),
                |l, (_, size)| Load {
                    requests: l.requests + 1,
                    bytes: l.bytes + size,
                },
            );
            decision = gate.decide(visible).await;
            next_decision = Instant::now() + opts.metrics_interval;
            // A 429 closes the gate until the next metrics update.
            if decision.update {
                pressured = false;
            }
            sum.decisions += 1;
            if let Some(e) = &decision.error {
                eprintln!("dispatcher: gate closed: {e}");
            }
            let open = decision.allowance.admits(load, 0);
            if !open {
                sum.closed_decisions += 1;
            }
            if let Some(f) = log.as_mut() {
                let line = json!({
                    "t_ms": start.elapsed().as_millis() as u64,
                    "saturation": decision.saturation,
                    "ready": decision.ready,
                    "ceiling_requests": decision.allowance.requests,
                    "ceiling_bytes": decision.allowance.bytes,
                    "in_flight": load.requests,
                    "answered": sum.answered,
                    "dispatched": sum.dispatched,
                    "status_429": sum.status_429,
                    "error": decision.error,
                    "update": decision.update,
                });
                let _ = writeln!(f, "{line}");
            }
        }
        if let Err(e) = queue.tick().await {
            eprintln!("dispatcher: {e}");
        }

        // Dispatch what the allowance admits.
        if stopping.is_none() {
            let allow = if pressured {
                Allowance::closed()
            } else {
                decision.allowance.min(workers_cap)
            };
            loop {
                if ready.is_empty() {
                    let room = allow
                        .requests
                        .unwrap_or(opts.workers)
                        .min(opts.workers)
                        .saturating_sub(load.requests);
                    if room == 0 {
                        break;
                    }
                    match queue.take(room as usize).await {
                        Ok(jobs) if !jobs.is_empty() => ready.extend(jobs),
                        Ok(_) => break,
                        Err(e) => {
                            eprintln!("dispatcher: {e}");
                            break;
                        }
                    }
                }
                let Some(job) = ready.front() else { break };
                if let Some(why) = &job.invalid {
                    let why = why.clone();
                    let Some(job) = ready.pop_front() else { break };
                    finish(
                        &mut *queue,
                        &mut sum,
                        job,
                        Outcome::failed(INVALID_REQUEST, why),
                    )
                    .await;
                    continue;
                }
                if job.deadline_ms.is_some_and(|d| d < unix_ms()) {
                    let Some(job) = ready.pop_front() else { break };
                    let late = Outcome::failed(
                        DEADLINE_EXCEEDED,
                        "the request's deadline passed before it was dispatched",
                    );
                    sum.deadline_exceeded += 1;
                    finish(&mut *queue, &mut sum, job, late).await;
                    continue;
                }
                let size = job.body.len() as u64;
                if !allow.admits(load, size) {
                    break;
                }
                let Some(mut job) = ready.pop_front() else {
                    break;
                };
                job.attempts += 1;
                load.requests += 1;
                load.bytes += size;
                sum.dispatched += 1;
                let seq = sum.dispatched;
                flying.insert(seq, (Instant::now(), size));
                let (gw, tx) = (gateway.clone(), tx.clone());
                tokio::spawn(async move {
                    let sent = gw.send(&job).await;
                    let _ = tx.send((job, seq, size, sent));
                });
            }
        }

        // Done?
        if load.requests == 0 && ready.is_empty() {
            if stopping.is_some() {
                break;
            }
            let b = queue.backlog().await.unwrap_or(Backlog {
                unanswered: 1,
                ..Backlog::default()
            });
            if b.unanswered == 0 && (b.total.is_some() || opts.exit_when_drained) {
                break;
            }
        }
        if let Some(t) = stopping {
            if t.elapsed() > opts.drain_timeout {
                eprintln!("dispatcher: {} request(s) still in flight at the drain timeout; their leases will expire", load.requests);
                break;
            }
        }

        // Progress.
        if let (Some(at), Some(every)) = (next_progress, opts.progress_every) {
            if Instant::now() >= at {
                next_progress = Some(Instant::now() + every);
                progress(&mut *queue, &sum, load, &decision, pressured, start).await;
            }
        }

        // Wait for a result, the next decision, a poll, or a signal.
        let wake = next_decision.min(Instant::now() + opts.poll_interval);
        tokio::select! {
            got = rx.recv() => {
                let mut next = got;
                while let Some((job, seq, size, sent)) = next {
                    flying.remove(&seq);
                    load.requests -= 1;
                    load.bytes -= size;
                    match sent {
                        Sent::Done(outcome) => finish(&mut *queue, &mut sum, job, outcome).await,
                        Sent::Backpressure(after) => {
                            sum.status_429 += 1;
                            pressured = true;
                            // The gate holds dispatch until the next metrics update; the
                            // request itself only waits for the gateway's Retry-After.
                            let delay = after.unwrap_or(Duration::ZERO);
                            if let Err(e) = queue.retry(job, delay).await {
                                eprintln!("dispatcher: {e}");
                            }
                        }
                        Sent::Transient(why, last) => {
                            if job.attempts >= opts.max_attempts {
                                let outcome = last.unwrap_or_else(|| Outcome::failed(INFERENCE_ERROR, why));
                                finish(&mut *queue, &mut sum, job, outcome).await;
                            } else {
                                let delay = backoff(job.attempts);
                                if let Err(e) = queue.retry(job, delay).await {
                                    eprintln!("dispatcher: {e}");
                                }
                            }
                        }
                    }
                    next = rx.try_recv().ok();
                }
            }
            _ = tokio::time::sleep_until(wake.into()) => {}
            _ = &mut shutdown, if stopping.is_none() => {
                eprintln!("dispatcher: stopping: no new dispatch; waiting for {} in flight", load.requests);
                stopping = Some(Instant::now());
                let held: Vec<Job> = ready.drain(..).collect();
                if let Err(e) = queue.release(held).await {
                    eprintln!("dispatcher: {e}");
                }
            }
        }
    }
    sum.elapsed = start.elapsed();
    if opts.progress_every.is_some() {
        progress(&mut *queue, &sum, load, &decision, pressured, start).await;
    }
    Ok(sum)
}

async fn finish(queue: &mut dyn Queue, sum: &mut Summary, job: Job, outcome: Outcome) {
    let id = job.id.clone();
    match queue.finish(job, outcome).await {
        Ok(true) => sum.answered += 1,
        Ok(false) => sum.duplicates_suppressed += 1,
        Err(e) => eprintln!("dispatcher: result of {id} not written: {e}"),
    }
}

async fn progress(
    queue: &mut dyn Queue,
    sum: &Summary,
    load: Load,
    decision: &Decision,
    pressured: bool,
    start: Instant,
) {
    let b = queue.backlog().await.unwrap_or_default();
    let done = match b.total {
        Some(t) => format!("{}/{t}", b.answered),
        None => format!("{} ({} unanswered in the queue)", b.answered, b.unanswered),
    };
    let budget = if pressured {
        "0 (429 until the next metrics update)".to_string()
    } else {
        match (
            decision.allowance.requests,
            decision.allowance.bytes,
            &decision.error,
        ) {
            (_, _, Some(_)) => "0 (metrics unreadable)".to_string(),
            (Some(r), _, _) => format!("{} more", r.saturating_sub(load.requests)),
            (None, Some(b), _) => format!("{} more bytes", b.saturating_sub(load.bytes)),
            (None, None, _) => "unlimited".to_string(),
        }
    };
    let reading = match (decision.saturation, decision.ready) {
        (Some(s), Some(r)) => format!(" (S {s:.3}, {r} ready)"),
        _ => String::new(),
    };
    let secs = start.elapsed().as_secs_f64();
    let rate = sum.answered as f64 / secs.max(0.001);
    let eta = if rate > 0.0 && b.unanswered > 0 {
        format!("{:.0}s", b.unanswered as f64 / rate)
    } else {
        "-".to_string()
    };
    eprintln!(
        "dispatcher: {secs:.1}s done {done} | in flight {} | budget {budget}{reading} | 429s {} | ETA {eta}",
        load.requests, sum.status_429
    );
}
