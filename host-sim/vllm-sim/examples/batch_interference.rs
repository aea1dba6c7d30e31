//! What batch work costs interactive TTFT inside one engine, in virtual time (no noise,
//! no gateway): interactive requests arrive (Poisson) at a share of the engine's
//! capacity while `k` batch requests are kept in flight (what an ideal gate holding
//! exactly `k` would do), under `fcfs` and under `priority` (batch at priority 10).
//!
//! ```text
//! cargo run --release -p vllm-sim --example batch_interference [-- SECONDS [LOAD [PREFILL_US]]]
//! ```
//!
//! LOAD: interactive arrivals ÷ the engine's capacity [0.6]; PREFILL_US: the profile's
//! prefill cost per uncached token in µs [250, `h100-llama-8b`'s].
//!
//! The shapes are `scripts/bench batch`'s: interactive = a 256-token system prompt (one
//! of 16) + a 64-token question (one of 16 per group, so mostly prefix-cached), 32 output
//! tokens; batch = a distinct 322-token prompt (never cached), 32 output tokens;
//! `h100-llama-8b`, 8 sequences.

use std::collections::HashMap;
use std::time::Duration;
use vllm_sim::engine::latency::LatencyProfile;
use vllm_sim::engine::{Engine, EngineConfig, EngineRequest, EventKind, SchedulingPolicy};
use vllm_sim::rng::Rng;
use vllm_sim::tokenizer;

const MAX_NUM_SEQS: usize = 8;

struct Setup {
    seconds: f64,
    prefill_per_token: Duration,
}
const OUTPUT: u32 = 32;

struct Outcome {
    interactive_done: usize,
    batch_done: usize,
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
fn run(setup: &Setup, policy: SchedulingPolicy, qps: f64, k: usize, seed: u64) -> Outcome {
    let mut latency = LatencyProfile::h100_llama_8b();
    latency.prefill_per_token = setup.prefill_per_token;
    let mut engine = Engine::new(EngineConfig {
        latency,
        max_num_seqs: MAX_NUM_SEQS,
        scheduling_policy: policy,
        seed,
        ..EngineConfig::default()
    });
    let batch_priority = if policy == SchedulingPolicy::Priority {
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
                EventKind::Finished(_) => {
                    live.remove(&e.request);
                    if interactive {
                        out.interactive_done += 1;
                        if qps == 0.0 {
                            submit(&mut engine, &mut live, e.at, true);
                        }
                    } else {
                        out.batch_done += 1;
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

fn main() {
    let args: Vec<f64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let seconds = args.first().copied().unwrap_or(600.0);
    let load = args.get(1).copied().unwrap_or(0.6);
    let setup = Setup {
        seconds,
        prefill_per_token: Duration::from_secs_f64(args.get(2).copied().unwrap_or(250.0) / 1e6),
    };
    let capacity = run(&setup, SchedulingPolicy::Fcfs, 0.0, 0, 1).interactive_done as f64 / seconds;
    let batch_capacity =
        run(&setup, SchedulingPolicy::Fcfs, -1.0, MAX_NUM_SEQS, 1).batch_done as f64 / seconds;
    let qps = load * capacity;
    let spare = capacity - qps;
    println!(
        "prefill {:?}/token; capacity {capacity:.2} req/s (8 interactive in flight; 8 batch: {batch_capacity:.2}); interactive {qps:.2} req/s ({:.0} %); spare {spare:.2} req/s; {seconds} s per row\n",
        setup.prefill_per_token,
        load * 100.0
    );
    println!("| policy | batch in flight | TTFT p50 (ms) | TTFT p90 (ms) | p90 rise | batch done/s | of spare |");
    println!("|---|---|---|---|---|---|---|");
    let mut reference = 0.0;
    for policy in [SchedulingPolicy::Fcfs, SchedulingPolicy::Priority] {
        for k in [0, 1, 2, 3, 4, 6] {
            let mut o = run(&setup, policy, qps, k, 1);
            let (p50, p90) = (pct(&mut o.ttfts, 0.5), pct(&mut o.ttfts, 0.9));
            if k == 0 && policy == SchedulingPolicy::Fcfs {
                reference = p90;
            }
            let brate = o.batch_done as f64 / seconds;
            println!(
                "| {} | {k} | {:.0} | {:.0} | {:+.0} % | {brate:.2} | {:.0} % |",
                policy.as_str(),
                p50 * 1e3,
                p90 * 1e3,
                100.0 * (p90 / reference - 1.0),
                100.0 * brate / spare
            );
        }
    }
}
