//! SLO-aware routing with the latency predictor that learns inside the filter: the real
//! filter in a simulated 4-worker Envoy in front of calibrated `vllm-sim` engines
//! (`h100-llama-8b`), one of them twice as slow as the others (a mixed pool), in
//! virtual time. Deterministic per seed; assertion messages carry the figures.

mod common;

use common::filter::{latency_model, with_scrape_cluster};
use common::*;
use epp_filter::latency::Target;
use host_sim::world::clock::Rng;
use host_sim::{
    ms, Condition, Control, Fault, FaultAction, Nanos, Outcome, RequestSpec, Sim, SimConfig,
    VllmConfig, SEC,
};
use serde_json::json;

const TTFT: &str = "x-llm-d-slo-ttft-ms";
const TPOT: &str = "x-llm-d-slo-tpot-ms";

/// The SLO profile (the reference chart's, without the prefix filters), streaming mode,
/// with objectives `batch` (sheddable) and `critical`.
fn slo_config(eps: &[String]) -> String {
    slo_config_with(eps, json!({"streamingMode": true}), json!({}))
}

/// [`slo_config`] with the producer's and the scorer's parameters.
fn slo_config_with(
    eps: &[String],
    producer: serde_json::Value,
    scorer: serde_json::Value,
) -> String {
    json!({
        "pool": {
            "endpoints": eps,
            "objectives": [{"name": "batch", "priority": -1}, {"name": "critical", "priority": 10}]
        },
        "plugins": [
            {"type": "predicted-latency-producer", "parameters": producer},
            {"type": "slo-headroom-tier-filter"},
            {"type": "latency-scorer", "parameters": scorer},
            {"type": "latency-slo-admitter"},
            {"type": "weighted-random-picker"}
        ],
        "schedulingProfiles": [{"name": "slo", "plugins": [
            {"pluginRef": "slo-headroom-tier-filter"},
            {"pluginRef": "latency-scorer"},
            {"pluginRef": "weighted-random-picker"}
        ]}]
    })
    .to_string()
}

/// 4 equal engines (h100-llama-8b, 16 sequences, KV cache of 1,024 blocks) behind 4
/// workers, the ledger invariant checked.
fn pool_of_four(config: String, seed: u64) -> (Sim, Vec<String>) {
    let eps = endpoints(4);
    let cfg = with_scrape_cluster(SimConfig::new(&config).workers(4).seed(seed));
    let mut sim = Sim::new(cfg).expect("sim starts");
    sim.add_invariant(within_ledger());
    for (i, e) in eps.iter().enumerate() {
        let engine = VllmConfig::new(e)
            .profile("h100-llama-8b")
            .max_num_seqs(16)
            .kv_blocks(1024)
            .seed(seed + i as u64);
        sim.add_endpoint(e, Box::new(engine.build()));
    }
    (sim, eps)
}

/// [`pool_of_four`] with the first engine 2× slower than the others from the start.
fn mixed_pool(config: String, seed: u64) -> (Sim, Vec<String>) {
    let (mut sim, eps) = pool_of_four(config, seed);
    sim.at(
        0,
        Control::SetCondition(eps[0].clone(), Condition::Slowed(2.0)),
    );
    (sim, eps)
}

/// `count` streamed completions, Poisson at `rate` per second from `start`, prompts of
/// 20–400 words, 16–96 output tokens, each with `headers`.
fn traffic(
    rng: &mut Rng,
    start: Nanos,
    rate: f64,
    count: usize,
    headers: &[(&str, &str)],
) -> Vec<RequestSpec> {
    let mut t = start as f64;
    (0..count)
        .map(|i| {
            t += rng.exponential(SEC as f64 / rate);
            let words = 20 + rng.below(380) as usize;
            let prompt: String = (0..words).map(|w| format!("q{i}w{w} ")).collect();
            let tokens = 16 + rng.below(81) as u32;
            let mut spec =
                RequestSpec::completion(MODEL, prompt.trim_end(), tokens, true).at(t as Nanos);
            for (k, v) in headers {
                spec = spec.header(k, v);
            }
            spec
        })
        .collect()
}

/// Observed TTFT and mean inter-chunk time (ms) of a streamed outcome.
fn observed(o: &Outcome) -> Option<(f64, f64)> {
    let d = o.dispatched_at?;
    let first = *o.data_at.first()?;
    let last = *o.data_at.last()?;
    let n = o.data_at.len();
    let ttft = (first - d) as f64 / 1e6;
    let tpot = if n > 1 {
        (last - first) as f64 / 1e6 / (n - 1) as f64
    } else {
        0.0
    };
    Some((ttft, tpot))
}

/// The default scorers with the predictor learning alongside (no SLO plugin).
fn learning_config(eps: &[String]) -> String {
    json!({
        "pool": {"endpoints": eps},
        "plugins": [
            {"type": "predicted-latency-producer", "parameters": {"streamingMode": true}},
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "max-score-picker"}
        ]
    })
    .to_string()
}

/// The streamed outcomes of `ids` that reached `endpoint`, and all of them.
fn on(sim: &Sim, ids: &[usize], endpoint: &str) -> (usize, usize) {
    let routed: Vec<&Outcome> = ids.iter().map(|&i| sim.outcome(i)).collect();
    let n = routed
        .iter()
        .filter(|o| o.endpoint.as_deref() == Some(endpoint))
        .count();
    (n, routed.len())
}

/// Share of `ids` whose observed TTFT and TPOT met `(ttft, tpot)` ms.
fn attainment(sim: &Sim, ids: &[usize], ttft: f64, tpot: f64) -> f64 {
    let met = ids
        .iter()
        .filter_map(|&i| observed(sim.outcome(i)))
        .filter(|(a, b)| *a <= ttft && *b <= tpot)
        .count();
    met as f64 / ids.len() as f64
}

/// The predictor's error counters: (sum of |predicted − observed| / observed in ‰,
/// predictions scored), TTFT then TPOT.
fn error_counters(sim: &Sim) -> [(f64, f64); 2] {
    ["ttft", "tpot"].map(|p| {
        let v = |name: &str| metric(sim, &format!("{name}{{prediction=\"{p}\"}}"));
        (
            v("inference_extension_latency_predictor_absolute_percentage_error_total"),
            v("inference_extension_latency_predictor_scored_total"),
        )
    })
}

/// Every worker's ground truth trains one model, published in shared data: it learns
/// that the slowed endpoint is about twice as slow (per-endpoint terms: the pool need
/// not be homogeneous), its predictions at pick time stay within the stated error once
/// warm (TTFT's better than cold), the latency metrics are exported, and the gateway's
/// prefill and decode counts (the features it knows exactly) return to zero.
#[test]
fn the_predictor_learns_a_mixed_pool_from_the_streams_it_sees() {
    let (mut sim, eps) = mixed_pool(learning_config(&endpoints(4)), 3);
    let mut rng = Rng::new(3, 1);
    let ids = sim.add_requests(traffic(&mut rng, ms(100), 12.0, 1200, &[]));
    // The first 20 s (the model becomes ready after 50 samples), then the rest.
    sim.run_until(20 * SEC).unwrap();
    let cold = error_counters(&sim);
    sim.run_until_answered(200 * SEC).unwrap();
    let warm = error_counters(&sim);
    let window = |i: usize| {
        let (e, n) = (warm[i].0 - cold[i].0, warm[i].1 - cold[i].1);
        (e / n / 1000.0, n)
    };
    let first = |i: usize| cold[i].0 / cold[i].1 / 1000.0;
    eprintln!(
        "MAPE in the first 20 s: ttft {:.3} tpot {:.3}; after: ttft {:.3?} tpot {:.3?}",
        first(0),
        first(1),
        window(0),
        window(1)
    );
    let ledger: epp_filter::inflight::Ledger = sim
        .shared_data(epp_filter::inflight::LEDGER_KEY)
        .map(|b| epp_filter::inflight::Ledger::decode(&b).expect("ledger decodes"))
        .unwrap_or_default();
    assert!(
        ledger.loads().values().all(|l| *l == Default::default()),
        "{ledger:?}"
    );
    let m = latency_model(&sim);
    let (ttft_n, tpot_n) = (m.samples(Target::Ttft), m.samples(Target::Tpot));
    let (ttft_err, tpot_err) = (m.error(Target::Ttft), m.error(Target::Tpot));
    let factor = |addr: &str| {
        let e = m
            .endpoints
            .iter()
            .find(|e| e.address == addr)
            .expect("endpoint learnt");
        (e.ttft_log.exp(), e.tpot_log.exp())
    };
    let slow = factor(&eps[0]);
    let fast: Vec<(f64, f64)> = eps[1..].iter().map(|e| factor(e)).collect();
    eprintln!(
        "samples ttft {ttft_n} tpot {tpot_n}; running MAPE ttft {ttft_err:.3} tpot {tpot_err:.3}; \
         speed factors slow {slow:.2?} fast {fast:.2?}"
    );
    let ok = ids
        .iter()
        .filter(|&&i| sim.outcome(i).status == Some(200))
        .count();
    assert_eq!(ok, 1200);
    assert!(ttft_n >= 1190 && tpot_n >= 1100, "{ttft_n} {tpot_n}");
    for f in &fast {
        assert!(
            slow.0 > 1.5 * f.0 && slow.1 > 1.5 * f.1,
            "slow {slow:?} fast {f:?}"
        );
    }
    // The error of the ~950 predictions scored after the first 20 s (the error counters),
    // not the model's running error (an EWMA over about the last 50, which swings with
    // the few streams ending last: its TPOT value is 0.37-1.12 over seeds 1-30 at this
    // same load). Per-request TPOT in a continuous batch depends on what arrives after the
    // pick, so its level depends on which server each tie drew; over seeds 1-30 the
    // window's TTFT error was 0.21-0.25 and its TPOT error 0.41-0.54 (one run 0.71),
    // breaking score ties by a whole shuffle or by one draw (the same distribution). The
    // speed factors above are what shows the model learnt the mixed pool.
    let (ttft_after, _) = window(0);
    let (tpot_after, _) = window(1);
    assert!(ttft_after < 0.33, "TTFT MAPE after 20 s {ttft_after}");
    assert!(tpot_after < 0.6, "TPOT MAPE after 20 s {tpot_after}");
    for i in 0..2 {
        let (_, n) = window(i);
        assert!(n >= 900.0, "{n} predictions scored after 20 s");
    }
    // TTFT gets better once warm (0.28-0.68 in the first 20 s over seeds 1-30, at most
    // 0.25 after); TPOT's first 20 s are as noisy as the rest (0.39-0.86).
    assert!(
        ttft_after < first(0),
        "TTFT no better once warm: {} then {ttft_after}",
        first(0)
    );
    let count = |family: &str| {
        family_sum(
            &sim,
            &format!("{family}_count{{target_model_name=\"{MODEL}\",model_name=\"{MODEL}\"}}"),
        )
    };
    assert_eq!(count("inference_objective_request_ttft_seconds"), 1200.0);
    assert!(count("inference_objective_request_predicted_ttft_seconds") >= 1100.0);
    assert!(count("inference_objective_request_tpot_seconds") >= 1100.0);
    // The prediction is timed on the decisions whose plugins are timed (1 in 16).
    for t in ["ttft", "tpot"] {
        let n = count(&format!(
            "inference_objective_request_{t}_prediction_duration_seconds"
        ));
        assert!(
            (1200.0 / 16.0 - 8.0..=1200.0 / 16.0 + 8.0).contains(&n),
            "{t}: {n}"
        );
    }
    // The `_gauge` variants: the last request's latencies (Envoy: microseconds).
    for gauge in ["ttft", "predicted_ttft", "tpot", "predicted_tpot"] {
        let v = family_sum(
            &sim,
            &format!("inference_objective_request_{gauge}_seconds_gauge{{"),
        );
        assert!((1_000.0..10_000_000.0).contains(&v), "{gauge} gauge {v}");
    }
    assert_eq!(
        metric(
            &sim,
            "inference_extension_latency_predictor_samples{prediction=\"ttft\"}"
        ),
        ttft_n as f64
    );
    let permille = metric(
        &sim,
        "inference_extension_latency_predictor_error{prediction=\"tpot\"}",
    );
    assert_eq!(permille, (tpot_err * 1000.0).round());
}

/// What happened to the interactive requests of [`interactive_run`]: how many went to
/// the slow endpoint, of how many, and the share that met their SLO.
struct Interactive {
    on_slow: usize,
    n: usize,
    attainment: f64,
    background_on_slow: usize,
}

/// A warm-up without SLOs (40 s at 10/s), then 40 s of background traffic without
/// SLO headers (6/s) mixed with interactive requests (TTFT 400 ms, TPOT 40 ms, 6/s).
fn interactive_run(config: String, seed: u64) -> Interactive {
    let (mut sim, eps) = mixed_pool(config, seed);
    let mut rng = Rng::new(seed, 1);
    sim.add_requests(traffic(&mut rng, ms(100), 10.0, 400, &[]));
    let start = 41 * SEC;
    let background = sim.add_requests(traffic(&mut rng, start, 6.0, 240, &[]));
    let tight = sim.add_requests(traffic(
        &mut rng,
        start,
        6.0,
        240,
        &[(TTFT, "400"), (TPOT, "40")],
    ));
    sim.run_until_answered(200 * SEC).unwrap();
    let (on_slow, n) = on(&sim, &tight, &eps[0]);
    Interactive {
        on_slow,
        n,
        attainment: attainment(&sim, &tight, 400.0, 40.0),
        background_on_slow: on(&sim, &background, &eps[0]).0,
    }
}

/// The predictor's tier filter in front of the default load scorers: endpoints predicted
/// to meet the request's SLO first, then the least loaded of them.
fn tier_config(eps: &[String]) -> String {
    json!({
        "pool": {"endpoints": eps},
        "plugins": [
            {"type": "predicted-latency-producer", "parameters": {"streamingMode": true}},
            {"type": "slo-headroom-tier-filter", "parameters": {"epsilonExploreNeg": 0}},
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "max-score-picker"}
        ]
    })
    .to_string()
}

/// After a warm-up without SLOs, interactive requests (TTFT 400 ms, TPOT 40 ms) keep
/// away from the slow endpoint, which cannot meet them, while background traffic
/// without SLO headers still uses it; with the tier filter in front of the load scorers
/// more of them meet their SLO than with the load scorers alone. The reference chart's
/// `latency-scorer` + `weighted-random-picker` avoids the slow endpoint too (fewer there
/// than the load scorers send) but meets fewer (printed, not asserted: 0.68 against 0.82
/// at this seed with `most`; its weighted draw spreads requests onto endpoints predicted
/// to just fit, and with the predictor's error margin fewer fit, so it lands 18 of 240 on
/// the slow endpoint against the load scorers' 33: under the twelfth, not under half).
#[test]
fn a_tight_slo_avoids_the_slow_endpoint() {
    let eps = endpoints(4);
    let tier = interactive_run(tier_config(&eps), 5);
    let reference = interactive_run(
        slo_config_with(
            &eps,
            json!({"streamingMode": true}),
            json!({"headroomSelectionStrategy": "most"}),
        ),
        5,
    );
    let default = interactive_run(learning_config(&eps), 5);
    let line = |name: &str, r: &Interactive| {
        format!(
            "{name}: {} of {} interactive on the slow endpoint (background {}), attainment {:.2}",
            r.on_slow, r.n, r.background_on_slow, r.attainment
        )
    };
    eprintln!(
        "{}\n{}\n{}",
        line("tier filter + load scorers", &tier),
        line("latency-scorer (most) + weighted random", &reference),
        line("default load scorers", &default)
    );
    assert!(
        tier.on_slow * 2 <= default.on_slow,
        "{}",
        line("tier filter + load scorers", &tier)
    );
    for r in [&tier, &reference] {
        assert!(r.on_slow * 12 <= r.n, "{}", line("SLO profile", r));
        assert!(r.on_slow < default.on_slow, "{}", line("SLO profile", r));
        assert!(
            r.background_on_slow > 0,
            "the slow endpoint still serves background"
        );
    }
    assert!(
        tier.attainment > default.attainment,
        "{} / {}",
        line("tier", &tier),
        line("default", &default)
    );
}

/// With `latency-slo-admitter`, a sheddable request that no endpoint is predicted to
/// serve within its SLO gets 429 with an OpenAI-style body naming the SLO, while a
/// critical request with the same SLO is served.
#[test]
fn sheddable_requests_nobody_can_serve_get_429_and_critical_ones_are_served() {
    let (mut sim, _eps) = mixed_pool(slo_config(&endpoints(4)), 7);
    let mut rng = Rng::new(7, 1);
    sim.add_requests(traffic(&mut rng, ms(100), 12.0, 450, &[]));
    let at = 20 * SEC;
    let sheddable = sim.add_requests(traffic(
        &mut rng,
        at,
        4.0,
        20,
        &[(TTFT, "5"), ("x-gateway-inference-objective", "batch")],
    ));
    let critical = sim.add_requests(traffic(
        &mut rng,
        at,
        4.0,
        20,
        &[(TTFT, "5"), ("x-gateway-inference-objective", "critical")],
    ));
    sim.run_until_answered(200 * SEC).unwrap();
    let statuses = |ids: &[usize]| -> Vec<u16> {
        ids.iter()
            .map(|&i| sim.outcome(i).status.unwrap_or(0))
            .collect()
    };
    let shed = statuses(&sheddable);
    let served = statuses(&critical);
    eprintln!("sheddable {shed:?}\ncritical {served:?}");
    // The admitter's rule lets one through when some endpoint is idle (nothing in
    // flight) at that instant: 17 of 20 refused at this seed.
    let refused = shed.iter().filter(|s| **s == 429).count();
    assert!(
        refused >= 16,
        "{refused} of 20 sheddable requests refused: {shed:?}"
    );
    assert!(served.iter().all(|s| *s == 200), "{served:?}");
    let o = sheddable
        .iter()
        .map(|&i| sim.outcome(i))
        .find(|o| o.status == Some(429))
        .unwrap();
    let body = o.json();
    assert_eq!(body["error"]["code"], 429);
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("TTFT 5 ms"), "{message}");
}

/// Every VM (the four workers' and the main thread's, so whichever trains) traps once at
/// 25 s and is reloaded: the model lives in shared data, so training continues from what
/// was learnt — the sample count keeps growing from where it was, and the slow endpoint
/// is still known as slow.
#[test]
fn a_crash_of_every_vm_loses_nothing_the_predictor_learnt() {
    let (mut sim, eps) = mixed_pool(learning_config(&endpoints(4)), 9);
    let mut rng = Rng::new(9, 1);
    sim.add_requests(traffic(&mut rng, ms(100), 12.0, 600, &[]));
    let crash_at = 25 * SEC;
    let workers = (0..4).map(host_sim::slot_of_worker);
    for slot in std::iter::once(host_sim::SLOT_MAIN).chain(workers) {
        sim.add_fault(
            Fault::new("proxy_get_shared_data", FaultAction::Trap)
                .in_slot(slot)
                .between(crash_at, u64::MAX)
                .times(1),
        );
    }
    sim.run_until(crash_at).unwrap();
    let before = latency_model(&sim);
    sim.run_until_answered(200 * SEC).unwrap();
    let after = latency_model(&sim);
    let n = |m: &epp_filter::latency::Model| m.samples(Target::Ttft);
    let slow = |m: &epp_filter::latency::Model| {
        m.endpoints
            .iter()
            .find(|e| e.address == eps[0])
            .map_or(0.0, |e| e.ttft_log.exp())
    };
    eprintln!(
        "crashes {}, reloads {}; TTFT samples {} before, {} after; slow factor {:.2} -> {:.2}",
        sim.crashes().len(),
        sim.reloads(),
        n(&before),
        n(&after),
        slow(&before),
        slow(&after)
    );
    assert_eq!(sim.crashes().len(), 5);
    assert!(n(&before) >= 250, "{}", n(&before));
    assert!(
        n(&after) >= n(&before) + 250,
        "{} then {}",
        n(&before),
        n(&after)
    );
    assert!(slow(&before) > 1.3 && slow(&after) > 1.3);
}

/// The shipped SLO configuration (`envoy/config/slo-routing.json`: the default profile
/// for requests without SLO headers, the measured-best SLO profile for those with one)
/// on `eps`.
fn shipped_slo_config(eps: &[String]) -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../envoy/config/slo-routing.json"
    );
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("shipped config")).unwrap();
    config["pool"] = json!({"endpoints": eps});
    config.to_string()
}

/// 4 equal engines; a warm-up without SLOs (30 s at 8/s), then 40 s of interactive
/// requests (TTFT 300 ms, TPOT 40 ms, 5/s) mixed with relaxed ones (3 s, 150 ms, 5/s):
/// about the load where the default profile starts missing interactive SLOs. The share
/// of interactive requests that met their SLO, and of relaxed ones.
fn overloaded_run(config: String, seed: u64) -> (f64, f64) {
    let (mut sim, _) = pool_of_four(config, seed);
    let mut rng = Rng::new(seed, 1);
    sim.add_requests(traffic(&mut rng, ms(100), 8.0, 240, &[]));
    let start = 31 * SEC;
    let relaxed = sim.add_requests(traffic(
        &mut rng,
        start,
        5.0,
        200,
        &[(TTFT, "3000"), (TPOT, "150")],
    ));
    let interactive = sim.add_requests(traffic(
        &mut rng,
        start,
        5.0,
        200,
        &[(TTFT, "300"), (TPOT, "40")],
    ));
    sim.run_until_answered(200 * SEC).unwrap();
    (
        attainment(&sim, &interactive, 300.0, 40.0),
        attainment(&sim, &relaxed, 3000.0, 150.0),
    )
}

/// The SLO profile the docs recommend (the shipped `slo-routing.json`: tier filter,
/// `latency-scorer` (most) beside the load scorers, max-score picker) meets more
/// interactive SLOs on a loaded pool than the filter's default profile, without giving
/// up the relaxed class (measured at seed 7: 0.945 against 0.840, relaxed 1.0 on both).
#[test]
fn the_recommended_slo_profile_meets_more_interactive_slos_than_the_default() {
    let eps = endpoints(4);
    let default = overloaded_run(json!({"pool": {"endpoints": eps}}).to_string(), 7);
    let slo = overloaded_run(shipped_slo_config(&eps), 7);
    eprintln!(
        "interactive / relaxed attainment: default profile {default:.3?}, shipped SLO profile {slo:.3?}"
    );
    assert!(
        slo.0 >= default.0 + 0.05,
        "default {default:?}, SLO {slo:?}"
    );
    assert!(
        slo.1 >= default.1 - 0.02,
        "default {default:?}, SLO {slo:?}"
    );
}
