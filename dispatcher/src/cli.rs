//! The command line: which queue, which gates, which gateway.

use crate::gate::composite::Composite;
use crate::gate::constant::Constant;
use crate::gate::local_max::LocalMax;
use crate::gate::saturation::{Saturation, Unit};
use crate::gate::Gate;
use crate::gateway::Gateway;
use crate::metrics::Source;
use crate::queue::file::FileQueue;
use crate::queue::redis::{Keys, RedisQueue};
use crate::queue::Queue;
use crate::run::{self, Options, Summary};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub const USAGE: &str = "\
usage: dispatcher --gateway URL (--input IN.jsonl --output OUT.jsonl | --redis URL) [options]

Lets batch requests into the gateway only as fast as the pool has spare capacity.

gateway:
  --gateway URL                the gateway listener, e.g. http://127.0.0.1:8080
  --objective NAME             x-gateway-inference-objective of every request; declare it in
                               the gateway's pool.objectives with a negative priority [batch]
                               (\"\" sends none)
  --fairness-header NAME       header carrying the fairness id [x-gateway-inference-fairness-id]
  --request-priority N         vLLM's body field `priority` (an integer, lower is served
                               earlier) on every request whose body has none, for servers
                               run with --scheduling-policy priority (with the default fcfs
                               vLLM answers 400 to any priority but 0) [none]
  --request-timeout DUR        per request [10m]
  --max-attempts N             tries of a request that got 503 or no answer [5]

queue (one of):
  --input FILE --output FILE   OpenAI Batch JSONL in, results JSONL out; resumes from OUT
  --fairness-id ID             (file) the fairness id of every request [batch]
  --redis URL                  llm-d-async redis-sortedset transport (env REDIS_URL)
    --request-queue KEY        [request-sortedset]
    --retry-queue KEY          [retry-sortedset]
    --result-list KEY          [result-list] (a message's result_queue_name wins)
    --request-path PATH        path when a message has no endpoint [/v1/completions]
    --fairness-attribute K     metadata key of the fairness id [userid]
    --lease DUR                lease of a taken request, renewed while in flight [30s]
    --answered-ttl DUR         how long a request id is remembered as answered [24h]
    --exit-when-drained        exit once nothing is left unanswered

gates (repeat --gate for several: the minimum applies):
  --gate saturation            the dispatch budget from the pool's metrics (default)
  --gate constant:D            a fixed budget D in [0,1] of --workers
  --gate local-max-concurrency:M   at most M in flight from this process
  --metrics SOURCE             envoy-stats=URL (Envoy admin /stats/prometheus),
                               prometheus-text=URL (the filter's metrics endpoint),
                               prometheus-query=URL (a Prometheus server),
                               servers=URL,URL (the model servers' /metrics: running +
                               waiting over servers x --max-concurrency)
  --pool NAME                  the pool's label value, when the metrics hold several
  --saturation-unit U          fraction | thousandths [envoy-stats: thousandths, else fraction]
  --max-concurrency N          per-endpoint request capacity (the detector's maxConcurrency) [100]
  --baseline B                 headroom kept for interactive traffic [0.05]
  --max-bytes-per-endpoint N   budget in body bytes instead of requests

loop:
  --workers N                  most requests in flight from this process [64]
  --metrics-interval DUR       how often the gate decides [500ms]
  --metrics-lag DUR            how long a dispatch takes to show in the metrics (the filter
                               sets its gauges once a second): younger requests count
                               against the new budget [1s]
  --poll-interval DUR          how often an idle queue is polled [200ms]
  --progress-every DUR         progress line on stderr [5s] (0: none)
  --budget-log FILE            append every gate decision as a JSON line
  --drain-timeout DUR          after SIGTERM/SIGINT, how long in-flight requests may finish [60s]

Prints a JSON summary on stdout at exit.";

/// Parsed options.
#[derive(Debug, Clone)]
pub struct Config {
    pub gateway: String,
    pub objective: Option<String>,
    pub fairness_header: String,
    pub request_priority: Option<i64>,
    pub request_timeout: Duration,
    pub max_attempts: u32,
    pub input: Option<PathBuf>,
    pub output: Option<PathBuf>,
    pub fairness_id: Option<String>,
    pub redis: Option<String>,
    pub keys: Keys,
    pub fairness_attribute: String,
    pub exit_when_drained: bool,
    pub gates: Vec<String>,
    pub metrics: Option<Source>,
    pub pool: Option<String>,
    pub saturation_scale: Option<f64>,
    pub max_concurrency: u64,
    pub baseline: f64,
    pub max_bytes: Option<u64>,
    pub workers: u64,
    pub metrics_interval: Duration,
    pub metrics_lag: Duration,
    pub poll_interval: Duration,
    pub progress_every: Option<Duration>,
    pub budget_log: Option<PathBuf>,
    pub drain_timeout: Duration,
}

/// `100ms`, `2s`, `5m`, `1h` (a bare number is seconds).
pub fn duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}`: not a duration (100ms, 2s, 5m, 1h)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("`{s}`: unknown unit (ms, s, m, h)")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("`{s}`: not a duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

impl Config {
    /// `Ok(None)` for `--help`.
    pub fn parse(args: &[String]) -> Result<Option<Config>, String> {
        let mut c = Config {
            gateway: String::new(),
            objective: Some("batch".into()),
            fairness_header: "x-gateway-inference-fairness-id".into(),
            request_priority: None,
            request_timeout: Duration::from_secs(600),
            max_attempts: 5,
            input: None,
            output: None,
            fairness_id: Some("batch".into()),
            redis: std::env::var("REDIS_URL").ok().filter(|s| !s.is_empty()),
            keys: Keys {
                queue: "request-sortedset".into(),
                retry: "retry-sortedset".into(),
                results: "result-list".into(),
                request_path: "/v1/completions".into(),
                lease: Duration::from_secs(30),
                answered_ttl: Duration::from_secs(24 * 3600),
            },
            fairness_attribute: "userid".into(),
            exit_when_drained: false,
            gates: Vec::new(),
            metrics: None,
            pool: None,
            saturation_scale: None,
            max_concurrency: 100,
            baseline: 0.05,
            max_bytes: None,
            workers: 64,
            metrics_interval: Duration::from_millis(500),
            metrics_lag: Duration::from_secs(1),
            poll_interval: Duration::from_millis(200),
            progress_every: Some(Duration::from_secs(5)),
            budget_log: None,
            drain_timeout: Duration::from_secs(60),
        };
        let mut redis_given = false;
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let flag = flag.as_str();
            if flag == "-h" || flag == "--help" {
                return Ok(None);
            }
            if flag == "--exit-when-drained" {
                c.exit_when_drained = true;
                continue;
            }
            let (flag, value) = match flag.split_once('=') {
                Some((f, v)) => (f, v.to_string()),
                None => (
                    flag,
                    it.next()
                        .ok_or_else(|| format!("{flag} needs a value"))?
                        .clone(),
                ),
            };
            let num = |v: &str| -> Result<u64, String> {
                v.parse()
                    .map_err(|_| format!("{flag}: `{v}` is not a whole number"))
            };
            match flag {
                "--gateway" => c.gateway = value,
                "--objective" => c.objective = Some(value).filter(|s| !s.is_empty()),
                "--fairness-header" => c.fairness_header = value,
                "--request-priority" => {
                    c.request_priority =
                        Some(value.parse::<i64>().map_err(|_| {
                            format!("--request-priority: `{value}` is not an integer")
                        })?)
                }
                "--request-timeout" => c.request_timeout = duration(&value)?,
                "--max-attempts" => c.max_attempts = num(&value)?.max(1) as u32,
                "--input" => c.input = Some(value.into()),
                "--output" => c.output = Some(value.into()),
                "--fairness-id" => c.fairness_id = Some(value).filter(|s| !s.is_empty()),
                "--redis" => {
                    c.redis = Some(value);
                    redis_given = true;
                }
                "--request-queue" => c.keys.queue = value,
                "--retry-queue" => c.keys.retry = value,
                "--result-list" => c.keys.results = value,
                "--request-path" => c.keys.request_path = value,
                "--fairness-attribute" => c.fairness_attribute = value,
                "--lease" => c.keys.lease = duration(&value)?,
                "--answered-ttl" => c.keys.answered_ttl = duration(&value)?,
                "--gate" => c.gates.push(value),
                "--metrics" => {
                    c.metrics = Some(Source::parse(&value).map_err(|e| format!("--metrics {e}"))?)
                }
                "--pool" => c.pool = Some(value),
                "--saturation-unit" => {
                    c.saturation_scale = Some(match value.as_str() {
                        "fraction" => 1.0,
                        "thousandths" => 0.001,
                        _ => {
                            return Err(format!(
                                "--saturation-unit: `{value}` (fraction or thousandths)"
                            ))
                        }
                    })
                }
                "--max-concurrency" => c.max_concurrency = num(&value)?,
                "--baseline" => {
                    c.baseline = value
                        .parse::<f64>()
                        .ok()
                        .filter(|b| (0.0..1.0).contains(b))
                        .ok_or_else(|| format!("--baseline: `{value}` is not in [0, 1)"))?
                }
                "--max-bytes-per-endpoint" => c.max_bytes = Some(num(&value)?),
                "--workers" => c.workers = num(&value)?.max(1),
                "--metrics-interval" => c.metrics_interval = duration(&value)?,
                "--metrics-lag" => c.metrics_lag = duration(&value)?,
                "--poll-interval" => c.poll_interval = duration(&value)?,
                "--progress-every" => {
                    c.progress_every = Some(duration(&value)?).filter(|d| !d.is_zero())
                }
                "--budget-log" => c.budget_log = Some(value.into()),
                "--drain-timeout" => c.drain_timeout = duration(&value)?,
                _ => return Err(format!("unknown option {flag}")),
            }
        }
        if c.gateway.is_empty() {
            return Err("--gateway URL is required".into());
        }
        match (&c.input, &c.output) {
            (Some(_), Some(_)) if redis_given => {
                return Err("--input/--output and --redis: choose one queue".into())
            }
            (Some(_), Some(_)) => c.redis = None,
            (Some(_), None) | (None, Some(_)) => {
                return Err("--input and --output go together".into())
            }
            (None, None) if c.redis.is_none() => {
                return Err("no queue: --input IN --output OUT, or --redis URL".into())
            }
            _ => {}
        }
        if c.gates.is_empty() {
            c.gates.push("saturation".into());
        }
        for g in &c.gates {
            if g == "saturation" && c.metrics.is_none() {
                return Err("--gate saturation needs --metrics (e.g. envoy-stats=http://127.0.0.1:9901/stats/prometheus)".into());
            }
        }
        Ok(Some(c))
    }

    fn gate(&self, spec: &str, client: &reqwest::Client) -> Result<Box<dyn Gate>, String> {
        let (kind, arg) = spec.split_once(':').unwrap_or((spec, ""));
        match kind {
            "saturation" => {
                let source = self
                    .metrics
                    .clone()
                    .ok_or("--gate saturation needs --metrics")?;
                Ok(Box::new(Saturation {
                    client: client.clone(),
                    scale: self.saturation_scale.unwrap_or(source.default_scale()),
                    source,
                    pool: self.pool.clone(),
                    max_concurrency: self.max_concurrency,
                    baseline: self.baseline,
                    unit: match self.max_bytes {
                        Some(b) => Unit::Bytes(b),
                        None => Unit::Requests,
                    },
                    timeout: Duration::from_secs(2),
                    last: None,
                }))
            }
            "constant" => {
                let budget = arg
                    .parse::<f64>()
                    .ok()
                    .filter(|d| (0.0..=1.0).contains(d))
                    .ok_or_else(|| format!("--gate {spec}: constant:D needs D in [0, 1]"))?;
                Ok(Box::new(Constant {
                    budget,
                    workers: self.workers,
                }))
            }
            "local-max-concurrency" => {
                let max = arg.parse::<u64>().map_err(|_| {
                    format!("--gate {spec}: local-max-concurrency:M needs a whole M")
                })?;
                Ok(Box::new(LocalMax { max }))
            }
            _ => Err(format!(
                "--gate {spec}: unknown gate (saturation, constant:D, local-max-concurrency:M)"
            )),
        }
    }
}

/// Builds the queue, gates and gateway client and runs until drained or signalled.
pub async fn run(c: Config) -> Result<Summary, String> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(c.workers as usize)
        .build()
        .map_err(|e| format!("HTTP client: {e}"))?;
    let mut gates = Vec::new();
    for g in &c.gates {
        gates.push(c.gate(g, &client)?);
    }
    let gate: Box<dyn Gate> = if gates.len() == 1 {
        gates.remove(0)
    } else {
        Box::new(Composite { gates })
    };
    let (queue, exit_when_drained): (Box<dyn Queue>, bool) = match (&c.input, &c.output, &c.redis) {
        (Some(i), Some(o), _) => (
            Box::new(FileQueue::open(i, o, c.fairness_id.clone())?),
            true,
        ),
        (_, _, Some(url)) => (
            Box::new(RedisQueue::connect(url, c.keys.clone(), c.fairness_attribute.clone()).await?),
            c.exit_when_drained,
        ),
        _ => return Err("no queue".into()),
    };
    eprintln!("dispatcher: gate {}", gate.describe());
    let gateway = Arc::new(Gateway {
        client,
        base: c.gateway.clone(),
        objective: c.objective.clone(),
        fairness_header: c.fairness_header.clone(),
        timeout: c.request_timeout,
        request_priority: c.request_priority,
    });
    let opts = Options {
        workers: c.workers,
        metrics_interval: c.metrics_interval,
        poll_interval: c.poll_interval,
        max_attempts: c.max_attempts,
        progress_every: c.progress_every,
        exit_when_drained,
        budget_log: c.budget_log.clone(),
        drain_timeout: c.drain_timeout,
        metrics_lag: c.metrics_lag,
    };
    run::run(queue, gate, gateway, opts, signal()).await
}

async fn signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn errors_name_the_option() {
        let e = Config::parse(&args("--gateway http://g --input a")).unwrap_err();
        assert!(e.contains("--output"), "{e}");
        let e = Config::parse(&args("--gateway http://g --input a --output b")).unwrap_err();
        assert!(e.contains("--metrics"), "{e}");
        let e = Config::parse(&args(
            "--gateway http://g --input a --output b --gate constant:0.5 --baseline 2",
        ))
        .unwrap_err();
        assert!(e.contains("--baseline"), "{e}");
        let e = Config::parse(&args(
            "--gateway http://g --input a --output b --gate constant:1 --request-priority high",
        ))
        .unwrap_err();
        assert!(e.contains("--request-priority"), "{e}");
        let c = Config::parse(&args(
            "--gateway http://g --input a --output b --gate constant:1 --request-priority -3",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(c.request_priority, Some(-3));
    }

    #[test]
    fn durations() {
        assert_eq!(duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(duration("2").unwrap(), Duration::from_secs(2));
        assert!(duration("3d").is_err());
    }
}
