//! What batch work costs interactive TTFT inside one engine, in virtual time (no noise,
//! no gateway), and which engine settings change it: interactive requests arrive
//! (Poisson) at a share of the engine's capacity while `k` batch requests are kept in
//! flight (what an ideal gate holding exactly `k` would do), for every combination of
//! the engine's step budget (`--max-num-batched-tokens`), per-request chunk cap
//! (`--long-prefill-token-threshold`) and scheduling policy (under `priority` batch
//! requests carry priority 10).
//!
//! ```text
//! cargo run --release -p vllm-sim --example batch_interference -- [--seconds 600]
//!     [--load 0.37] [--k 0,1,2,4] [--mnbt 8192] [--threshold 0] [--policy fcfs,priority]
//!     [--prefill-us 250] [--overhead-ms 30] [--batch-slowdown 0.0667] [--kv-slowdown 1]
//! ```
//!
//! `--load`: interactive arrivals ÷ the engine's interactive capacity; `--prefill-us` and
//! `--overhead-ms`: the profile's prefill cost per uncached token and per prefilling
//! step (`h100-llama-8b`: 250 µs, 30 ms); `--batch-slowdown` and `--kv-slowdown`: the
//! decode step's growth per extra running sequence and at a full KV cache (1/15, 1).
//! Lists are comma-separated.
//!
//! The shapes are `scripts/bench batch`'s: interactive = a 256-token system prompt (one
//! of 16) + a 64-token question (one of 16 per group, so mostly prefix-cached), 32 output
//! tokens; batch = a distinct 322-token prompt (never cached), 32 output tokens;
//! `h100-llama-8b`, 8 sequences.
//!
//! Every row's TTFT p90 rise is against the default engine (budget 8192, no threshold,
//! `fcfs`) without batch; `of allowed` is the batch rate against what the spare capacity
//! allows: (1 − load) × the default engine's rate with only batch requests (8 in flight).

use std::collections::HashMap;
use std::time::Duration;
use vllm_sim::engine::latency::LatencyProfile;
use vllm_sim::engine::{Engine, EngineConfig, EngineRequest, EventKind, SchedulingPolicy};
use vllm_sim::rng::Rng;
use vllm_sim::tokenizer;

const MAX_NUM_SEQS: usize = 8;
const OUTPUT: u32 = 32;

struct Setup {
    seconds: f64,
    latency: LatencyProfile,
}

/// The engine settings under test.
#[derive(Clone, Copy)]
struct Knobs {
    max_num_batched_tokens: usize,
    long_prefill_token_threshold: usize,
    policy: SchedulingPolicy,
}

const DEFAULT_KNOBS: Knobs = Knobs {
    max_num_batched_tokens: 8192,
    long_prefill_token_threshold: 0,
    policy: SchedulingPolicy::Fcfs,
};

struct Outcome {
    interactive_done: usize,
    batch_done: usize,
    /// Prompt + output tokens of the batch requests done.
    batch_tokens: usize,
    ttfts: Vec<f64>,
}

fn interactive_prompt(rng: &mut Rng) -> Vec<u32> {
    // One of 16 system prompts, then one of 16 questions of that group (loadgen's
    // `--groups 16 --prompts-per-group 16`), 4 characters a token: 256 + 64 tokens.
    let (group, question) = (rng.below(16), rng.below(16));
    let system = format!("sys{group:02} ").repeat(256 * 4 / 6 + 1)[..256 * 4].to_string();
    let question =
        format!("q{group:02}-{question:02} ").repeat(64 * 4 / 7 + 1)[..64 * 4].to_string();
    tokenizer::encode(&(system + &question))
}

fn batch_prompt(n: u64) -> Vec<u32> {
    let words: Vec<String> = (0..320)
        .map(|k| format!("w{:02}", (n * 7 + k) % 97))
        .collect();
    tokenizer::encode(&format!("doc{n:05} {}", words.join(" ")))
}

/// Runs `seconds` of interactive arrivals at `qps` (0: a closed loop of
/// `MAX_NUM_SEQS` interactive requests, the capacity; negative: none) with `k` batch
/// requests in flight.
fn run(setup: &Setup, knobs: Knobs, qps: f64, k: usize, seed: u64) -> Outcome {
    let mut engine = Engine::new(EngineConfig {
        latency: setup.latency.clone(),
        max_num_seqs: MAX_NUM_SEQS,
        max_num_batched_tokens: knobs.max_num_batched_tokens,
        long_prefill_token_threshold: knobs.long_prefill_token_threshold,
        scheduling_policy: knobs.policy,
        seed,
        ..EngineConfig::default()
    });
    let batch_priority = if knobs.policy == SchedulingPolicy::Priority {
        10
    } else {
        0
    };
    let mut rng = Rng::new(seed + 1000);
    let end = Duration::from_secs_f64(setup.seconds);
    // id → (arrival, interactive)
    let mut live: HashMap<u64, (Duration, bool)> = HashMap::new();
    let mut n_batch = 0u64;
    let mut out = Outcome {
        interactive_done: 0,
        batch_done: 0,
        batch_tokens: 0,
        ttfts: Vec::new(),
    };
    let mut submit = |engine: &mut Engine, live: &mut HashMap<_, _>, at, interactive: bool| {
        let request = if interactive {
            EngineRequest::fixed(interactive_prompt(&mut rng), OUTPUT)
        } else {
            n_batch += 1;
            EngineRequest {
                priority: batch_priority,
                ..EngineRequest::fixed(batch_prompt(n_batch), OUTPUT)
            }
        };
        let id = engine.submit(request, at).expect("submitted");
        live.insert(id, (at, interactive));
    };
    let mut arrivals = Rng::new(seed + 2000);
    let mut next_arrival = if qps > 0.0 {
        Duration::from_secs_f64(arrivals.exp(qps))
    } else {
        end
    };
    for _ in 0..k {
        submit(&mut engine, &mut live, Duration::ZERO, false);
    }
    if qps == 0.0 {
        for _ in 0..MAX_NUM_SEQS {
            submit(&mut engine, &mut live, Duration::ZERO, true);
        }
    }
    loop {
        let at = engine.next_step_at().unwrap_or(end);
        if next_arrival < end && next_arrival <= at {
            submit(&mut engine, &mut live, next_arrival, true);
            next_arrival += Duration::from_secs_f64(arrivals.exp(qps));
            continue;
        }
        if at >= end {
            break;
        }
        let Some(step) = engine.step(at) else { break };
        for e in step.events {
            let Some(&(arrival, interactive)) = live.get(&e.request) else {
                continue;
            };
            match e.kind {
                EventKind::Token { index: 0, .. } if interactive => {
                    out.ttfts.push((e.at - arrival).as_secs_f64())
                }
                EventKind::Finished(finished) => {
                    live.remove(&e.request);
                    if interactive {
                        out.interactive_done += 1;
                        if qps == 0.0 {
                            submit(&mut engine, &mut live, e.at, true);
                        }
                    } else {
                        out.batch_done += 1;
                        out.batch_tokens += finished.usage.total_tokens();
                        submit(&mut engine, &mut live, e.at, false);
                    }
                }
                _ => {}
            }
        }
    }
    out
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// `--name value` options; lists are comma-separated.
fn option(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn list<T: std::str::FromStr>(args: &[String], name: &str, default: &str) -> Vec<T> {
    option(args, name)
        .unwrap_or_else(|| default.to_string())
        .split(',')
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{name}: cannot parse {v:?}"))
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |name: &str, default: f64| list::<f64>(&args, name, &default.to_string())[0];
    let seconds = number("--seconds", 600.0);
    let load = number("--load", 0.37);
    let mut latency = LatencyProfile::h100_llama_8b();
    latency.prefill_per_token = Duration::from_secs_f64(number("--prefill-us", 250.0) / 1e6);
    latency.prefill_overhead = Duration::from_secs_f64(number("--overhead-ms", 30.0) / 1e3);
    latency.batch_slowdown = number("--batch-slowdown", latency.batch_slowdown);
    latency.kv_slowdown = number("--kv-slowdown", latency.kv_slowdown);
    let setup = Setup { seconds, latency };
    let ks: Vec<usize> = list(&args, "--k", "0,1,2,4");
    let budgets: Vec<usize> = list(&args, "--mnbt", "8192");
    let thresholds: Vec<usize> = list(&args, "--threshold", "0");
    let policies: Vec<SchedulingPolicy> = option(&args, "--policy")
        .unwrap_or_else(|| "fcfs,priority".into())
        .split(',')
        .map(|p| SchedulingPolicy::parse(p.trim()).expect("--policy: fcfs or priority"))
        .collect();

    let capacity = run(&setup, DEFAULT_KNOBS, 0.0, 0, 1).interactive_done as f64 / seconds;
    let batch_only = run(&setup, DEFAULT_KNOBS, -1.0, MAX_NUM_SEQS, 1);
    let batch_capacity = batch_only.batch_done as f64 / seconds;
    let qps = load * capacity;
    let allowed = (1.0 - load) * batch_capacity;
    let mut reference = run(&setup, DEFAULT_KNOBS, qps, 0, 1).ttfts;
    let reference_p90 = pct(&mut reference, 0.9);
    println!(
        "prefill {:?} + {:?}/token; capacity {capacity:.2} interactive req/s (8 in flight), \
         {batch_capacity:.2} batch req/s = {:.0} batch tokens/s (8 batch in flight); \
         interactive {qps:.2} req/s ({:.0} %); allowed batch {allowed:.2} req/s = {:.0} tokens/s; \
         reference TTFT p90 {:.0} ms; {seconds} s per row\n",
        setup.latency.prefill_overhead,
        setup.latency.prefill_per_token,
        batch_only.batch_tokens as f64 / seconds,
        load * 100.0,
        allowed * batch_only.batch_tokens as f64 / batch_only.batch_done.max(1) as f64,
        reference_p90 * 1e3,
    );
    println!(
        "| max-num-batched-tokens | long-prefill threshold | policy | batch in flight | TTFT p50 (ms) | TTFT p90 (ms) | p90 rise | batch req/s | batch tokens/s | of allowed |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for &max_num_batched_tokens in &budgets {
        for &long_prefill_token_threshold in &thresholds {
            if long_prefill_token_threshold >= max_num_batched_tokens {
                continue; // the budget caps first: same as no threshold
            }
            for &policy in &policies {
                let knobs = Knobs {
                    max_num_batched_tokens,
                    long_prefill_token_threshold,
                    policy,
                };
                for &k in &ks {
                    let mut o = run(&setup, knobs, qps, k, 1);
                    let (p50, p90) = (pct(&mut o.ttfts, 0.5), pct(&mut o.ttfts, 0.9));
                    let brate = o.batch_done as f64 / seconds;
                    println!(
                        "| {max_num_batched_tokens} | {long_prefill_token_threshold} | {} | {k} | {:.0} | {:.0} | {:+.0} % | {brate:.2} | {:.0} | {:.0} % |",
                        policy.as_str(),
                        p50 * 1e3,
                        p90 * 1e3,
                        100.0 * (p90 / reference_p90 - 1.0),
                        o.batch_tokens as f64 / seconds,
                        100.0 * brate / allowed
                    );
                }
            }
        }
    }
}
