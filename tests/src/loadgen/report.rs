//! Per-request records and the JSON summary of a run.
//!
//! Definitions (all in milliseconds, over successful requests, i.e. status 200 and a
//! complete body):
//! * latency: from sending the request to the end of the response body;
//! * TTFT: from sending to the first body read that carried a token (streamed only);
//! * ITL: the gaps between successive body reads that carried tokens (vLLM
//!   `bench_serving`'s definition; pooled over all requests);
//! * TPOT: per request, (last token read − first token read) / (output tokens − 1);
//! * output tokens: `usage.completion_tokens` when the server sent usage, else the
//!   token events counted in the stream.

use super::args::{Config, Load};
use super::metrics::Counters;
use super::stats::summary_json;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// What happened to one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Record {
    pub index: u64,
    pub group: u32,
    pub tenant: Option<String>,
    pub objective: Option<String>,
    pub target: String,
    /// When it was due (open loop) or issued (closed loop), since the start of the run.
    pub scheduled_ms: f64,
    /// When it was sent, since the start of the run.
    pub sent_ms: f64,
    pub status: Option<u16>,
    pub error: Option<String>,
    pub timed_out: bool,
    /// Abandoned by the client after the first token (`--cancel`).
    pub cancelled: bool,
    pub server: Option<String>,
    pub new_connection: bool,
    pub latency_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub itl_ms: Vec<f64>,
    pub tpot_ms: Option<f64>,
    pub output_tokens: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

impl Record {
    pub fn ok(&self) -> bool {
        self.status == Some(200) && self.error.is_none() && !self.timed_out && !self.cancelled
    }

    pub fn to_json(&self) -> Value {
        let r3 = |v: f64| (v * 1000.0).round() / 1000.0;
        json!({
            "index": self.index,
            "group": self.group,
            "tenant": self.tenant,
            "objective": self.objective,
            "target": self.target,
            "scheduled_ms": r3(self.scheduled_ms),
            "sent_ms": r3(self.sent_ms),
            "status": self.status,
            "error": self.error,
            "timed_out": self.timed_out,
            "cancelled": self.cancelled,
            "server": self.server,
            "new_connection": self.new_connection,
            "latency_ms": self.latency_ms.map(r3),
            "ttft_ms": self.ttft_ms.map(r3),
            "tpot_ms": self.tpot_ms.map(r3),
            "itl_ms": self.itl_ms.iter().map(|v| r3(*v)).collect::<Vec<_>>(),
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
        })
    }
}

/// Server counters before and after the run (or why they could not be read).
pub type Scrape = Vec<(String, Result<Counters, String>)>;

/// Everything the summary is made of.
pub struct RunResult<'a> {
    pub config: &'a Config,
    pub records: &'a [Record],
    /// From the start of the run to the last response (or to the end of issuing).
    pub elapsed: Duration,
    /// Open-loop arrivals not sent because --max-in-flight requests were in flight.
    pub overflow: u64,
    pub before: Scrape,
    pub after: Scrape,
}

fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

/// The JSON summary.
pub fn summarize(r: &RunResult) -> Value {
    let c = r.config;
    let ok: Vec<&Record> = r.records.iter().filter(|x| x.ok()).collect();
    let cancelled = r.records.iter().filter(|x| x.cancelled).count();
    let secs = r.elapsed.as_secs_f64().max(1e-9);
    let collect = |f: &dyn Fn(&Record) -> Option<f64>| -> Vec<f64> {
        ok.iter().filter_map(|x| f(x)).collect()
    };
    let latency = collect(&|x| x.latency_ms);
    let ttft = collect(&|x| x.ttft_ms);
    let tpot = collect(&|x| x.tpot_ms);
    let itl: Vec<f64> = ok.iter().flat_map(|x| x.itl_ms.iter().copied()).collect();
    let output_tokens: u64 = ok.iter().map(|x| x.output_tokens).sum();
    let prompt_tokens: u64 = ok.iter().map(|x| x.prompt_tokens).sum();
    let cached_tokens: u64 = ok.iter().map(|x| x.cached_tokens).sum();

    let mut status: BTreeMap<String, u64> = BTreeMap::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut servers: BTreeMap<String, u64> = BTreeMap::new();
    let mut timeouts = 0;
    for x in r.records {
        if x.timed_out {
            timeouts += 1;
        } else if let Some(e) = &x.error {
            let kind = e.split(':').next().unwrap_or(e).to_string();
            *errors.entry(kind).or_default() += 1;
        }
        if let Some(s) = x.status {
            *status.entry(s.to_string()).or_default() += 1;
        }
        if x.ok() {
            let s = x.server.clone().unwrap_or_else(|| "unknown".into());
            *servers.entry(s).or_default() += 1;
        }
    }
    let share: Map<String, Value> = servers
        .iter()
        .map(|(k, n)| {
            (
                k.clone(),
                json!({"requests": n, "share": round(*n as f64 / ok.len().max(1) as f64, 4)}),
            )
        })
        .collect();

    // Server-side counters.
    let mut per_server = Map::new();
    let (mut q, mut h, mut reqs) = (0.0, 0.0, 0.0);
    let mut all_read = !r.before.is_empty();
    for ((addr, before), (_, after)) in r.before.iter().zip(&r.after) {
        match (before, after) {
            (Ok(b), Ok(a)) => {
                let d = a.since(b);
                q += d.prefix_queries;
                h += d.prefix_hits;
                reqs += d.requests;
                per_server.insert(addr.clone(), d.to_json());
            }
            (Err(e), _) | (_, Err(e)) => {
                all_read = false;
                per_server.insert(addr.clone(), json!({"error": e}));
            }
        }
    }
    if reqs > 0.0 {
        for obj in per_server.values_mut().filter_map(Value::as_object_mut) {
            if let Some(n) = obj.get("requests").and_then(Value::as_f64) {
                obj.insert("share".into(), json!(round(n / reqs, 4)));
            }
        }
    }

    let (mode, rate) = match c.load {
        Load::Open { qps } => ("open", json!({"qps": qps})),
        Load::Closed { concurrency } => ("closed", json!({"concurrency": concurrency})),
    };
    let lag: Vec<f64> = r
        .records
        .iter()
        .map(|x| x.sent_ms - x.scheduled_ms)
        .collect();
    json!({
        "label": c.label,
        "targets": c.targets,
        "mode": mode,
        "load": rate,
        "keep_alive": c.keep_alive,
        "workload": {
            "api": c.spec.api.path(),
            "groups": c.spec.groups,
            "prompts_per_group": c.spec.prompts_per_group,
            "system_prompt_len": c.spec.system_prompt_len,
            "question_len": c.spec.question_len,
            "question_len_max": c.spec.question_len_max,
            "output_len": c.spec.output_len,
            "output_len_max": c.spec.output_len_max,
            "zipf": c.spec.zipf,
            "stream": c.spec.stream,
            "tenants": c.spec.tenants,
            "tenant_churn": c.spec.tenant_churn,
            "cancel": c.spec.cancel,
            "priorities": c.spec.priorities,
            "seed": c.seed,
        },
        "requests": {
            "sent": r.records.len(),
            "ok": ok.len(),
            "failed": r.records.len() - ok.len() - cancelled,
            "cancelled": cancelled,
            "timeouts": timeouts,
            "overflow": r.overflow,
            "new_connections": r.records.iter().filter(|x| x.new_connection).count(),
        },
        "status": status,
        "errors": errors,
        "elapsed_s": round(secs, 3),
        "requests_per_s": round(ok.len() as f64 / secs, 2),
        "output_tokens": output_tokens,
        "output_tokens_per_s": round(output_tokens as f64 / secs, 1),
        "latency_ms": summary_json(&latency),
        "ttft_ms": summary_json(&ttft),
        "itl_ms": summary_json(&itl),
        "tpot_ms": summary_json(&tpot),
        "send_lag_ms": summary_json(&lag),
        "servers": share,
        "client_cached_token_rate": (prompt_tokens > 0).then(|| round(cached_tokens as f64 / prompt_tokens as f64, 4)),
        "server_metrics": per_server,
        "prefix_cache_hit_rate": (all_read && q > 0.0).then(|| round(h / q, 4)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: u64, server: &str, latency: f64, ttft: f64, tokens: u64) -> Record {
        Record {
            index: i,
            target: "t".into(),
            status: Some(200),
            server: Some(server.into()),
            latency_ms: Some(latency),
            ttft_ms: Some(ttft),
            itl_ms: vec![1.0, 3.0],
            tpot_ms: Some(2.0),
            output_tokens: tokens,
            prompt_tokens: 100,
            cached_tokens: 25,
            ..Record::default()
        }
    }

    #[test]
    fn summary_counts_shares_rates_and_percentiles() {
        let config = Config {
            targets: vec!["t".into()],
            ..Config::default()
        };
        let mut records = vec![
            rec(0, "a", 10.0, 1.0, 3),
            rec(1, "a", 20.0, 2.0, 3),
            rec(2, "b", 30.0, 3.0, 3),
            rec(3, "a", 40.0, 4.0, 3),
        ];
        records.push(Record {
            index: 4,
            status: Some(503),
            ..Record::default()
        });
        records.push(Record {
            index: 5,
            error: Some("connect: refused".into()),
            ..Record::default()
        });
        records.push(Record {
            index: 6,
            timed_out: true,
            ..Record::default()
        });
        let counters = |q: f64, h: f64, n: f64| Counters {
            prefix_queries: q,
            prefix_hits: h,
            requests: n,
            ..Counters::default()
        };
        let s = summarize(&RunResult {
            config: &config,
            records: &records,
            elapsed: Duration::from_secs(2),
            overflow: 1,
            before: vec![
                ("a".into(), Ok(counters(0.0, 0.0, 0.0))),
                ("b".into(), Ok(counters(100.0, 0.0, 1.0))),
            ],
            after: vec![
                ("a".into(), Ok(counters(300.0, 200.0, 3.0))),
                ("b".into(), Ok(counters(200.0, 50.0, 2.0))),
            ],
        });
        assert_eq!(s["requests"]["sent"], 7);
        assert_eq!(s["requests"]["ok"], 4);
        assert_eq!(s["requests"]["failed"], 3);
        assert_eq!(s["requests"]["timeouts"], 1);
        assert_eq!(s["requests"]["overflow"], 1);
        assert_eq!(s["status"]["200"], 4);
        assert_eq!(s["status"]["503"], 1);
        assert_eq!(s["errors"]["connect"], 1);
        assert_eq!(s["requests_per_s"], 2.0);
        assert_eq!(s["output_tokens"], 12);
        assert_eq!(s["output_tokens_per_s"], 6.0);
        assert_eq!(s["latency_ms"]["p50"], 20.0);
        assert_eq!(s["latency_ms"]["p99"], 40.0);
        assert_eq!(s["ttft_ms"]["p90"], 4.0);
        assert_eq!(s["itl_ms"]["count"], 8);
        assert_eq!(s["servers"]["a"]["share"], 0.75);
        assert_eq!(s["servers"]["b"]["requests"], 1);
        assert_eq!(s["client_cached_token_rate"], 0.25);
        // Server-side: (200 + 50) hits of (300 + 100) queries.
        assert_eq!(s["prefix_cache_hit_rate"], 0.625);
        assert_eq!(
            s["server_metrics"]["a"]["prefix_cache_hit_rate"],
            200.0 / 300.0
        );
        assert_eq!(s["server_metrics"]["a"]["share"], 0.75);
        assert_eq!(s["mode"], "closed");
    }

    #[test]
    fn unreadable_server_metrics_give_no_overall_hit_rate() {
        let config = Config::default();
        let s = summarize(&RunResult {
            config: &config,
            records: &[],
            elapsed: Duration::from_secs(1),
            overflow: 0,
            before: vec![("a".into(), Err("connect: refused".into()))],
            after: vec![("a".into(), Ok(Counters::default()))],
        });
        assert_eq!(s["prefix_cache_hit_rate"], Value::Null);
        assert_eq!(s["server_metrics"]["a"]["error"], "connect: refused");
        assert_eq!(s["latency_ms"], Value::Null);
        assert_eq!(s["requests_per_s"], 0.0);
    }
}
