//! Command-line flags of `loadgen`. `--flag value` and `--flag=value` both work.

use super::workload::{Api, Spec};
use std::path::PathBuf;
use std::time::Duration;

pub const USAGE: &str = "\
loadgen: an open-loop (Poisson) or closed-loop load generator for OpenAI-style LLM
servers and gateways. Bounded: stops issuing at --requests or --duration, whichever
first, and gives in-flight requests at most --timeout to finish. Prints a JSON summary.

USAGE: loadgen --url HOST:PORT[,HOST:PORT...] [FLAGS]

Target:
  --url A[,B...]               targets, round-robin per request (http:// optional)
  --api completions|chat       [completions]
  --model NAME                 [sim-model]
  --destinations A[,B...]      set x-gateway-destination-endpoint, round-robin (for a
                               plain Envoy with the ORIGINAL_DST cluster)
  --destination-header NAME    header for --destinations [x-gateway-destination-endpoint]
  --header NAME:VALUE          extra request header (repeatable)
  --new-connection             one connection per request (default: keep-alive pool)
Load:
  --qps F                      open loop: seeded Poisson arrivals at F requests/s
  --concurrency N              closed loop: N requests in flight [default if no --qps: 1]
  --requests N                 requests to issue [unbounded: --duration decides]
  --duration DUR               stop issuing after this long [30s]
  --timeout DUR                per-request limit [60s]
  --warmup N                   requests before measuring (short prompts, not counted) [0]
  --max-in-flight N            open loop: arrivals beyond this many in flight are
                               counted as overflow and not sent [4096]
  --threads N                  tokio worker threads; 1 = current-thread runtime [1]
Workload (lengths in tokens; vllm-sim counts 4 characters per token):
  --groups N                   shared-prefix groups [8]
  --prompts-per-group N        distinct questions per group [8]
  --system-prompt-len N        shared prefix length [256]
  --question-len N[-M]         per-prompt suffix length; N-M: drawn uniformly per
                               prompt [64]
  --output-len N[-M]           max_tokens, with ignore_eos; N-M: drawn uniformly per
                               request [32]
  --zipf S                     skew over groups, weight 1/(k+1)^S [0 = uniform]
  --stream / --no-stream       streamed responses, TTFT and ITL measured [--stream]
  --tenants N                  x-gateway-inference-fairness-id tenant-0..N-1 [0 = none]
  --tenant-churn N             every N requests the tenant ids move on by one (old
                               tenants go idle, new ones appear) [0 = fixed]
  --cancel F                   fraction of streamed requests abandoned (connection
                               closed) after the first token; counted as cancelled [0]
  --priorities A[,B...]        x-gateway-inference-objective values, uniform [none]
  --seed N                     seed of prompts, request sequence and arrivals [1]
Output:
  --label TEXT                 copied into the summary
  --server-metrics A[,B...]    model servers whose /metrics are read before and after
                               (prefix-cache hit rate, requests per server)
  --records FILE               one JSON line per request
  --out FILE                   write the summary there instead of stdout
Durations: 500ms, 2s, 250us, 1m (a bare number is seconds).
";

/// Open or closed loop.
#[derive(Debug, Clone, PartialEq)]
pub enum Load {
    /// Poisson arrivals at this rate.
    Open { qps: f64 },
    /// This many requests in flight.
    Closed { concurrency: usize },
}

/// Everything `loadgen` was asked to do.
#[derive(Debug, Clone)]
pub struct Config {
    pub targets: Vec<String>,
    pub destinations: Vec<String>,
    pub destination_header: String,
    pub headers: Vec<(String, String)>,
    pub keep_alive: bool,
    pub load: Load,
    pub requests: u64,
    pub duration: Duration,
    pub timeout: Duration,
    pub warmup: u64,
    pub max_in_flight: usize,
    pub threads: usize,
    pub spec: Spec,
    pub seed: u64,
    pub label: String,
    pub server_metrics: Vec<String>,
    pub records: Option<PathBuf>,
    pub out: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            targets: Vec::new(),
            destinations: Vec::new(),
            destination_header: "x-gateway-destination-endpoint".into(),
            headers: Vec::new(),
            keep_alive: true,
            load: Load::Closed { concurrency: 1 },
            requests: u64::MAX,
            duration: Duration::from_secs(30),
            timeout: Duration::from_secs(60),
            warmup: 0,
            max_in_flight: 4096,
            threads: 1,
            spec: Spec::default(),
            seed: 1,
            label: String::new(),
            server_metrics: Vec::new(),
            records: None,
            out: None,
        }
    }
}

/// `500ms`, `2s`, `250us`, `1m`; a bare number is seconds.
pub fn parse_duration(v: &str) -> Result<Duration, String> {
    let v = v.trim();
    let (num, scale) = if let Some(n) = v.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = v.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('m') {
        (n, 60.0)
    } else {
        (v, 1.0)
    };
    let x: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid duration {v:?}"))?;
    if !x.is_finite() || x < 0.0 {
        return Err(format!("invalid duration {v:?}"));
    }
    Ok(Duration::from_secs_f64(x * scale))
}

fn list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// `N` or `N-M` (M ≥ N): the range's bounds; a single `N` gives `(N, 0)` (no range).
fn range(v: &str, flag: &str) -> Result<(u32, u32), String> {
    let bad = || format!("{flag}: expected N or N-M (tokens, M >= N), got {v:?}");
    let int = |x: &str| x.trim().parse::<u32>().map_err(|_| bad());
    match v.split_once('-') {
        None => Ok((int(v)?, 0)),
        Some((a, b)) => {
            let (a, b) = (int(a)?, int(b)?);
            if b < a {
                return Err(bad());
            }
            Ok((a, b))
        }
    }
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    Run(Box<Config>),
    Help,
}

const SWITCHES: &[&str] = &["help", "h", "stream", "no-stream", "new-connection"];

/// Parses flags (without the program name).
pub fn parse<I, S>(args: I) -> Result<Command, String>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut c = Config::default();
    let mut qps: Option<f64> = None;
    let mut concurrency: Option<usize> = None;
    let mut args = args.into_iter().map(Into::into);
    while let Some(arg) = args.next() {
        let Some(flag) = arg.strip_prefix("--") else {
            return Err(format!("unexpected argument {arg:?}"));
        };
        let (name, value) = match flag.split_once('=') {
            Some((n, v)) => (n.to_string(), v.to_string()),
            None if SWITCHES.contains(&flag) => (flag.to_string(), String::new()),
            None => {
                let v = args
                    .next()
                    .ok_or_else(|| format!("--{flag} needs a value"))?;
                (flag.to_string(), v)
            }
        };
        let v = value.as_str();
        let num = |what: &str| -> Result<u64, String> {
            v.trim()
                .parse::<u64>()
                .map_err(|_| format!("--{name}: expected a non-negative integer, got {what:?}"))
        };
        let float = || -> Result<f64, String> {
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("--{name}: expected a non-negative number, got {v:?}"))
        };
        let u32_of = |x: u64| -> Result<u32, String> {
            u32::try_from(x).map_err(|_| format!("--{name}: {x} is too large"))
        };
        match name.as_str() {
            "help" | "h" => return Ok(Command::Help),
            "url" => c.targets = list(v),
            "api" => {
                c.spec.api = match v {
                    "completions" => Api::Completions,
                    "chat" => Api::Chat,
                    _ => return Err(format!("--api: expected completions or chat, got {v:?}")),
                }
            }
            "model" => c.spec.model = v.to_string(),
            "destinations" => c.destinations = list(v),
            "destination-header" => c.destination_header = v.trim().to_string(),
            "header" => {
                let (k, val) = v
                    .split_once(':')
                    .ok_or_else(|| format!("--header: expected NAME:VALUE, got {v:?}"))?;
                c.headers
                    .push((k.trim().to_string(), val.trim().to_string()));
            }
            "new-connection" => c.keep_alive = false,
            "qps" => {
                let q = float()?;
                if q <= 0.0 {
                    return Err("--qps must be above 0".into());
                }
                qps = Some(q);
            }
            "concurrency" => concurrency = Some(num(v)?.max(1) as usize),
            "requests" => c.requests = num(v)?,
            "duration" => c.duration = parse_duration(v)?,
            "timeout" => c.timeout = parse_duration(v)?,
            "warmup" => c.warmup = num(v)?,
            "max-in-flight" => c.max_in_flight = num(v)?.max(1) as usize,
            "threads" => c.threads = num(v)?.clamp(1, 64) as usize,
            "groups" => c.spec.groups = u32_of(num(v)?)?.max(1),
            "prompts-per-group" => c.spec.prompts_per_group = u32_of(num(v)?)?.max(1),
            "system-prompt-len" => c.spec.system_prompt_len = u32_of(num(v)?)?,
            "question-len" => {
                (c.spec.question_len, c.spec.question_len_max) = range(v, "--question-len")?
            }
            "output-len" => {
                let (min, max) = range(v, "--output-len")?;
                (c.spec.output_len, c.spec.output_len_max) = (min.max(1), max);
            }
            "zipf" => c.spec.zipf = float()?,
            "stream" => c.spec.stream = true,
            "no-stream" => c.spec.stream = false,
            "tenants" => c.spec.tenants = u32_of(num(v)?)?,
            "tenant-churn" => c.spec.tenant_churn = num(v)?,
            "cancel" => c.spec.cancel = float()?.clamp(0.0, 1.0),
            "priorities" => c.spec.priorities = list(v),
            "seed" => c.seed = num(v)?,
            "label" => c.label = v.to_string(),
            "server-metrics" => c.server_metrics = list(v),
            "records" => c.records = Some(PathBuf::from(v)),
            "out" => c.out = Some(PathBuf::from(v)),
            other => return Err(format!("unknown flag --{other} (see --help)")),
        }
    }
    if c.targets.is_empty() {
        return Err("--url is required (see --help)".into());
    }
    c.load = match (qps, concurrency) {
        (Some(_), Some(_)) => {
            return Err("give --qps (open loop) or --concurrency, not both".into())
        }
        (Some(qps), None) => Load::Open { qps },
        (None, Some(concurrency)) => Load::Closed { concurrency },
        (None, None) => Load::Closed { concurrency: 1 },
    };
    Ok(Command::Run(Box::new(c)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Config {
        match parse(args.iter().copied()) {
            Ok(Command::Run(c)) => *c,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn lengths_take_a_range_and_refuse_a_reversed_one() {
        let c = run(&[
            "--url",
            "h:1",
            "--question-len",
            "40-650",
            "--output-len=16-128",
        ]);
        assert_eq!((c.spec.question_len, c.spec.question_len_max), (40, 650));
        assert_eq!((c.spec.output_len, c.spec.output_len_max), (16, 128));
        let c = run(&["--url", "h:1", "--question-len", "12"]);
        assert_eq!((c.spec.question_len, c.spec.question_len_max), (12, 0));
        let e = parse(["--url", "h:1", "--output-len", "9-3"]).unwrap_err();
        assert!(e.contains("--output-len"), "{e}");
    }

    #[test]
    fn parses_a_full_command_line() {
        let c = run(&[
            "--url=127.0.0.1:1,http://127.0.0.1:2/",
            "--qps",
            "2.5",
            "--requests",
            "100",
            "--duration",
            "20s",
            "--timeout=500ms",
            "--groups",
            "4",
            "--prompts-per-group",
            "5",
            "--system-prompt-len",
            "100",
            "--question-len",
            "50",
            "--output-len",
            "10",
            "--no-stream",
            "--tenants",
            "3",
            "--priorities",
            "critical,sheddable",
            "--seed",
            "9",
            "--api",
            "chat",
            "--header",
            "x-a: b",
            "--new-connection",
            "--zipf",
            "1.2",
            "--destinations",
            "a:1,b:2",
            "--destination-header",
            "x-primary",
        ]);
        assert_eq!(c.targets, vec!["127.0.0.1:1", "http://127.0.0.1:2/"]);
        assert_eq!(c.load, Load::Open { qps: 2.5 });
        assert_eq!(c.requests, 100);
        assert_eq!(c.duration, Duration::from_secs(20));
        assert_eq!(c.timeout, Duration::from_millis(500));
        assert_eq!(
            (
                c.spec.groups,
                c.spec.prompts_per_group,
                c.spec.system_prompt_len
            ),
            (4, 5, 100)
        );
        assert_eq!((c.spec.question_len, c.spec.output_len), (50, 10));
        assert!(!c.spec.stream);
        assert_eq!(c.spec.tenants, 3);
        assert_eq!(c.spec.priorities, vec!["critical", "sheddable"]);
        assert_eq!(c.seed, 9);
        assert_eq!(c.spec.api, Api::Chat);
        assert_eq!(c.headers, vec![("x-a".to_string(), "b".to_string())]);
        assert!(!c.keep_alive);
        assert_eq!(c.spec.zipf, 1.2);
        assert_eq!(c.destinations, vec!["a:1", "b:2"]);
        assert_eq!(c.destination_header, "x-primary");
    }

    #[test]
    fn defaults_to_one_closed_loop_client() {
        let c = run(&["--url", "h:1"]);
        assert_eq!(c.load, Load::Closed { concurrency: 1 });
        assert!(c.keep_alive && c.spec.stream);
        assert_eq!(c.destination_header, "x-gateway-destination-endpoint");
        assert_eq!(c.duration, Duration::from_secs(30));
        let c = run(&["--url", "h:1", "--concurrency", "16"]);
        assert_eq!(c.load, Load::Closed { concurrency: 16 });
    }

    #[test]
    fn rejects_bad_command_lines() {
        for bad in [
            &["--qps", "1"][..],
            &["--url", "h:1", "--qps", "1", "--concurrency", "2"],
            &["--url", "h:1", "--qps", "0"],
            &["--url", "h:1", "--qps", "-1"],
            &["--url", "h:1", "--requests", "x"],
            &["--url", "h:1", "--api", "embeddings"],
            &["--url", "h:1", "--header", "nocolon"],
            &["--url", "h:1", "--bogus", "1"],
            &["--url", "h:1", "--duration"],
            &["--url", "h:1", "stray"],
        ] {
            assert!(parse(bad.iter().copied()).is_err(), "{bad:?}");
        }
        assert!(matches!(parse(["--help"]), Ok(Command::Help)));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
