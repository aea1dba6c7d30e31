//! The framework end to end in the core: weighted sums, profiles, handlers, the prefix index.

use super::handlers::pd::ROLE_LABEL;
use super::testing::candidates;
use super::*;
use wasm_bindgen_test::wasm_bindgen_test;

fn scheduler(json: &str) -> Scheduler {
    crate::runtime::load(json).unwrap().scheduler
}

fn pick(
    s: &Scheduler,
    c: &[Candidate],
    index: &PrefixIndex,
    prompt: &str,
    seed: u64,
) -> Result<Decision, ScheduleError> {
    let r = Request {
        model: "m",
        prompt,
        ..Request::default()
    };
    s.schedule(&r, c, index, &mut Rng::new(seed), &mut Probe::new(None))
}

#[wasm_bindgen_test(unsupported = test)]
fn scores_are_weighted_sums_as_in_the_reference_example() {
    // Scorer A (weight 2) returns 0.8 and scorer B (weight 1) returns 0.5: 2.1.
    let s = scheduler(
        r#"{"plugins":[{"type":"kv-cache-utilization-scorer"},{"type":"queue-scorer"}],
        "schedulingProfiles":[{"name":"p","plugins":[{"pluginRef":"kv-cache-utilization-scorer","weight":2},{"pluginRef":"queue-scorer","weight":1}]}]}"#,
    );
    let c = candidates(&[(1, 0, 0.2), (3, 0, 0.0), (2, 0, 1.0)]);
    let r = Request::default();
    let cx = Cycle {
        request: &r,
        candidates: &c,
        prefix: &[],
        prior: &[],
        rendezvous_key: None,
        estimates: &[],
    };
    let totals = s.profiles[0].scores(&cx, &[0, 1, 2], &mut Probe::new(None));
    // kv: 0.8, 1.0, 0.0; queue: (3-1)/2 = 1, 0, 0.5
    let want = [0.8 * 2.0 + 1.0, 2.0, 0.5];
    for (a, b) in totals.iter().zip(want) {
        assert!((a - b).abs() < 1e-12, "{totals:?}");
    }
    // ... and the max-score picker takes the best: endpoint 0 (2.6).
    assert_eq!(
        pick(&s, &c, &PrefixIndex::new(), "", 1).unwrap().targets,
        vec![0]
    );
}

#[wasm_bindgen_test(unsupported = test)]
fn the_default_profile_follows_the_prefix_cache_when_load_is_equal() {
    let s = scheduler("{}");
    let c = candidates(&[(0, 0, 0.1); 4]);
    let prompt = "You are a helpful assistant. ".repeat(20);
    let mut index = PrefixIndex::new();
    let first = pick(&s, &c, &index, &prompt, 7).unwrap();
    assert!(!first.hashes.is_empty());
    let chosen = first.primary().unwrap();
    index.insert(&c[chosen].address, &first.hashes, 1000);
    // Whatever the tie-breaking seed, the same prompt goes where its prefix is cached.
    for seed in 0..20 {
        let d = pick(&s, &c, &index, &prompt, seed).unwrap();
        assert_eq!(d.primary(), Some(chosen));
        assert_eq!(d.prefix[chosen].matched, d.prefix[chosen].total);
    }
    // A much shorter queue elsewhere outweighs the cache (queue 2 + kv 2 vs prefix 3).
    let mut busy = c.clone();
    busy[chosen].metrics.waiting = 10;
    busy[chosen].metrics.kv_usage = 0.9;
    let d = pick(&s, &busy, &index, &prompt, 3).unwrap();
    assert_ne!(d.primary(), Some(chosen));
}

#[wasm_bindgen_test(unsupported = test)]
fn the_default_profile_moves_a_hot_prefix_off_a_queueing_server() {
    let s = scheduler("{}");
    let c = candidates(&[(0, 4, 0.1); 4]);
    let prompt = "You are a helpful assistant. ".repeat(20);
    let mut index = PrefixIndex::new();
    let first = pick(&s, &c, &index, &prompt, 7).unwrap();
    let hot = first.primary().unwrap();
    index.insert(&c[hot].address, &first.hashes, 1000);
    // Shared-prefix requests use little KV, so the holder's KV stays low while its queue
    // grows. By the scores alone the full match (3) beats the shortest queue (2) at any
    // queue length; the detector in the default profile leaves the holder out from 5
    // waiting on (`queueDepthThreshold`), while the others are below it.
    let mut queued = c.clone();
    queued[hot].metrics.waiting = 4;
    assert_eq!(
        pick(&s, &queued, &index, &prompt, 1).unwrap().primary(),
        Some(hot)
    );
    queued[hot].metrics.waiting = 50;
    for seed in 0..10 {
        let d = pick(&s, &queued, &index, &prompt, seed).unwrap();
        assert_ne!(d.primary(), Some(hot), "seed {seed}");
    }
    // When every server queues, none is left out (the detector fails open): the prefix wins.
    let all_busy: Vec<Candidate> = queued
        .iter()
        .cloned()
        .map(|mut e| {
            e.metrics.waiting = e.metrics.waiting.max(20);
            e
        })
        .collect();
    assert_eq!(
        pick(&s, &all_busy, &index, &prompt, 1).unwrap().primary(),
        Some(hot)
    );
}

#[wasm_bindgen_test(unsupported = test)]
fn gateways_that_never_saw_a_prompt_agree_on_its_server_and_load_bounds_it() {
    // Two gateways, empty indexes (nothing learned, nothing shared), the same pool.
    let s = scheduler("{}");
    let two = scheduler(
        r#"{"plugins":[{"type":"approx-prefix-cache-producer","parameters":{"rendezvousPriorChoices":2}},
        {"type":"utilization-detector"},{"type":"queue-scorer"},{"type":"kv-cache-utilization-scorer"},{"type":"prefix-cache-scorer"}],
        "schedulingProfiles":[{"name":"p","plugins":[{"pluginRef":"utilization-detector"},{"pluginRef":"queue-scorer","weight":2},
        {"pluginRef":"kv-cache-utilization-scorer","weight":2},{"pluginRef":"prefix-cache-scorer","weight":3}]}]}"#,
    );
    let c = candidates(&[(0, 0, 0.1); 8]);
    let empty = PrefixIndex::new();
    for g in 0..12 {
        let system = format!("Tenant {g} system prompt: be brief and cite sources. ").repeat(12);
        let picks: Vec<Option<usize>> = (0..6)
            .map(|q| {
                let prompt = format!("{system} question {q}");
                pick(&s, &c, &empty, &prompt, 100 * g + q)
                    .unwrap()
                    .primary()
            })
            .collect();
        assert!(picks.iter().all(|p| *p == picks[0]), "group {g}: {picks:?}");
        // The owner is saturated (the detector leaves it out): another server. With two
        // choices, the second owner, which every gateway also agrees on.
        let owner = picks[0].unwrap();
        let mut busy = c.clone();
        busy[owner].metrics.waiting = 9;
        for q in 0..4 {
            let prompt = format!("{system} another question {q}");
            assert_ne!(
                pick(&s, &busy, &empty, &prompt, q).unwrap().primary(),
                Some(owner)
            );
        }
        let first = format!("{system} question 0");
        assert_eq!(
            pick(&two, &c, &empty, &first, 1).unwrap().primary(),
            Some(owner)
        );
        let second: Vec<Option<usize>> = (0..4)
            .map(|q| {
                let prompt = format!("{system} another question {q}");
                pick(&two, &busy, &empty, &prompt, q).unwrap().primary()
            })
            .collect();
        assert!(
            second.iter().all(|p| *p == second[0] && *p != Some(owner)),
            "{second:?}"
        );
    }
    // Without the prior a cold prompt goes by load, and equal loads tie at random.
    let off = scheduler(
        r#"{"plugins":[{"type":"approx-prefix-cache-producer","parameters":{"rendezvousPrior":false}},{"type":"queue-scorer"},{"type":"prefix-cache-scorer"}]}"#,
    );
    let prompt = "Tenant 0 system prompt: be brief and cite sources. ".repeat(12);
    let spread: std::collections::BTreeSet<Option<usize>> = (0..20)
        .map(|seed| pick(&off, &c, &empty, &prompt, seed).unwrap().primary())
        .collect();
    assert!(spread.len() > 2, "{spread:?}");
}

#[wasm_bindgen_test(unsupported = test)]
fn filters_that_remove_everything_fail_the_profile() {
    let s = scheduler(
        r#"{"plugins":[{"type":"label-selector-filter","parameters":{"matchLabels":{"zone":"x"}}},{"type":"queue-scorer"}]}"#,
    );
    let c = candidates(&[(0, 0, 0.0); 2]);
    assert_eq!(
        pick(&s, &c, &PrefixIndex::new(), "", 0),
        Err(ScheduleError::NoEndpoints {
            profile: "default".into()
        })
    );
    assert_eq!(
        pick(&s, &[], &PrefixIndex::new(), "", 0),
        Err(ScheduleError::NoCandidates)
    );
}

#[wasm_bindgen_test(unsupported = test)]
fn pickers_return_fallbacks_in_score_order() {
    let s = scheduler(
        r#"{"plugins":[{"type":"queue-scorer"},{"type":"max-score-picker","parameters":{"maxNumOfEndpoints":3}}]}"#,
    );
    let c = candidates(&[(5, 0, 0.0), (1, 0, 0.0), (3, 0, 0.0), (9, 0, 0.0)]);
    assert_eq!(
        pick(&s, &c, &PrefixIndex::new(), "", 0).unwrap().targets,
        vec![1, 2, 0]
    );
}

#[wasm_bindgen_test(unsupported = test)]
fn pd_routes_to_decode_and_names_a_prefill_endpoint_for_long_uncached_prompts() {
    let s = scheduler(
        r#"{"plugins":[
          {"type":"prefill-endpoints-filter"},{"type":"decode-endpoints-filter"},
          {"type":"prefix-cache-scorer"},{"type":"queue-scorer"},
          {"type":"prefix-based-pd-decider","parameters":{"nonCachedTokens":100}},
          {"type":"disagg-profile-handler","parameters":{"deciders":{"prefill":"prefix-based-pd-decider"}}}],
         "schedulingProfiles":[
          {"name":"prefill","plugins":[{"pluginRef":"prefill-endpoints-filter"},{"pluginRef":"queue-scorer"}]},
          {"name":"decode","plugins":[{"pluginRef":"decode-endpoints-filter"},{"pluginRef":"prefix-cache-scorer","weight":3},{"pluginRef":"queue-scorer"}]}]}"#,
    );
    let mut c = candidates(&[(0, 0, 0.0); 3]);
    c[0].labels.insert(ROLE_LABEL.into(), "prefill".into());
    c[1].labels.insert(ROLE_LABEL.into(), "decode".into());
    c[2].labels.insert(ROLE_LABEL.into(), "decode".into());
    let mut index = PrefixIndex::new();
    // 800 chars = 200 tokens, nothing cached: 200 >= 100, disaggregate.
    let long = "x".repeat(800);
    let d = pick(&s, &c, &index, &long, 1).unwrap();
    assert_eq!(d.profile, "decode");
    assert!(matches!(d.primary(), Some(1) | Some(2)));
    assert_eq!(d.prefill, Some(0));
    // Once the decode endpoint holds the prompt, nothing is left to prefill remotely.
    let decode = d.primary().unwrap();
    index.insert(&c[decode].address, &d.hashes, 1000);
    let d = pick(&s, &c, &index, &long, 1).unwrap();
    assert_eq!(d.primary(), Some(decode));
    assert_eq!((d.prefill, d.disaggregated), (None, false));
    // A short prompt (40 tokens) stays decode-only.
    let d = pick(&s, &c, &PrefixIndex::new(), &"y".repeat(160), 1).unwrap();
    assert_eq!(d.prefill, None);
}

#[wasm_bindgen_test(unsupported = test)]
fn autotune_takes_block_size_and_capacity_from_the_engine() {
    let s = scheduler("{}");
    let mut c = candidates(&[(0, 0, 0.0); 2]);
    assert_eq!(s.block_size_tokens(&c), 16);
    assert_eq!(s.lru_capacity(&c[0]), 31_250);
    c[0].metrics.block_size = Some(32);
    c[0].metrics.num_blocks = Some(5000);
    assert_eq!(s.block_size_tokens(&c), 32);
    assert_eq!(s.lru_capacity(&c[0]), 5000);
    // 32-token blocks = 128 characters.
    let d = pick(&s, &c, &PrefixIndex::new(), &"z".repeat(256), 0).unwrap();
    assert_eq!((d.hashes.len(), d.block_size_tokens), (2, 32));
}

#[wasm_bindgen_test(unsupported = test)]
fn token_estimates_follow_the_reference() {
    let r = Request {
        body_bytes: 400,
        ..Request::default()
    };
    // input = 400/4 = 100, output = 150.
    assert_eq!((r.input_tokens(), r.token_estimate()), (100, 250));
    let r = Request {
        prompt: "abcdefgh",
        ..Request::default()
    };
    assert_eq!(r.input_tokens(), 2);
}
