//! Command-line flags. `--flag value` and `--flag=value` both work.

use crate::engine::latency::LatencyProfile;
use crate::engine::SchedulingPolicy;
use crate::metrics::MetricsStyle;
use crate::server::{LoraModule, ServerConfig};
use crate::settings;
use crate::time::parse_duration;
use std::net::IpAddr;

pub const USAGE: &str = "\
vllm-sim: a simulated vLLM server (OpenAI API, SSE streaming, Prometheus metrics)

USAGE: vllm-sim [FLAGS]

Server:
  --host IP                         listen address [127.0.0.1]
  --port N                          port of rank 0, rank i listens on port+i; 0 = ephemeral [8000]
  --model NAME                      model name (env SIM_MODEL) [sim-model]
  --served-model-name NAME[,NAME]   names the model answers to; the first is displayed [--model]
  --server-name NAME                value of the x-sim-server response header [ip:port]
  --data-parallel-size N            ranks, each with its own engine and port [1]
  --startup-duration DUR            /health/ready and inference answer 503 until then [0s]
  --max-request-body-size-mb N      [4]
Engine:
  --max-num-seqs N                  running batch size [5, as llm-d-inference-sim]
  --max-waiting-queue-length N      waiting requests before 429 [1000]
  --scheduling-policy fcfs|priority waiting order: arrival, or the body's priority (lower
                                    first) then arrival; priority also picks the preemption
                                    victim; fcfs refuses a priority other than 0 [fcfs]
  --max-model-len N                 context window in tokens [4096]
  --max-num-batched-tokens N        token budget per step (chunked prefill) [8192]
  --long-prefill-token-threshold N  most tokens one request computes per step, so a long
                                    prompt is prefilled in chunks of at most N; 0 = off [0]
  --max-num-partial-prefills 1      accepted with vLLM's default 1 only (vLLM's V1 engine
  --max-long-partial-prefills 1     refuses other values: no concurrent partial prefills)
  --block-size N                    tokens per KV block [16]
  --kv-events-config JSON           vLLM's KV events over ZMQ (vLLM's KVEventsConfig:
                                    enable_kv_cache_events, publisher, endpoint,
                                    replay_endpoint, buffer_steps, topic; port 0:
                                    ephemeral, printed at start)
  --tokenizer DIR                   a model directory (tokenizer.json, tokenizer_config.json
                                    or chat_template.jinja): prompts are tokenized and chat
                                    rendered as the real model's [the stand-in tokenizer]
  --num-gpu-blocks N                KV capacity in blocks (alias --kv-cache-size) [4096]
  --max-loras N                     distinct LoRA adapters per batch [1]
  --lora-modules NAME=PATH[,...]    adapters loaded at start (also JSON {\"name\",\"path\"})
  --seed N                          seed of lengths, texts and jitter [0]
Latency (see README for the profiles):
  --profile NAME                    h100-llama-8b | zero [h100-llama-8b]
  --time-to-first-token DUR         constant prefill cost (sets prefill-time-per-token to 0)
  --prefill-overhead DUR            fixed cost of a step that prefills
  --prefill-time-per-token DUR      cost per uncached prompt token
  --inter-token-latency DUR         decode step with one sequence
  --time-factor-under-load F        ITL multiplier at max-num-seqs running
  --batch-slowdown F                decode step growth per extra sequence
  --kv-slowdown F                   decode step growth at 100% KV usage
  --kv-cache-transfer-latency DUR   P/D decode side: fixed transfer cost
  --kv-cache-transfer-time-per-token DUR
  --latency-jitter F                relative std-dev of step durations
  --latency-scale F                 multiplies all durations
Failures:
  --failure-injection-rate PCT      percent of requests that fail [0]
  --failure-types T[,T]             rate_limit, invalid_api_key, context_length, server_error,
                                    invalid_request, model_not_found [all]
Metrics:
  --metrics-style vllm|sglang       metric names [vllm]
  --legacy-metrics                  also expose removed vLLM names (vllm:gpu_cache_usage_perc, ...)

Durations: 100ms, 1s, 250us (a bare number is milliseconds).
Runtime changes: GET/POST /admin/config with the latency and failure settings above.
";

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    Run(Box<ServerConfig>),
    Help,
}

/// Flags accepted for vLLM compatibility and ignored (with their arity).
const IGNORED: &[(&str, bool)] = &[
    ("enable-prefix-caching", false),
    ("no-enable-prefix-caching", false),
    ("enforce-eager", false),
    ("enable-lora", false),
    ("disable-log-requests", false),
    ("tensor-parallel-size", true),
    ("gpu-memory-utilization", true),
    ("dtype", true),
];

/// Parses flags (without the program name).
pub fn parse<I, S>(args: I) -> Result<Command, String>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut flags: Vec<(String, Option<String>)> = Vec::new();
    let mut args = args.into_iter().map(Into::into).peekable();
    while let Some(arg) = args.next() {
        let Some(flag) = arg.strip_prefix("--") else {
            return Err(format!("unexpected argument {arg:?}"));
        };
        if let Some((name, value)) = flag.split_once('=') {
            flags.push((name.to_string(), Some(value.to_string())));
        } else if is_switch(flag) {
            flags.push((flag.to_string(), None));
        } else {
            let value = args
                .next()
                .ok_or_else(|| format!("--{flag} needs a value"))?;
            flags.push((flag.to_string(), Some(value)));
        }
    }

    let mut config = ServerConfig::default();
    if let Ok(model) = std::env::var("SIM_MODEL") {
        if !model.is_empty() {
            config.served_model_names = vec![model];
        }
    }
    let mut served_names: Option<Vec<String>> = None;
    let mut latency = LatencyProfile::h100_llama_8b();
    // Latency and failure settings apply after everything else (they depend on
    // --profile and --max-num-seqs).
    let mut runtime: Vec<(String, String)> = Vec::new();

    for (name, value) in flags {
        let v = value.clone().unwrap_or_default();
        let int = |v: &str| -> Result<usize, String> {
            v.trim()
                .parse::<usize>()
                .map_err(|_| format!("--{name}: expected a non-negative integer, got {v:?}"))
        };
        match name.as_str() {
            "help" | "h" => return Ok(Command::Help),
            "host" => {
                config.host = v
                    .parse::<IpAddr>()
                    .map_err(|_| format!("--host: invalid IP address {v:?}"))?
            }
            "port" => {
                config.port = v
                    .parse()
                    .map_err(|_| format!("--port: invalid port {v:?}"))?
            }
            "model" => config.served_model_names = vec![v],
            "served-model-name" => served_names = Some(split_list(&v)),
            "server-name" => config.server_name = Some(v),
            "data-parallel-size" => config.data_parallel_size = int(&v)?.max(1),
            "startup-duration" => config.startup_duration = parse_duration(&v)?,
            "max-request-body-size-mb" => {
                config.max_request_body_bytes = int(&v)?.clamp(1, 512) << 20
            }
            "max-num-seqs" => config.engine.max_num_seqs = int(&v)?.max(1),
            "max-waiting-queue-length" => config.engine.max_waiting_queue_length = int(&v)?,
            "scheduling-policy" => {
                config.engine.scheduling_policy = SchedulingPolicy::parse(&v).ok_or_else(|| {
                    format!("--scheduling-policy: expected fcfs or priority, got {v:?}")
                })?
            }
            "max-model-len" => config.engine.max_model_len = int(&v)?.max(2),
            "max-num-batched-tokens" => config.engine.max_num_batched_tokens = int(&v)?.max(1),
            "long-prefill-token-threshold" => config.engine.long_prefill_token_threshold = int(&v)?,
            "max-num-partial-prefills" | "max-long-partial-prefills" => {
                if int(&v)? != 1 {
                    return Err(format!(
                        "--{name}: only 1 is supported: vLLM's V1 engine refuses other values \
                         (\"Concurrent Partial Prefill is not supported\"); cap a long prompt's \
                         chunk with --long-prefill-token-threshold"
                    ));
                }
            }
            "block-size" => config.engine.block_size = int(&v)?.max(1),
            "num-gpu-blocks" | "kv-cache-size" => config.engine.num_gpu_blocks = int(&v)?,
            "max-loras" => config.engine.max_loras = int(&v)?,
            "lora-modules" => config.lora_modules.extend(parse_lora_modules(&v)?),
            "tokenizer" => {
                config.tokenizer = Some(std::sync::Arc::new(
                    crate::model_tokenizer::ModelTokenizer::load(std::path::Path::new(&v))
                        .map_err(|e| format!("--tokenizer: {e}"))?,
                ))
            }
            "kv-events-config" => config.kv_events = crate::kv_events::KvEventsConfig::parse(&v)?,
            "seed" => {
                config.engine.seed = v
                    .trim()
                    .parse()
                    .map_err(|_| format!("--seed: expected an integer, got {v:?}"))?
            }
            "metrics-style" => {
                config.metrics.style = MetricsStyle::parse(&v)
                    .ok_or_else(|| format!("--metrics-style: expected vllm or sglang, got {v:?}"))?
            }
            "legacy-metrics" => config.metrics.legacy_names = true,
            "profile" | "latency-profile" => {
                latency = LatencyProfile::by_name(&v).ok_or_else(|| {
                    format!("--profile: unknown profile {v:?} (h100-llama-8b, zero)")
                })?
            }
            other if settings::RUNTIME_SETTINGS.contains(&other) => runtime.push((name, v)),
            other => match IGNORED.iter().find(|(n, _)| *n == other) {
                Some(_) => {}
                None => return Err(format!("unknown flag --{other} (see --help)")),
            },
        }
    }
    if let Some(names) = served_names {
        if !names.is_empty() {
            config.served_model_names = names;
        }
    }
    for (name, value) in runtime {
        settings::apply(
            &name,
            &value,
            &mut latency,
            &mut config.failures,
            config.engine.max_num_seqs,
        )?;
    }
    config.engine.latency = latency;
    config.engine.model = config.served_model_names[0].clone();
    Ok(Command::Run(Box::new(config)))
}

fn is_switch(flag: &str) -> bool {
    matches!(flag, "help" | "h" | "legacy-metrics")
        || IGNORED
            .iter()
            .any(|(n, takes_value)| *n == flag && !takes_value)
}

fn split_list(v: &str) -> Vec<String> {
    v.split([',', ' '])
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// `name=path[,name=path]`, or JSON `{"name":..,"path":..}` (llm-d-inference-sim style).
fn parse_lora_modules(v: &str) -> Result<Vec<LoraModule>, String> {
    let v = v.trim();
    if v.starts_with('{') {
        let json: serde_json::Value =
            serde_json::from_str(v).map_err(|e| format!("--lora-modules: {e}"))?;
        let name = json["name"]
            .as_str()
            .ok_or("--lora-modules: missing \"name\"")?;
        let path = json["path"].as_str().unwrap_or(name);
        return Ok(vec![LoraModule {
            name: name.into(),
            path: path.into(),
        }]);
    }
    split_list(v)
        .into_iter()
        .map(|item| match item.split_once('=') {
            Some((n, p)) => Ok(LoraModule {
                name: n.into(),
                path: p.into(),
            }),
            None => Ok(LoraModule {
                name: item.clone(),
                path: item,
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn run(args: &[&str]) -> ServerConfig {
        match parse(args.iter().copied()).unwrap() {
            Command::Run(c) => *c,
            Command::Help => panic!("help"),
        }
    }

    #[test]
    fn flags_set_the_config() {
        let c = run(&[
            "--port",
            "0",
            "--model",
            "m1",
            "--profile",
            "zero",
            "--inter-token-latency=12ms",
            "--time-to-first-token",
            "30ms",
            "--max-num-seqs",
            "8",
            "--seed",
            "42",
            "--data-parallel-size",
            "2",
            "--server-name",
            "s",
            "--legacy-metrics",
            "--lora-modules",
            "a=/p/a,b",
            "--tensor-parallel-size",
            "1",
            "--scheduling-policy",
            "priority",
            "--max-num-batched-tokens",
            "2048",
            "--long-prefill-token-threshold",
            "64",
            "--max-num-partial-prefills",
            "1",
        ]);
        assert_eq!(c.port, 0);
        assert_eq!(c.served_model_names, vec!["m1"]);
        assert_eq!(c.engine.model, "m1");
        assert_eq!(c.engine.latency.name, "zero");
        assert_eq!(
            c.engine.latency.inter_token_latency,
            Duration::from_millis(12)
        );
        assert_eq!(c.engine.latency.prefill_overhead, Duration::from_millis(30));
        assert_eq!(c.engine.max_num_seqs, 8);
        assert_eq!(c.engine.seed, 42);
        assert_eq!(c.engine.scheduling_policy, SchedulingPolicy::Priority);
        assert_eq!(run(&[]).engine.scheduling_policy, SchedulingPolicy::Fcfs);
        assert_eq!(c.engine.max_num_batched_tokens, 2048);
        assert_eq!(c.engine.long_prefill_token_threshold, 64);
        assert_eq!(run(&[]).engine.long_prefill_token_threshold, 0);
        assert_eq!(c.data_parallel_size, 2);
        assert!(c.metrics.legacy_names);
        assert_eq!(c.lora_modules.len(), 2);
        assert_eq!(c.lora_modules[1].path, "b");
    }

    #[test]
    fn overrides_apply_after_the_profile_whatever_the_order() {
        let c = run(&["--inter-token-latency", "5ms", "--profile", "h100-llama-8b"]);
        assert_eq!(
            c.engine.latency.inter_token_latency,
            Duration::from_millis(5)
        );
        assert_eq!(
            c.engine.latency.prefill_per_token,
            Duration::from_micros(250)
        );
    }

    #[test]
    fn bad_flags_are_errors_and_help_is_help() {
        assert!(parse(["--nope"]).is_err());
        assert!(parse(["--port"]).is_err());
        assert!(parse(["--port", "x"]).is_err());
        assert!(parse(["--profile", "b200"]).is_err());
        assert!(parse(["--inter-token-latency", "fast"]).is_err());
        let err = parse(["--max-num-partial-prefills", "4"]).unwrap_err();
        assert!(err.starts_with("--max-num-partial-prefills:"), "{err}");
        assert!(parse(["--max-long-partial-prefills", "2"]).is_err());
        let err = parse(["--scheduling-policy", "sjf"]).unwrap_err();
        assert!(err.starts_with("--scheduling-policy:"), "{err}");
        assert!(matches!(parse(["--help"]), Ok(Command::Help)));
    }
}
