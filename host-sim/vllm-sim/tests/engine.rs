//! Behaviour of the engine in virtual time: prefix caching, the latency
//! model, queueing, the KV cache, LoRA, P/D, determinism.

use std::time::Duration;
use vllm_sim::engine::latency::LatencyProfile;
use vllm_sim::engine::{
    Engine, EngineConfig, EngineRequest, EventKind, FinishReason, KvTransfer, SubmitError,
};
use vllm_sim::sim::{self, Arrival, Trace};
use vllm_sim::tokenizer;

const HORIZON: Duration = Duration::from_secs(3600);

/// The H100 profile without jitter, so comparisons are exact.
fn h100_config() -> EngineConfig {
    let mut latency = LatencyProfile::h100_llama_8b();
    latency.jitter = 0.0;
    EngineConfig {
        latency,
        max_num_seqs: 16,
        max_model_len: 8192,
        num_gpu_blocks: 4096,
        ..EngineConfig::default()
    }
}

fn text(seed: &str, chars: usize) -> String {
    seed.chars().cycle().take(chars).collect()
}

fn at(ms: u64, request: EngineRequest) -> Arrival {
    Arrival {
        at: Duration::from_millis(ms),
        request,
    }
}

fn fixed(prompt: &str, output: u32) -> EngineRequest {
    EngineRequest::fixed(tokenizer::encode(prompt), output)
}

fn run(config: EngineConfig, arrivals: &[Arrival]) -> Vec<Trace> {
    let mut engine = Engine::new(config);
    sim::run(&mut engine, arrivals, HORIZON)
}

#[test]
fn repeated_prefix_lowers_ttft_and_reports_cached_tokens() {
    let system = text("You are a careful assistant. ", 4000); // 1000 tokens
    let traces = run(
        h100_config(),
        &[
            at(0, fixed(&format!("{system}First question?"), 4)),
            at(5_000, fixed(&format!("{system}A different question"), 4)),
        ],
    );
    let first = traces[0].finished.unwrap();
    let second = traces[1].finished.unwrap();
    assert_eq!(first.usage.cached_tokens, 0);
    // All full 16-token blocks of the shared 1000-token system prompt hit.
    assert_eq!(second.usage.cached_tokens, 992);
    let (t1, t2) = (traces[0].ttft().unwrap(), traces[1].ttft().unwrap());
    // 30 ms + 1004 × 250 µs vs 30 ms + 13 × 250 µs.
    assert_eq!(t1, Duration::from_micros(30_000 + 1004 * 250));
    assert_eq!(t2, Duration::from_micros(30_000 + 13 * 250));
}

#[test]
fn ttft_grows_with_uncached_prompt_length() {
    let lengths = [100, 400, 1600, 6400];
    let arrivals: Vec<Arrival> = lengths
        .iter()
        .enumerate()
        .map(|(i, &chars)| {
            at(
                i as u64 * 10_000,
                fixed(&text(&format!("{i}abc"), chars), 2),
            )
        })
        .collect();
    let traces = run(h100_config(), &arrivals);
    let ttfts: Vec<Duration> = traces.iter().map(|t| t.ttft().unwrap()).collect();
    assert!(ttfts.windows(2).all(|w| w[0] < w[1]), "{ttfts:?}");
    assert!(ttfts[3] > Duration::from_millis(400), "{ttfts:?}");
}

#[test]
fn inter_token_latency_grows_with_batch_size() {
    let mean_itl = |batch: usize| {
        let arrivals: Vec<Arrival> = (0..batch)
            .map(|i| at(0, fixed(&format!("request number {i} "), 50)))
            .collect();
        let traces = run(h100_config(), &arrivals);
        let total: Duration = traces.iter().map(|t| t.mean_itl().unwrap()).sum();
        total / batch as u32
    };
    let (one, four, sixteen) = (mean_itl(1), mean_itl(4), mean_itl(16));
    assert!(one >= Duration::from_millis(12), "{one:?}");
    assert!(one < Duration::from_millis(13), "{one:?}");
    assert!(four > one && sixteen > four, "{one:?} {four:?} {sixteen:?}");
    assert!(sixteen >= Duration::from_millis(24), "{sixteen:?}");
}

#[test]
fn overload_queues_requests_then_rejects_with_429() {
    let mut engine = Engine::new(EngineConfig {
        max_num_seqs: 2,
        max_waiting_queue_length: 3,
        ..h100_config()
    });
    let t0 = Duration::ZERO;
    for i in 0..2 {
        engine.submit(fixed(&format!("first {i}"), 10), t0).unwrap();
    }
    let step = engine.step(t0).expect("a step");
    assert_eq!(engine.snapshot().running, 2);
    for i in 0..3 {
        engine.submit(fixed(&format!("later {i}"), 10), t0).unwrap();
    }
    assert_eq!(engine.snapshot().waiting, 3);
    let err = engine.submit(fixed("one too many", 10), t0).unwrap_err();
    assert_eq!(err, SubmitError::QueueFull);
    assert_eq!(err.status(), 429);
    assert_eq!(
        err.to_string(),
        "Failed to enqueue request, waiting requests queue is full"
    );
    // The queue drains as the running requests finish.
    let mut now = step.ends_at;
    for _ in 0..1000 {
        let Some(t) = engine.next_step_at() else {
            break;
        };
        now = now.max(t);
        engine.step(now);
    }
    let s = engine.snapshot();
    assert_eq!((s.running, s.waiting), (0, 0));
    assert_eq!(engine.metrics().request_success.get("length"), Some(&5));
}

#[test]
fn kv_usage_rises_while_running_and_falls_after() {
    let mut engine = Engine::new(EngineConfig {
        num_gpu_blocks: 100,
        ..h100_config()
    });
    assert_eq!(engine.snapshot().kv_usage, 0.0);
    // 160 prompt tokens + 19 computed output tokens = 12 blocks.
    engine
        .submit(fixed(&text("kv usage ", 640), 20), Duration::ZERO)
        .unwrap();
    let mut now = Duration::ZERO;
    let mut peak = 0.0f64;
    for _ in 0..100 {
        let Some(t) = engine.next_step_at() else {
            break;
        };
        now = now.max(t);
        engine.step(now);
        peak = peak.max(engine.snapshot().kv_usage);
    }
    assert!((peak - 0.12).abs() < 1e-9, "peak {peak}");
    let s = engine.snapshot();
    assert_eq!(s.kv_usage, 0.0);
    assert_eq!(s.cached_blocks, 10, "prompt blocks stay cached, unpinned");
}

#[test]
fn exhausted_kv_makes_requests_wait_or_be_preempted_but_all_finish() {
    // 20 blocks of 16 tokens. Each request: 120-token prompt (8 blocks) growing
    // to 180 tokens (12 blocks) as it decodes.
    let config = EngineConfig {
        num_gpu_blocks: 20,
        ..h100_config()
    };
    let arrivals: Vec<Arrival> = (0..3)
        .map(|i| at(0, fixed(&text(&format!("{i} kv pressure "), 480), 60)))
        .collect();
    let mut engine = Engine::new(config);
    let traces = sim::run(&mut engine, &arrivals, HORIZON);
    for t in &traces {
        let f = t.finished.expect("finished");
        assert_eq!(f.usage.completion_tokens, 60);
        assert_eq!(t.token_times.len(), 60);
    }
    assert!(engine.metrics().preemptions >= 1);
    // The third request could not start with the first two.
    assert!(traces[2].finished.unwrap().timings.scheduled.unwrap() > Duration::ZERO);
    // A request that could never fit is refused.
    let err = engine
        .submit(fixed(&text("huge", 4000), 10), Duration::ZERO)
        .unwrap_err();
    assert_eq!(err, SubmitError::KvCapacity);
    assert_eq!(err.status(), 500);
}

#[test]
fn same_seed_gives_same_timings_and_another_seed_differs() {
    let config = |seed| EngineConfig {
        seed,
        latency: LatencyProfile::h100_llama_8b(), // with jitter
        ..h100_config()
    };
    let arrivals: Vec<Arrival> = (0..30)
        .map(|i| {
            at(
                i * 37,
                EngineRequest {
                    prompt: tokenizer::encode(&text(
                        &format!("user {} ", i % 4),
                        200 + 50 * i as usize,
                    )),
                    max_tokens: Some(64),
                    ..Default::default()
                },
            )
        })
        .collect();
    let a = run(config(7), &arrivals);
    let b = run(config(7), &arrivals);
    let c = run(config(8), &arrivals);
    assert_eq!(a, b);
    assert!(a.iter().all(|t| t.finished.is_some()));
    assert_ne!(a, c);
}

#[test]
fn lora_requests_wait_for_a_free_adapter_slot() {
    let mut engine = Engine::new(EngineConfig {
        max_loras: 1,
        ..h100_config()
    });
    engine.load_lora("a", "/adapters/a").unwrap();
    engine.load_lora("b", "/adapters/b").unwrap();
    assert!(engine.load_lora("a", "/x").is_err());
    let lora = |name: &str| EngineRequest {
        lora: Some(name.into()),
        ..fixed("lora prompt", 5)
    };
    let traces = sim::run(
        &mut engine,
        &[at(0, lora("a")), at(0, lora("b")), at(0, lora("a"))],
        HORIZON,
    );
    let finished = |i: usize| traces[i].finished.unwrap().timings;
    // The second "a" request joins the first; "b" waits until both are done.
    assert_eq!(finished(0).scheduled, finished(2).scheduled);
    assert!(finished(1).scheduled.unwrap() >= finished(0).finished);
    assert_eq!(
        engine.submit(lora("c"), Duration::ZERO).unwrap_err(),
        SubmitError::UnknownLora("c".into())
    );
    engine.unload_lora("b").unwrap();
    assert!(engine.unload_lora("b").is_err());
}

#[test]
fn lora_adapters_show_in_the_snapshot_while_running_and_waiting() {
    let mut engine = Engine::new(EngineConfig {
        max_loras: 1,
        ..h100_config()
    });
    engine.load_lora("a", "a").unwrap();
    engine.load_lora("b", "b").unwrap();
    for name in ["a", "b"] {
        let req = EngineRequest {
            lora: Some(name.into()),
            ..fixed("x", 5)
        };
        engine.submit(req, Duration::ZERO).unwrap();
    }
    engine.step(Duration::ZERO).unwrap();
    let s = engine.snapshot();
    assert_eq!(s.running_loras, vec!["a"]);
    assert_eq!(s.waiting_loras, vec!["b"]);
    let text = engine.render_metrics(&Default::default(), 1.0);
    assert!(text.contains(
        "vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"a\",waiting_lora_adapters=\"b\"} 1.0"
    ));
}

#[test]
fn pd_prefill_side_stops_after_prefill_and_decode_side_pays_the_transfer() {
    let prompt = text("disaggregated ", 8000); // 2000 tokens
    let remote = |kv_transfer| EngineRequest {
        kv_transfer,
        ..fixed(&prompt, 10)
    };
    let traces = run(
        h100_config(),
        &[
            at(0, remote(KvTransfer::RemoteDecode)),
            at(10_000, remote(KvTransfer::RemotePrefill)),
            at(20_000, fixed(&text("local ", 8000), 10)),
        ],
    );
    let prefill_side = traces[0].finished.unwrap();
    assert_eq!(prefill_side.reason, FinishReason::RemoteDecode);
    assert_eq!(prefill_side.usage.completion_tokens, 1);
    let decode_side = traces[1].finished.unwrap();
    assert_eq!(decode_side.usage.completion_tokens, 10);
    // Transfer (2 ms + 2000 × 3 µs = 8 ms) then one decode step (12 ms, a
    // little more with 3 % of the KV cache in use), instead of a 530 ms local prefill.
    let ttft = traces[1].ttft().unwrap();
    assert!(
        ttft >= Duration::from_millis(20) && ttft < Duration::from_millis(21),
        "{ttft:?}"
    );
    assert!(traces[2].ttft().unwrap() > Duration::from_millis(500));
}

#[test]
fn chunked_prefill_keeps_running_requests_decoding() {
    let config = EngineConfig {
        max_num_batched_tokens: 512,
        ..h100_config()
    };
    let traces = run(
        config,
        &[
            at(0, fixed("short running request", 100)),
            at(100, fixed(&text("a very long prompt ", 16_000), 2)), // 4000 tokens
        ],
    );
    // The long prompt takes 8 chunked steps; the first request keeps
    // producing a token in each of them instead of stalling for the whole prefill.
    let long_ttft = traces[1].ttft().unwrap();
    let tokens_during = traces[0]
        .token_times
        .iter()
        .filter(|t| {
            **t > Duration::from_millis(100) && **t <= Duration::from_millis(100) + long_ttft
        })
        .count();
    assert!(
        tokens_during >= 7,
        "{tokens_during} tokens during {long_ttft:?}"
    );
}

/// Runs `arrivals` (time in ms, request) to completion, step by step, and returns
/// the prefill tokens of every step in order.
fn prefill_per_step(config: EngineConfig, arrivals: &[(u64, EngineRequest)]) -> Vec<usize> {
    let mut engine = Engine::new(config);
    let mut pending: Vec<_> = arrivals.iter().rev().cloned().collect();
    let mut steps = Vec::new();
    let mut now = Duration::ZERO;
    loop {
        let next_step = engine.next_step_at();
        match pending.last() {
            Some((ms, _)) if next_step.is_none_or(|t| Duration::from_millis(*ms) <= t) => {
                let (ms, request) = pending.pop().unwrap();
                now = now.max(Duration::from_millis(ms));
                engine.submit(request, now).unwrap();
            }
            _ => {
                let Some(t) = next_step else { break };
                now = now.max(t);
                if let Some(step) = engine.step(now) {
                    steps.push(step.work.prefill_tokens);
                }
            }
        }
    }
    steps
}

#[test]
fn long_prefill_token_threshold_chunks_long_prompts_only() {
    let long = || fixed(&text("a long document to summarise ", 4000), 2); // 1000 tokens
    let short = || fixed(&text("a short question ", 160), 2); // 40 tokens
    let capped = EngineConfig {
        long_prefill_token_threshold: 64,
        ..h100_config()
    };
    // Alone, a long prompt is prefilled 64 tokens a step (the last chunk 40), where
    // without the threshold it is one 1000-token step.
    let steps = prefill_per_step(capped.clone(), &[(0, long())]);
    assert_eq!(steps.iter().sum::<usize>(), 1000);
    assert_eq!(steps.iter().filter(|&&n| n > 0).count(), 16, "{steps:?}");
    assert!(steps.iter().all(|&n| n <= 64), "{steps:?}");
    assert_eq!(prefill_per_step(h100_config(), &[(0, long())])[0], 1000);
    // A prompt under the threshold still gets its whole prefill in one step.
    assert_eq!(prefill_per_step(capped.clone(), &[(0, short())])[0], 40);
    // The step's budget still applies on top: 48 tokens a step with a budget of 48.
    let tight = EngineConfig {
        max_num_batched_tokens: 48,
        ..capped.clone()
    };
    let steps = prefill_per_step(tight, &[(0, long())]);
    assert!(steps[..20].iter().all(|&n| n == 48), "{steps:?}");

    // A short request arriving while the long one prefills joins the next step
    // with its whole prompt (64 + 40 tokens), instead of waiting behind one
    // 280 ms step, and gets its first token in two short steps.
    let traces = run(capped, &[at(0, long()), at(10, short())]);
    let short_ttft = traces[1].ttft().unwrap();
    assert!(short_ttft < Duration::from_millis(110), "{short_ttft:?}");
    let uncapped = run(h100_config(), &[at(0, long()), at(10, short())]);
    assert!(uncapped[1].ttft().unwrap() > Duration::from_millis(300));
    // The long prompt pays for its chunks: 16 steps of 30 ms overhead instead of one.
    assert!(traces[0].ttft().unwrap() > uncapped[0].ttft().unwrap());
}

#[test]
fn zero_profile_finishes_in_zero_virtual_time() {
    let config = EngineConfig {
        latency: LatencyProfile::zero(),
        ..h100_config()
    };
    let traces = run(config, &[at(5, fixed("instant", 20))]);
    assert_eq!(traces[0].token_times.len(), 20);
    assert!(traces[0]
        .token_times
        .iter()
        .all(|t| *t == Duration::from_millis(5)));
}

#[test]
fn step_events_report_tokens_in_order_then_finish() {
    let mut engine = Engine::new(h100_config());
    let id = engine.submit(fixed("ordered", 3), Duration::ZERO).unwrap();
    let mut kinds = Vec::new();
    let mut now = Duration::ZERO;
    for _ in 0..10 {
        let Some(t) = engine.next_step_at() else {
            break;
        };
        now = now.max(t);
        if let Some(step) = engine.step(now) {
            assert!(step.ends_at >= step.started);
            kinds.extend(step.events.into_iter().map(|e| {
                assert_eq!(e.request, id);
                e.kind
            }));
        }
    }
    assert_eq!(kinds.len(), 4);
    for (i, kind) in kinds[..3].iter().enumerate() {
        assert!(matches!(kind, EventKind::Token { index, .. } if *index == i));
    }
    assert!(matches!(kinds[3], EventKind::Finished(f) if f.reason == FinishReason::Length));
}

#[test]
fn pooling_requests_finish_with_their_prefill_without_a_token() {
    let mut engine = Engine::new(h100_config());
    let prompt = tokenizer::encode(&text("Embed this passage. ", 4000)); // 1000 tokens
    let mut run_one = |at: Duration| {
        let id = engine.submit_pooling(prompt.clone(), None, at).unwrap();
        loop {
            let t = engine.next_step_at().expect("work to do");
            let step = engine.step(t).expect("a step");
            // The only request's only event (none while its prefill goes on).
            if let Some(event) = step.events.into_iter().next() {
                let EventKind::Finished(f) = event.kind else {
                    panic!("a pooling request generated a token");
                };
                assert_eq!(event.request, id);
                return (event.at - at, f);
            }
        }
    };
    let (latency, first) = run_one(Duration::ZERO);
    assert_eq!(first.reason, FinishReason::Stop);
    assert_eq!(first.usage.prompt_tokens, 1000);
    assert_eq!(first.usage.completion_tokens, 0);
    assert_eq!(latency, Duration::from_micros(30_000 + 1000 * 250));
    // The same prompt again: its full blocks are cached, only the rest is prefilled.
    let (latency, second) = run_one(Duration::from_secs(10));
    assert_eq!(second.usage.cached_tokens, 992);
    assert_eq!(latency, Duration::from_micros(30_000 + 8 * 250));

    let m = engine.metrics();
    assert_eq!(m.request_success.get("stop"), Some(&2));
    assert_eq!(m.generation_tokens, 0);
    assert_eq!(m.prompt_tokens, 2000);
    assert_eq!(m.ttft.count(), 2);

    // A pooling prompt may fill the context window; a generation needs one more token.
    let window = vec![7u32; 8192];
    let now = Duration::from_secs(20);
    assert!(engine.submit_pooling(window.clone(), None, now).is_ok());
    assert!(matches!(
        engine.submit(EngineRequest::fixed(window.clone(), 1), now),
        Err(SubmitError::ContextTooLong { .. })
    ));
    assert!(engine.submit_pooling(vec![7; 8193], None, now).is_err());
}
