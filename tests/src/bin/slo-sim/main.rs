//! SLO-aware routing in virtual time: a workload of mixed SLO classes against a pool of
//! `vllm-sim` engines (`h100-llama-8b`) inside host-sim's simulated multi-worker Envoy,
//! the real filter `.wasm`. Two questions, two modes:
//!
//! * **outcome** (default) — per QPS step and side, over the requests sent in the
//!   measured window (after `--warmup` seconds of the same load): per SLO class,
//!   attainment (share of the requests sent that got a 200 with TTFT and TPOT within
//!   their SLO; a shed or failed request did not), goodput (such requests per second),
//!   TTFT and TPOT p50/p90 of the served ones, and 429s (shed). Classes: `interactive`
//!   (TTFT 300 ms, TPOT 40 ms), `relaxed` (3 s, 150 ms) and `sheddable` (relaxed SLOs,
//!   objective `batch`, priority −1). Sides: `default` (the filter's default profile),
//!   `slo` (the predictor's tier filter in front of the default load scorers, with the
//!   admitter), `slo-blend` (the same with `latency-scorer` (most) beside the load
//!   scorers), `slo-chart` (the reference chart's profile: tier filter, `latency-scorer`,
//!   weighted random, admitter), `least_request` (host-sim's model of Envoy's
//!   `LEAST_REQUEST`, no filter). With a latency producer, also the predictor's MAPE
//!   over the window (from its `…_absolute_percentage_error_total` and
//!   `…_scored_total` counters).
//! * **accuracy** (`--schedule Q:S,Q:S,..`) — one world, the predictor learning beside
//!   the default load scorers, the QPS changing abruptly from step to step; the
//!   predictions' MAPE (TTFT, TPOT) in every `--window` seconds, from the first request.
//! * **matrix** (`--matrix POOLS`) — the shipped SLO configuration against the default
//!   profile over pool shapes × arrival shapes × interactive shares × seeds ([`matrix`]),
//!   with `--trace` where each class's misses went and what was predicted for them
//!   ([`trace`]).
//!
//! Every side gets the identical request sequence and arrival times; everything is a
//! function of `--seed`. Streamed completions with `usage`; TPOT = (last − first chunk)
//! / (chunks − 1).
//!
//! `cargo run --release -p tests --features virtual --bin slo-sim -- --help`

use host_sim::host::vm::Cluster;
use host_sim::world::balancers::{Balancer, LeastRequest};
use host_sim::world::clock::Rng;
use host_sim::{
    Condition, Control, Final, Nanos, Outcome, RequestSpec, Sim, SimConfig, VllmConfig, MS, SEC,
};
use serde_json::{json, Value};
use std::time::Instant;
use tests::loadgen::stats::Summary;

mod matrix;
mod trace;

const HELP: &str = "slo-sim: SLO-aware routing in virtual time (host-sim + vllm-sim engines)

  --servers N          model servers in the pool [16]
  --slow N:F           the first N servers F times slower (a mixed pool) [none]
  --qps A,B,C          outcome: QPS steps [20,40,60,80]
  --seconds S          outcome: measured seconds per step [60]
  --warmup S           outcome: seconds of the same load before measuring [60]
  --sides LIST         outcome: default,slo,slo-blend,slo-chart,least_request [default,slo,least_request]
  --mix I,R,S          shares of interactive, relaxed, sheddable requests [0.5,0.3,0.2]
  --schedule Q:S,..    accuracy mode: QPS Q for S seconds, in order (replaces the outcome)
  --window S           accuracy mode: MAPE per window of S seconds [30]
  --max-num-seqs N     per server [16]
  --kv-blocks N        KV blocks of 16 tokens per server [4096]
  --latency-jitter J   the engines' step jitter (std of a Normal(1, J)) [the profile's, 0.15]
  --workers N          Envoy workers [4]
  --wasm FILE          the filter module [target/wasm32-wasip1/release/epp_filter.wasm]
  --seed N             [1]
  --slo-config FILE    the `shipped` side's configuration [envoy/config/slo-routing.json]

matrix mode (`scripts/bench slo --matrix ..`): per cell the default profile and the
shipped SLO configuration on the same seeded load; two classes (interactive, relaxed)
  --matrix POOLS       pool shapes N:R:J: N servers whose speeds spread evenly from 1×
                       to R× slower, engine step jitter J (0 = none); e.g. 4:3:0.15,16:1:0
  --arrivals LIST      steady, burst (0.7×, with 4 s at 2.2× every 20 s), step (0.7×,
                       1.6×, 0.7× over thirds of the window) [steady,burst,step]
  --shares LIST        interactive shares [0.2,0.5,0.8]
  --seeds LIST         [1,2]
  --load L             mean QPS per 1× server at an even mix (scaled by the pool's speeds
                       and the share's request sizes) [1.1]
  --json FILE          also write every run's figures as JSON (the plot's input)
  --jobs N             runs at a time, each on its own thread [2]
  --trace              per cell and side: each class's misses by server speed, arrival
                       phase and cause, with the predictions made for them
  (--warmup and --seconds apply per cell; the matrix's defaults are 20 and 40)";

use tests::openai::MODEL;
const TTFT: &str = "x-llm-d-slo-ttft-ms";
const TPOT: &str = "x-llm-d-slo-tpot-ms";
const OBJECTIVE: &str = "x-gateway-inference-objective";

/// One SLO class: its name, TTFT and TPOT objectives (ms), objective (priority).
struct Class {
    name: &'static str,
    ttft: f64,
    tpot: f64,
    objective: &'static str,
}

const CLASSES: [Class; 3] = [
    Class {
        name: "interactive",
        ttft: 300.0,
        tpot: 40.0,
        objective: "critical",
    },
    Class {
        name: "relaxed",
        ttft: 3000.0,
        tpot: 150.0,
        objective: "standard",
    },
    Class {
        name: "sheddable",
        ttft: 3000.0,
        tpot: 150.0,
        objective: "batch",
    },
];

#[derive(Clone)]
struct Args {
    servers: usize,
    slow: Option<(usize, f64)>,
    /// Each server's slowdown (1 = the profile's speed); from `--slow` or a matrix pool.
    speeds: Vec<f64>,
    qps: Vec<f64>,
    seconds: f64,
    warmup: f64,
    sides: Vec<String>,
    mix: [f64; 3],
    schedule: Vec<(f64, f64)>,
    window: f64,
    max_num_seqs: usize,
    kv_blocks: usize,
    jitter: Option<f64>,
    workers: usize,
    wasm: Option<std::path::PathBuf>,
    seed: u64,
    slo_config: std::path::PathBuf,
    matrix: Option<matrix::Options>,
}

fn list<T: std::str::FromStr>(v: &str) -> Option<Vec<T>> {
    v.split(',').map(|q| q.trim().parse::<T>().ok()).collect()
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        servers: 16,
        slow: None,
        speeds: Vec::new(),
        qps: vec![20.0, 40.0, 60.0, 80.0],
        seconds: 60.0,
        warmup: 60.0,
        sides: ["default", "slo", "least_request"]
            .map(String::from)
            .to_vec(),
        mix: [0.5, 0.3, 0.2],
        schedule: Vec::new(),
        window: 30.0,
        max_num_seqs: 16,
        kv_blocks: 4096,
        jitter: None,
        workers: 4,
        wasm: None,
        seed: 1,
        slo_config: "envoy/config/slo-routing.json".into(),
        matrix: None,
    };
    let mut m = matrix::Options::default();
    let (mut seconds_set, mut warmup_set) = (false, false);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            println!("{HELP}");
            std::process::exit(0);
        }
        if flag == "--trace" {
            m.trace = true;
            continue;
        }
        let v = it
            .next()
            .ok_or_else(|| anyhow::anyhow!("{flag} needs a value (see --help)"))?;
        let bad = || anyhow::anyhow!("{flag} {v}: not understood (see --help)");
        match flag.as_str() {
            "--servers" => a.servers = v.parse().map_err(|_| bad())?,
            "--slow" => {
                let (n, f) = v.split_once(':').ok_or_else(bad)?;
                a.slow = Some((n.parse().map_err(|_| bad())?, f.parse().map_err(|_| bad())?));
            }
            "--qps" => a.qps = list(&v).ok_or_else(bad)?,
            "--seconds" => {
                a.seconds = v.parse().map_err(|_| bad())?;
                seconds_set = true;
            }
            "--warmup" => {
                a.warmup = v.parse().map_err(|_| bad())?;
                warmup_set = true;
            }
            "--sides" => a.sides = v.split(',').map(|s| s.trim().to_string()).collect(),
            "--mix" => {
                let m: Vec<f64> = list(&v).ok_or_else(bad)?;
                a.mix = <[f64; 3]>::try_from(m.as_slice()).map_err(|_| bad())?;
            }
            "--schedule" => {
                a.schedule = v
                    .split(',')
                    .map(|p| {
                        let (q, s) = p.split_once(':')?;
                        Some((q.trim().parse().ok()?, s.trim().parse().ok()?))
                    })
                    .collect::<Option<_>>()
                    .ok_or_else(bad)?
            }
            "--window" => a.window = v.parse().map_err(|_| bad())?,
            "--max-num-seqs" => a.max_num_seqs = v.parse().map_err(|_| bad())?,
            "--kv-blocks" => a.kv_blocks = v.parse().map_err(|_| bad())?,
            "--latency-jitter" => {
                a.jitter = Some(
                    v.parse()
                        .ok()
                        .filter(|j: &f64| (0.0..=0.5).contains(j))
                        .ok_or_else(bad)?,
                )
            }
            "--workers" => a.workers = v.parse().map_err(|_| bad())?,
            "--wasm" => a.wasm = Some(v.into()),
            "--seed" => a.seed = v.parse().map_err(|_| bad())?,
            "--slo-config" => a.slo_config = v.into(),
            "--matrix" => m.pools = matrix::pools(&v).ok_or_else(bad)?,
            "--arrivals" => m.arrivals = matrix::arrivals(&v).ok_or_else(bad)?,
            "--shares" => m.shares = list(&v).ok_or_else(bad)?,
            "--seeds" => m.seeds = list(&v).ok_or_else(bad)?,
            "--load" => m.load = v.parse().map_err(|_| bad())?,
            "--json" => m.json = Some(v.into()),
            "--jobs" => m.jobs = v.parse().map_err(|_| bad())?,
            _ => anyhow::bail!("unknown flag {flag} (see --help)"),
        }
    }
    a.speeds = vec![1.0; a.servers];
    if let Some((n, f)) = a.slow {
        a.speeds.iter_mut().take(n).for_each(|s| *s = f);
    }
    if !m.pools.is_empty() {
        anyhow::ensure!(
            !m.arrivals.is_empty() && !m.seeds.is_empty() && !m.shares.is_empty(),
            "--arrivals, --shares and --seeds must not be empty"
        );
        anyhow::ensure!(
            m.shares.iter().all(|s| (0.0..=1.0).contains(s)),
            "--shares: each in 0..1"
        );
        anyhow::ensure!(m.load > 0.0, "--load must be positive");
        if !seconds_set {
            a.seconds = 40.0;
        }
        if !warmup_set {
            a.warmup = 20.0;
        }
        a.matrix = Some(m);
    }
    for s in &a.sides {
        anyhow::ensure!(
            [
                "default",
                "slo",
                "slo-blend",
                "slo-chart",
                "shipped",
                "least_request"
            ]
            .contains(&s.as_str()),
            "--sides: unknown side {s:?}"
        );
    }
    anyhow::ensure!(a.servers > 0 && !a.qps.is_empty(), "--servers and --qps");
    anyhow::ensure!(
        a.mix.iter().all(|m| *m >= 0.0) && a.mix.iter().sum::<f64>() > 0.0,
        "--mix: shares ≥ 0, not all 0"
    );
    Ok(a)
}

/// The filter's configuration for `side` (`None`: no filter); `shipped` is the file
/// `--slo-config` with this pool.
fn config(a: &Args, side: &str, eps: &[String]) -> anyhow::Result<Option<Value>> {
    if side == "shipped" {
        let text = std::fs::read_to_string(&a.slo_config)
            .map_err(|e| anyhow::anyhow!("{}: {e}", a.slo_config.display()))?;
        let mut v: Value = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: {e}", a.slo_config.display()))?;
        let obj = v
            .as_object_mut()
            .ok_or_else(|| anyhow::anyhow!("{}: not an object", a.slo_config.display()))?;
        obj.insert(
            "pool".into(),
            json!({"endpoints": eps, "objectives": objectives()}),
        );
        return Ok(Some(v));
    }
    Ok(builtin_config(side, eps))
}

/// The objectives the classes name.
fn objectives() -> Value {
    json!([
        {"name": "critical", "priority": 10},
        {"name": "standard", "priority": 0},
        {"name": "batch", "priority": -1}
    ])
}

/// The configurations slo-sim defines itself (`None`: no filter).
fn builtin_config(side: &str, eps: &[String]) -> Option<Value> {
    let objectives = objectives();
    let producer =
        json!({"type": "predicted-latency-producer", "parameters": {"streamingMode": true}});
    let plugins = match side {
        "default" => return Some(json!({"pool": {"endpoints": eps, "objectives": objectives}})),
        "learning" => json!([
            producer,
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "max-score-picker"}
        ]),
        "slo" => json!([
            producer,
            {"type": "slo-headroom-tier-filter", "parameters": {"epsilonExploreNeg": 0}},
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "latency-slo-admitter"},
            {"type": "max-score-picker"}
        ]),
        "slo-blend" => json!([
            producer,
            {"type": "slo-headroom-tier-filter", "parameters": {"epsilonExploreNeg": 0}},
            {"type": "latency-scorer", "parameters": {"headroomSelectionStrategy": "most"}},
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "latency-slo-admitter"},
            {"type": "max-score-picker"}
        ]),
        "slo-chart" => json!([
            producer,
            {"type": "slo-headroom-tier-filter"},
            {"type": "latency-scorer"},
            {"type": "latency-slo-admitter"},
            {"type": "weighted-random-picker"}
        ]),
        _ => return None,
    };
    Some(json!({"pool": {"endpoints": eps, "objectives": objectives}, "plugins": plugins}))
}

fn side_label(side: &str) -> &str {
    match side {
        "default" => "filter, default profile",
        "slo" => "filter, SLO: tier filter + queue + kv + admitter",
        "slo-blend" => "filter, SLO: tier filter + latency-scorer (most) + queue + kv + admitter",
        "slo-chart" => "filter, SLO: reference chart (tier + latency-scorer + weighted random)",
        "shipped" => "filter, the shipped SLO configuration",
        "learning" => "filter, default scorers + predictor",
        _ => "Envoy LEAST_REQUEST (model)",
    }
}

/// A world for `side`: the pool, the filter (or the balancer), nothing sent yet.
fn world(a: &Args, side: &str) -> anyhow::Result<(Sim, Vec<String>)> {
    let eps: Vec<String> = (0..a.servers)
        .map(|i| format!("10.0.{}.{}:8000", i / 250, i % 250 + 1))
        .collect();
    let filter = config(a, side, &eps)?;
    let text = filter
        .clone()
        .unwrap_or_else(|| json!({"pool": {"endpoints": eps}}))
        .to_string();
    let mut cfg = SimConfig::new(&text).workers(a.workers).seed(a.seed);
    if let Some(w) = &a.wasm {
        cfg.wasm = w.clone();
    }
    cfg.clusters.push(Cluster {
        name: "epp-metrics".into(),
        dst_header: "x-envoy-original-dst-host".into(),
    });
    let mut sim = Sim::new(cfg)?;
    for (i, e) in eps.iter().enumerate() {
        let mut engine = VllmConfig::new(e)
            .profile("h100-llama-8b")
            .max_num_seqs(a.max_num_seqs)
            .kv_blocks(a.kv_blocks)
            .max_waiting(100_000)
            .seed(a.seed.wrapping_add(i as u64));
        if let Some(j) = a.jitter {
            engine.engine.latency.jitter = j;
        }
        let engine = engine.build();
        sim.add_endpoint(e, Box::new(engine));
    }
    for (e, &f) in eps.iter().zip(&a.speeds) {
        if f != 1.0 {
            sim.at(0, Control::SetCondition(e.clone(), Condition::Slowed(f)));
        }
    }
    if filter.is_none() {
        let b: Box<dyn Balancer> = Box::new(LeastRequest::new(a.seed));
        sim.set_balancer(b);
    }
    Ok((sim, eps))
}

/// The request sequence: Poisson arrivals following `steps` (QPS, seconds) from
/// `start`; each request of a class drawn by `mix`, labelled `<prefix><class index>`
/// where `prefix(t)` says which window it belongs to. Prompts of 20–300 words, about
/// 40–650 tokens (interactive) or 100–1,000 words, about 200–2,100 tokens (others);
/// 16–128 or 64–256 output tokens.
fn requests(
    a: &Args,
    start: Nanos,
    steps: &[(f64, f64)],
    prefix: impl Fn(Nanos) -> String,
) -> Vec<RequestSpec> {
    let mut rng = Rng::new(a.seed, 7);
    let mut out = Vec::new();
    let mut step_start = start as f64;
    let mut t = start as f64;
    let mut i = 0usize;
    for &(qps, secs) in steps {
        let end = step_start + secs * SEC as f64;
        if qps > 0.0 {
            loop {
                t += rng.exponential(SEC as f64 / qps);
                if t >= end {
                    break;
                }
                let c = rng.weighted(&a.mix).min(2);
                let class = &CLASSES[c];
                let (words, tokens) = if c == 0 {
                    (20 + rng.below(280) as usize, 16 + rng.below(113) as u32)
                } else {
                    (100 + rng.below(900) as usize, 64 + rng.below(193) as u32)
                };
                let prompt: String = (0..words).map(|w| format!("r{i}w{w} ")).collect();
                let body = json!({
                    "model": MODEL, "prompt": prompt.trim_end(), "max_tokens": tokens,
                    "stream": true, "stream_options": {"include_usage": true}
                });
                let at = t as Nanos;
                out.push(
                    RequestSpec::post("/v1/completions", body.to_string())
                        .at(at)
                        .header(TTFT, &class.ttft.to_string())
                        .header(TPOT, &class.tpot.to_string())
                        .header(OBJECTIVE, class.objective)
                        .label(&format!("{}{c}", prefix(at))),
                );
                i += 1;
            }
        }
        t = end;
        step_start = end;
    }
    out
}

/// Observed TTFT (dispatch → first chunk; client-side: send → first chunk) and TPOT
/// (ms) of a served streamed outcome.
fn observed(o: &Outcome) -> Option<(f64, f64)> {
    if o.fin != Final::Response || o.status != Some(200) {
        return None;
    }
    let first = *o.data_at.first()?;
    let last = *o.data_at.last()?;
    let n = o.data_at.len();
    let ttft = (first - o.sent_at) as f64 / 1e6;
    let tpot = if n > 1 {
        (last - first) as f64 / 1e6 / (n - 1) as f64
    } else {
        0.0
    };
    Some((ttft, tpot))
}

/// How far each served stream of the window `label` is from its neighbours: the
/// median TPOT of the other streams dispatched to the same endpoint within
/// [`NEIGHBOURS_NS`] of it, taken as a prediction (MAPE over the window's streams of more
/// than one chunk). A predictor that knew, in hindsight, the load each request met but
/// nothing of the request itself would have this error: how much TPOT varies between
/// requests that shared a server at the same time.
fn neighbours_tpot_mape(outcomes: &[Outcome], label: &str) -> Option<f64> {
    let mut by_endpoint: std::collections::HashMap<&str, Vec<(Nanos, f64)>> =
        std::collections::HashMap::new();
    for o in outcomes {
        if let (Some(ep), Some(at), Some((_, tpot))) =
            (o.endpoint.as_deref(), o.dispatched_at, observed(o))
        {
            if tpot > 0.0 {
                by_endpoint.entry(ep).or_default().push((at, tpot));
            }
        }
    }
    let (mut err, mut n) = (0.0, 0u64);
    for o in outcomes.iter().filter(|o| o.label.starts_with(label)) {
        let (Some(ep), Some(at), Some((_, tpot))) =
            (o.endpoint.as_deref(), o.dispatched_at, observed(o))
        else {
            continue;
        };
        let mut near: Vec<f64> = by_endpoint
            .get(ep)
            .into_iter()
            .flatten()
            .filter(|v| v.0 != at && v.0.abs_diff(at) <= NEIGHBOURS_NS)
            .map(|v| v.1)
            .collect();
        if tpot <= 0.0 || near.is_empty() {
            continue;
        }
        near.sort_by(f64::total_cmp);
        err += (near[near.len() / 2] - tpot).abs() / tpot;
        n += 1;
    }
    (n > 0).then(|| err / n as f64)
}

/// Streams dispatched within this much of each other are neighbours for
/// [`neighbours_tpot_mape`].
const NEIGHBOURS_NS: Nanos = SEC;

/// The predictor's error counters: (sum of APE in ‰, predictions scored) for TTFT, TPOT.
fn error_counters(sim: &Sim) -> [(f64, f64); 2] {
    let text = sim.prometheus();
    let v = |series: &str| host_sim::prometheus::value(&text, series).unwrap_or(0.0);
    ["ttft", "tpot"].map(|p| {
        (
            v(&format!(
                "inference_extension_latency_predictor_absolute_percentage_error_total{{prediction=\"{p}\"}}"
            )),
            v(&format!(
                "inference_extension_latency_predictor_scored_total{{prediction=\"{p}\"}}"
            )),
        )
    })
}

/// MAPE (%) between two readings of [`error_counters`], with the count.
fn mape(before: [(f64, f64); 2], after: [(f64, f64); 2]) -> [(Option<f64>, u64); 2] {
    [0, 1].map(|i| {
        let n = after[i].1 - before[i].1;
        let e = after[i].0 - before[i].0;
        ((n > 0.0).then(|| e / n / 10.0), n.max(0.0) as u64)
    })
}

fn pct(m: (Option<f64>, u64)) -> String {
    m.0.map_or("-".into(), |v| format!("{v:.1} % ({})", m.1))
}

fn p50_p90(v: &[f64]) -> String {
    Summary::of(v).map_or("-".into(), |s| format!("{:.0} / {:.0}", s.p50, s.p90))
}

/// The pool and the gateway, as both tables' headers describe them.
fn pool_description(a: &Args) -> String {
    format!(
        "{} servers (vllm-sim h100-llama-8b, max-num-seqs {}, {} KV blocks of 16 tokens{}){}, {} Envoy workers",
        a.servers,
        a.max_num_seqs,
        a.kv_blocks,
        a.jitter
            .map_or(String::new(), |j| format!(", step jitter {j}")),
        a.slow
            .map_or(String::new(), |(n, f)| format!(", the first {n} {f}× slower")),
        a.workers,
    )
}

fn outcome(a: &Args) -> anyhow::Result<()> {
    println!(
        "{}; classes interactive (TTFT 300 ms / TPOT 40 ms, objective critical), relaxed (3 s / 150 ms, standard), \
         sheddable (3 s / 150 ms, objective batch = priority −1), shares {:?}; warm-up {} s, measured {} s per step; seed {}",
        pool_description(a),
        a.mix,
        a.warmup,
        a.seconds,
        a.seed
    );
    println!();
    println!("| QPS | side | class | sent | attainment | goodput /s | TTFT p50 / p90 ms | TPOT p50 / p90 ms | shed (429) | other failures |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut errors = Vec::new();
    for &qps in &a.qps {
        for side in &a.sides {
            let wall = Instant::now();
            let (mut sim, _eps) = world(a, side)?;
            let start: Nanos = 10 * MS;
            let measure_from = start + (a.warmup * SEC as f64) as Nanos;
            let end = measure_from + (a.seconds * SEC as f64) as Nanos;
            let specs = requests(a, start, &[(qps, a.warmup + a.seconds)], |t| {
                (if t >= measure_from { "m" } else { "w" }).to_string()
            });
            sim.add_requests(specs);
            sim.run_until(measure_from)?;
            let before = error_counters(&sim);
            sim.run_until(end)?;
            let answered = sim.run_until_answered(end + 900 * SEC)?;
            anyhow::ensure!(
                answered,
                "{side} at {qps} QPS: unanswered 900 s after the last arrival"
            );
            let after = error_counters(&sim);
            let mut totals = (0usize, 0usize);
            for (c, class) in CLASSES.iter().enumerate() {
                let label = format!("m{c}");
                let os: Vec<&Outcome> =
                    sim.outcomes().iter().filter(|o| o.label == label).collect();
                if os.is_empty() {
                    continue;
                }
                let served: Vec<(f64, f64)> = os.iter().filter_map(|o| observed(o)).collect();
                let met = served
                    .iter()
                    .filter(|(t, p)| *t <= class.ttft && *p <= class.tpot)
                    .count();
                let shed = os.iter().filter(|o| o.status == Some(429)).count();
                let failed = os.len() - served.len() - shed;
                totals.0 += met;
                totals.1 += os.len();
                let ttft: Vec<f64> = served.iter().map(|s| s.0).collect();
                let tpot: Vec<f64> = served.iter().map(|s| s.1).collect();
                println!(
                    "| {qps} | {} | {} | {} | {:.3} | {:.2} | {} | {} | {shed} | {failed} |",
                    side_label(side),
                    class.name,
                    os.len(),
                    met as f64 / os.len() as f64,
                    met as f64 / a.seconds,
                    p50_p90(&ttft),
                    p50_p90(&tpot),
                );
            }
            println!(
                "| {qps} | {} | **all** | {} | {:.3} | **{:.2}** | | | | |",
                side_label(side),
                totals.1,
                totals.0 as f64 / totals.1.max(1) as f64,
                totals.0 as f64 / a.seconds,
            );
            let m = mape(before, after);
            if m[0].1 > 0 {
                errors.push(format!(
                    "{qps} QPS, {}: TTFT {}, TPOT {}",
                    side_label(side),
                    pct(m[0]),
                    pct(m[1])
                ));
            }
            eprintln!(
                "slo-sim: {side} at {qps} QPS took {:.1} s",
                wall.elapsed().as_secs_f64()
            );
        }
    }
    if !errors.is_empty() {
        println!();
        println!(
            "Predictor MAPE over the measured window (predictions scored): {}",
            errors.join("; ")
        );
    }
    Ok(())
}

fn accuracy(a: &Args) -> anyhow::Result<()> {
    let side = "learning";
    println!(
        "{}; {}; schedule (QPS:s) {:?}; classes' shares {:?}; seed {}",
        pool_description(a),
        side_label(side),
        a.schedule,
        a.mix,
        a.seed
    );
    println!();
    println!(
        "| window s | QPS | TTFT MAPE (n) | TPOT MAPE (n) | TPOT vs its neighbours' median | TTFT p50 ms | TPOT p50 ms |"
    );
    println!("|---|---|---|---|---|---|---|");
    let (mut sim, _eps) = world(a, side)?;
    let start: Nanos = 10 * MS;
    let window = (a.window * SEC as f64) as Nanos;
    let specs = requests(a, start, &a.schedule, |t| {
        format!("{}:", (t - start) / window)
    });
    sim.add_requests(specs);
    let total: f64 = a.schedule.iter().map(|s| s.1).sum();
    let qps_at = |t: f64| {
        let mut acc = 0.0;
        for &(q, s) in &a.schedule {
            acc += s;
            if t < acc {
                return q;
            }
        }
        0.0
    };
    let mut before = error_counters(&sim);
    let mut k = 0u64;
    // Predictions are scored when the request ends: a window's MAPE covers the requests
    // that ended in it.
    while (k as f64) * a.window < total {
        let to = start + (k + 1) * window;
        sim.run_until(to)?;
        let after = error_counters(&sim);
        let m = mape(before, after);
        let label = format!("{k}:");
        let served: Vec<(f64, f64)> = sim
            .outcomes()
            .iter()
            .filter(|o| o.label.starts_with(&label))
            .filter_map(observed)
            .collect();
        let ttft: Vec<f64> = served.iter().map(|s| s.0).collect();
        let tpot: Vec<f64> = served.iter().map(|s| s.1).collect();
        let med = |v: &[f64]| Summary::of(v).map_or("-".into(), |s| format!("{:.0}", s.p50));
        let neighbours = neighbours_tpot_mape(sim.outcomes(), &label);
        println!(
            "| {}–{} | {} | {} | {} | {} | {} | {} |",
            k as f64 * a.window,
            (k + 1) as f64 * a.window,
            qps_at(k as f64 * a.window),
            pct(m[0]),
            pct(m[1]),
            neighbours.map_or("-".into(), |v| format!("{:.1} %", 100.0 * v)),
            med(&ttft),
            med(&tpot)
        );
        before = after;
        k += 1;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let a = parse_args()?;
    if let Some(m) = &a.matrix {
        matrix::run(&a, m)
    } else if a.schedule.is_empty() {
        outcome(&a)
    } else {
        accuracy(&a)
    }
}
