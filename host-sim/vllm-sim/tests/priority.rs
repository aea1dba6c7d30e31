//! `--scheduling-policy`: vLLM's `fcfs` and `priority` in virtual time. Under
//! `priority` the waiting queue is ordered by the body's `priority` (lower first),
//! then arrival; a running request is preempted only for a KV block, and then the
//! least important one goes; `fcfs` refuses a priority other than 0.

use std::time::Duration;
use vllm_sim::engine::latency::LatencyProfile;
use vllm_sim::engine::{Engine, EngineConfig, EngineRequest, SchedulingPolicy, SubmitError};
use vllm_sim::sim::{self, Arrival, Trace};
use vllm_sim::tokenizer;

const HORIZON: Duration = Duration::from_secs(3600);

fn config(policy: SchedulingPolicy, max_num_seqs: usize) -> EngineConfig {
    let mut latency = LatencyProfile::h100_llama_8b();
    latency.jitter = 0.0;
    EngineConfig {
        latency,
        max_num_seqs,
        scheduling_policy: policy,
        ..EngineConfig::default()
    }
}

fn request(prompt: &str, output: u32, priority: i64) -> EngineRequest {
    EngineRequest {
        priority,
        ..EngineRequest::fixed(tokenizer::encode(prompt), output)
    }
}

fn at(ms: u64, request: EngineRequest) -> Arrival {
    Arrival {
        at: Duration::from_millis(ms),
        request,
    }
}

fn scheduled(t: &Trace) -> Duration {
    t.finished.unwrap().timings.scheduled.unwrap()
}

#[test]
fn fcfs_refuses_a_priority_other_than_zero_with_vllms_400() {
    let mut engine = Engine::new(config(SchedulingPolicy::Fcfs, 4));
    let err = engine
        .submit(request("batch work", 4, -10), Duration::ZERO)
        .unwrap_err();
    assert_eq!(err, SubmitError::PriorityNotEnabled(-10));
    assert_eq!(err.status(), 400);
    assert_eq!(
        err.to_string(),
        "Got priority -10 but Priority scheduling is not enabled."
    );
    assert!(engine
        .submit(request("interactive", 4, 0), Duration::ZERO)
        .is_ok());
    let mut engine = Engine::new(config(SchedulingPolicy::Priority, 4));
    assert!(engine
        .submit(request("batch work", 4, -10), Duration::ZERO)
        .is_ok());
}

#[test]
fn priority_admits_the_lowest_value_first_then_the_earliest() {
    // One slot, held by a request; then, while it runs, a batch request
    // (priority 10), an interactive one (0) and an urgent one (-5) arrive in that order.
    let arrivals = |b: i64, i: i64, u: i64| {
        vec![
            at(0, request("occupant", 20, 0)),
            at(1, request("batch", 4, b)),
            at(2, request("interactive", 4, i)),
            at(3, request("urgent", 4, u)),
            at(4, request("interactive two", 4, i)),
        ]
    };
    let mut engine = Engine::new(config(SchedulingPolicy::Priority, 1));
    let t = sim::run(&mut engine, &arrivals(10, 0, -5), HORIZON);
    let order = |t: &[Trace]| {
        let mut idx: Vec<usize> = (1..t.len()).collect();
        idx.sort_by_key(|&k| scheduled(&t[k]));
        idx
    };
    // urgent, then the two interactive ones by arrival, then batch.
    assert_eq!(order(&t), vec![3, 2, 4, 1]);
    // The same arrivals at one priority: arrival order, under either policy.
    let mut engine = Engine::new(config(SchedulingPolicy::Priority, 1));
    assert_eq!(
        order(&sim::run(&mut engine, &arrivals(0, 0, 0), HORIZON)),
        vec![1, 2, 3, 4]
    );
    let mut engine = Engine::new(config(SchedulingPolicy::Fcfs, 1));
    assert_eq!(
        order(&sim::run(&mut engine, &arrivals(0, 0, 0), HORIZON)),
        vec![1, 2, 3, 4]
    );
}

#[test]
fn a_full_batch_is_not_preempted_for_a_more_important_waiting_request() {
    // As vLLM v1: priority orders the queue; it does not evict a running request.
    let mut engine = Engine::new(config(SchedulingPolicy::Priority, 1));
    let t = sim::run(
        &mut engine,
        &[
            at(0, request("long batch request", 50, 10)),
            at(5, request("interactive", 4, -10)),
        ],
        HORIZON,
    );
    let batch = t[0].finished.unwrap();
    assert_eq!(batch.usage.completion_tokens, 50);
    assert!(scheduled(&t[1]) >= batch.timings.finished);
    assert_eq!(engine.metrics().preemptions, 0);
}

#[test]
fn kv_pressure_preempts_the_least_important_request_under_priority() {
    // 20 blocks of 16 tokens; each request: a 120-token prompt (8 blocks) growing to
    // 180 tokens (12 blocks): two cannot finish together. The batch request (priority
    // 10) is admitted first, the interactive one (0) a step later.
    let text = |seed: &str| -> String { seed.chars().cycle().take(480).collect() };
    let arrivals = |batch: i64| {
        [
            at(0, request(&text("batch kv pressure "), 60, batch)),
            at(1, request(&text("interactive kv pressure "), 60, 0)),
        ]
    };
    let finish = |t: &Trace| t.finished.unwrap().timings.finished;
    let run = |policy, batch| {
        let mut engine = Engine::new(EngineConfig {
            num_gpu_blocks: 20,
            ..config(policy, 4)
        });
        let t = sim::run(&mut engine, &arrivals(batch), HORIZON);
        for x in &t {
            assert_eq!(x.finished.unwrap().usage.completion_tokens, 60);
            assert_eq!(x.token_times.len(), 60);
        }
        assert!(engine.metrics().preemptions >= 1);
        t
    };
    // fcfs: the most recently admitted (interactive) is preempted and finishes last.
    let t = run(SchedulingPolicy::Fcfs, 0);
    assert!(finish(&t[1]) > finish(&t[0]));
    // priority: the batch request is preempted (it recomputes later), the interactive
    // one runs through.
    let t = run(SchedulingPolicy::Priority, 10);
    assert!(finish(&t[1]) < finish(&t[0]));
    assert_eq!(t[1].finished.unwrap().usage.cached_tokens, 0);
}
