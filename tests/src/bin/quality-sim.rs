//! Routing quality in virtual time, at a scale the real-time bench cannot reach on this
//! machine: the shared-prefix workload of `loadgen` (the same seeded prompts and Poisson
//! arrivals) against a pool of `vllm-sim` engines with the calibrated `h100-llama-8b`
//! profile, inside host-sim's simulated multi-worker Envoy. Sides:
//!
//! * `filter` — the real filter `.wasm` (default profile, or `--filter-config`), its data
//!   layer scraping the engines' `/metrics` through the `epp-metrics` cluster;
//! * `round_robin`, `least_request` — Envoy's `ROUND_ROBIN` and `LEAST_REQUEST` cluster
//!   policies (host-sim's models of them, no filter);
//! * `cache_aware` — a model of sglang-router 0.3.2's `cache_aware` policy with its
//!   default thresholds (host-sim's, from the documented algorithm; not the router
//!   itself).
//!
//! With `--replicas R1,R2,..` each side runs behind R independent gateway replicas (Envoy
//! processes with their own shared data, workers and filter VMs, as the pods of an Istio
//! ingress Deployment) in front of the same servers, every request on a new connection
//! that the Service spreads uniformly over the replicas (`--clients N`: N keep-alive
//! connections instead; `--replica-weights` an uneven spread). The stand-in balancers keep one state for all replicas (their
//! per-worker cursors are per replica's worker), which flatters them at R > 1.
//!
//! A side `filter=FILE` runs the filter with the plugin configuration in FILE (labelled by
//! the file's name), so several configurations run side by side on the same requests; the
//! three prefix-cache methods, for example:
//! `--sides filter=scripts/lib/bench/prefix-feedback-off.json,filter=scripts/lib/bench/prefix-feedback-on.json,filter=scripts/lib/bench/prefix-kv-events.json`.
//! When a side's configuration has `precise-prefix-cache-scorer`, the servers publish their
//! KV-cache events and host-sim runs `kv-relay`'s state beside them (events applied
//! `--kv-event-lag-ms` after the engine step that produced them), answering the filter's
//! polls on `relayCluster`.
//!
//! `--cold-gateway true`: the warm-up traffic goes through one gateway and the measured
//! traffic through another that starts (empty: no prefix index, no relay state) just
//! before the measured window, as a gateway pod restarted while the servers' caches are
//! warm (table column "replicas": `1 (cold)`).
//!
//! Each (replicas, side, QPS) is a fresh world: `--warmup` seconds of arrivals at that QPS, then
//! `--seconds` measured; every side gets the identical request sequence and arrival
//! times. Reported over the requests sent in the measured window: TTFT p50/p90/p99, ITL
//! p50/p90 (gaps between streamed chunks, pooled), output tokens/s, the prefix-cache hit
//! rate the servers report (their counters' deltas over the window), the servers'
//! waiting queue (mean over 0.5 s samples, summed over the pool) and the share of
//! requests per server, and the requests in flight at the servers (sent by the gateway,
//! not finished; sampled every 100 ms over the window: mean and max), which with flow
//! control shows how far the pool-wide bound exceeds the configured one. Everything is a
//! function of `--seed`; the wall time of each run is printed too. For the filter, also
//! its prefix index against the servers (cached-token feedback's counters over the window,
//! summed over the replicas the measured traffic goes through): prompt tokens it predicted cached on the chosen server ÷ the
//! tokens the servers reported cached, and the share of requests whose prediction held
//! within the feedback's tolerance (`--filter-config` with `cachedTokensFeedback: false`
//! measures the uncorrected index).
//!
//! With `--trace PREFIX` (or `QUALITY_SIM_TRACE=PREFIX` in the environment), each run also
//! writes every request (warm-up included) to `PREFIX-SIDE-REPLICAS-QPS.csv`, one line
//! each: sent at (ms), prompt group, replica, server, TTFT and time to dispatch (ms, −1
//! when none), then the prompt tokens the server reported cached, whether the request was
//! in the measured window (1/0), the group's first and second rendezvous owners (the
//! filter's own key and owner functions over every server, as the prior computes them),
//! and the servers' state at the last 10 ms sample before the dispatch (the filter reads
//! a scrape up to `refreshInterval` older): the owner's running / waiting / KV usage, the
//! chosen server's running / waiting, and the pool's mean waiting. The sampling steps
//! the simulation in 10 ms slices; the results are the same as without it.
//! `scripts/lib/bench/group_spread.py` and `scripts/lib/bench/slow_tenth.py` read these
//! files (where a group's requests went; what the slowest tenth were). Beside each, the
//! first replica's published rendezvous-prior weights every 0.5 s of the measured window
//! (`...-weights.csv`: the time in ms, then a weight 0..1 per server).
//!
//! `cargo run --release -p tests --features virtual --bin quality-sim -- --help`

use host_sim::host::vm::Cluster;
use host_sim::world::balancers::{Balancer, CacheAware, LeastRequest, RoundRobin};
use host_sim::world::kv_relay::KvRelayConfig;
use host_sim::{Final, Nanos, RequestSpec, Sim, SimConfig, VllmConfig, VllmUpstream, MS, SEC};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Instant;
use tests::loadgen::stats::{summary_json, Summary};
use tests::loadgen::workload::{Arrivals, Spec, Workload};

const HELP: &str = "quality-sim: routing quality in virtual time (host-sim + vllm-sim engines)

  --servers N            model servers in the pool [16]
  --qps A,B,C            QPS steps [16,32,48]
  --seconds S            measured seconds per step [30]
  --warmup S             seconds of the same load before measuring [15]
  --sides LIST           filter,round_robin,least_request,cache_aware [all four]; also
                         filter=FILE: the filter with FILE's configuration (several may run)
  --groups N             shared-prefix groups [128]
  --prompts-per-group N  [16]
  --system-prompt-len N  tokens shared by a group [1024]
  --question-len N       tokens per prompt [128]
  --output-len N         output tokens (ignore_eos) [64]
  --zipf S               Zipf exponent over groups, 0 = uniform [0]
  --max-num-seqs N       per server [8]
  --kv-blocks N          KV blocks of 16 tokens per server [1024]
  --workers N            Envoy workers per replica [4]
  --replicas A,B,C       gateway replicas (independent Envoys) in front of the pool [1]
  --replica-weights W,.. spread connections over the replicas in these proportions instead of
                         uniformly (one weight per replica; every --replicas value must match)
  --clients N            keep-alive client connections, requests spread round robin over
                         them; 0 = a new connection per request [0]
  --kv-event-lag-ms MS   a step's KV events reach the relay's state this much later [5]
  --cold-gateway B       [false] measured traffic through a gateway started (empty) at the
                         end of the warm-up; the warm-up's through another
  --filter-config FILE   the filter's plugin configuration (JSON); pool.endpoints is set
                         to the simulated servers [default profile]
  --wasm FILE            the filter module [target/wasm32-wasip1/release/epp_filter.wasm]
  --seed N               [1]
  --check-invariants B   [false] run host-sim's invariants after every event (slower;
                         the end-of-run checks always run)
  --json FILE            also write the results as JSON
  --trace PREFIX         write every request of each run to PREFIX-SIDE-REPLICAS-QPS.csv:
                         group, replica, server, TTFT, cached tokens, the group's rendezvous
                         owners and the servers' state at dispatch (see the module docs)";

/// The command line.
struct Args {
    servers: usize,
    qps: Vec<f64>,
    seconds: f64,
    warmup: f64,
    sides: Vec<String>,
    spec: Spec,
    max_num_seqs: usize,
    kv_blocks: usize,
    workers: usize,
    replicas: Vec<usize>,
    replica_weights: Vec<f64>,
    clients: u64,
    filter_config: Value,
    /// `filter=FILE` sides: their configurations.
    side_configs: BTreeMap<String, Value>,
    kv_event_lag: Nanos,
    cold_gateway: bool,
    wasm: Option<std::path::PathBuf>,
    seed: u64,
    json: Option<String>,
    check_invariants: bool,
    /// `--trace`: the per-request CSV files' prefix.
    trace: Option<String>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        servers: 16,
        qps: vec![16.0, 32.0, 48.0],
        seconds: 30.0,
        warmup: 15.0,
        sides: ["filter", "round_robin", "least_request", "cache_aware"]
            .map(String::from)
            .to_vec(),
        spec: Spec {
            groups: 128,
            prompts_per_group: 16,
            system_prompt_len: 1024,
            question_len: 128,
            output_len: 64,
            ..Spec::default()
        },
        max_num_seqs: 8,
        kv_blocks: 1024,
        workers: 4,
        replicas: vec![1],
        replica_weights: Vec::new(),
        clients: 0,
        filter_config: json!({}),
        side_configs: BTreeMap::new(),
        kv_event_lag: 5 * MS,
        cold_gateway: false,
        wasm: None,
        seed: 1,
        json: None,
        check_invariants: false,
        trace: std::env::var("QUALITY_SIM_TRACE").ok(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            println!("{HELP}");
            std::process::exit(0);
        }
        let v = it
            .next()
            .ok_or_else(|| anyhow::anyhow!("{flag} needs a value (see --help)"))?;
        let bad = |e: &dyn std::fmt::Display| anyhow::anyhow!("{flag} {v}: {e}");
        match flag.as_str() {
            "--servers" => a.servers = v.parse().map_err(|e| bad(&e))?,
            "--qps" => {
                a.qps = v
                    .split(',')
                    .map(|q| q.trim().parse::<f64>())
                    .collect::<Result<_, _>>()
                    .map_err(|e| bad(&e))?
            }
            "--seconds" => a.seconds = v.parse().map_err(|e| bad(&e))?,
            "--warmup" => a.warmup = v.parse().map_err(|e| bad(&e))?,
            "--sides" => a.sides = v.split(',').map(|s| s.trim().to_string()).collect(),
            "--groups" => a.spec.groups = v.parse().map_err(|e| bad(&e))?,
            "--prompts-per-group" => a.spec.prompts_per_group = v.parse().map_err(|e| bad(&e))?,
            "--system-prompt-len" => a.spec.system_prompt_len = v.parse().map_err(|e| bad(&e))?,
            "--question-len" => a.spec.question_len = v.parse().map_err(|e| bad(&e))?,
            "--output-len" => a.spec.output_len = v.parse().map_err(|e| bad(&e))?,
            "--zipf" => a.spec.zipf = v.parse().map_err(|e| bad(&e))?,
            "--max-num-seqs" => a.max_num_seqs = v.parse().map_err(|e| bad(&e))?,
            "--kv-blocks" => a.kv_blocks = v.parse().map_err(|e| bad(&e))?,
            "--workers" => a.workers = v.parse().map_err(|e| bad(&e))?,
            "--replicas" => {
                a.replicas = v
                    .split(',')
                    .map(|q| q.trim().parse::<usize>())
                    .collect::<Result<_, _>>()
                    .map_err(|e| bad(&e))?
            }
            "--clients" => a.clients = v.parse().map_err(|e| bad(&e))?,
            "--replica-weights" => {
                a.replica_weights = v
                    .split(',')
                    .map(|x| x.trim().parse::<f64>())
                    .collect::<Result<_, _>>()
                    .map_err(|e| bad(&e))?
            }
            "--filter-config" => {
                let text = std::fs::read_to_string(&v).map_err(|e| bad(&e))?;
                a.filter_config = serde_json::from_str(&text).map_err(|e| bad(&e))?;
            }
            "--kv-event-lag-ms" => {
                a.kv_event_lag =
                    (v.parse::<f64>().map_err(|e| bad(&e))? * MS as f64).max(0.0) as Nanos
            }
            "--cold-gateway" => a.cold_gateway = v.parse().map_err(|e| bad(&e))?,
            "--wasm" => a.wasm = Some(v.into()),
            "--seed" => a.seed = v.parse().map_err(|e| bad(&e))?,
            "--check-invariants" => a.check_invariants = v.parse().map_err(|e| bad(&e))?,
            "--json" => a.json = Some(v),
            "--trace" => a.trace = Some(v),
            _ => anyhow::bail!("unknown flag {flag} (see --help)"),
        }
    }
    for s in &a.sides {
        if let Some(file) = s.strip_prefix("filter=") {
            let text =
                std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("--sides {s}: {e}"))?;
            let config: Value =
                serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("--sides {s}: {e}"))?;
            a.side_configs.insert(s.clone(), config);
            continue;
        }
        anyhow::ensure!(
            ["filter", "round_robin", "least_request", "cache_aware"].contains(&s.as_str()),
            "--sides: unknown side {s:?}"
        );
    }
    anyhow::ensure!(
        !a.cold_gateway || a.replicas == [1],
        "--cold-gateway: with --replicas 1 only (the cold gateway is a second one)"
    );
    anyhow::ensure!(a.servers > 0 && !a.qps.is_empty(), "--servers and --qps");
    anyhow::ensure!(
        !a.replicas.is_empty() && a.replicas.iter().all(|&r| r > 0),
        "--replicas: at least one, each > 0"
    );
    anyhow::ensure!(
        a.replica_weights.is_empty()
            || (a.replicas.iter().all(|&r| r == a.replica_weights.len())
                && a.replica_weights.iter().all(|&w| w >= 0.0)
                && a.replica_weights.iter().sum::<f64>() > 0.0),
        "--replica-weights: one non-negative weight per replica (every --replicas value equal to their number)"
    );
    Ok(a)
}

/// What one (side, QPS) run measured.
struct Measured {
    side: String,
    replicas: usize,
    qps: f64,
    sent: usize,
    statuses: BTreeMap<String, usize>,
    ttft: Vec<f64>,
    itl: Vec<f64>,
    output_tokens: u64,
    window_s: f64,
    hit_rate: Option<f64>,
    waiting_mean: f64,
    in_flight_mean: f64,
    in_flight_max: u64,
    share: Vec<f64>,
    wall_s: f64,
    /// The filter's index against the servers: (predicted ÷ reported hit tokens, share of
    /// requests within tolerance).
    index: Option<(f64, f64)>,
}

/// The relay cluster of a configuration with `precise-prefix-cache-scorer`.
fn relay_cluster(config: &Value) -> Option<String> {
    let p = config["plugins"]
        .as_array()?
        .iter()
        .find(|p| p["type"] == "precise-prefix-cache-scorer")?;
    Some(
        p["parameters"]["relayCluster"]
            .as_str()
            .unwrap_or("kv-relay")
            .to_string(),
    )
}

/// The filter's cached-token feedback counters in gateway replica `r`: predicted and
/// reported hit tokens, confirmed, evicted and grown reports.
fn index_counters(sim: &Sim, r: usize) -> [f64; 5] {
    let text = sim.replica_prometheus(r);
    let v = |series: &str| host_sim::prometheus::value(&text, series).unwrap_or(0.0);
    let outcome = |o: &str| {
        v(&format!(
            "inference_extension_prefix_cache_feedback_total{{outcome=\"{o}\"}}"
        ))
    };
    [
        v("inference_extension_prefix_cache_predicted_hit_tokens_total{}"),
        v("inference_extension_prefix_cache_reported_hit_tokens_total{}"),
        outcome("confirmed"),
        outcome("evicted"),
        outcome("grown"),
    ]
}

fn side_label(side: &str) -> &str {
    if let Some(file) = side.strip_prefix("filter=") {
        return std::path::Path::new(file)
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or(file);
    }
    match side {
        "filter" => "filter (default profile)",
        "round_robin" => "Envoy ROUND_ROBIN",
        "least_request" => "Envoy LEAST_REQUEST",
        _ => "sglang cache_aware (model)",
    }
}

fn balancer(side: &str, seed: u64) -> Option<Box<dyn Balancer>> {
    match side {
        "round_robin" => Some(Box::new(RoundRobin::new(seed))),
        "least_request" => Some(Box::new(LeastRequest::new(seed))),
        "cache_aware" => Some(Box::new(CacheAware::new())),
        _ => None,
    }
}

/// Output tokens of a streamed response: the `usage` of its last chunk.
fn output_tokens(body: &[u8]) -> u64 {
    String::from_utf8_lossy(body)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v["usage"]["completion_tokens"].as_u64())
        .next_back()
        .unwrap_or(0)
}

fn run(a: &Args, side: &str, replicas: usize, qps: f64) -> anyhow::Result<Measured> {
    let wall = Instant::now();
    let eps: Vec<String> = (0..a.servers)
        .map(|i| format!("10.0.{}.{}:8000", i / 250, i % 250 + 1))
        .collect();
    let mut config = a.side_configs.get(side).unwrap_or(&a.filter_config).clone();
    if !config.is_object() {
        config = json!({});
    }
    config["pool"]["endpoints"] = json!(eps);
    let start: Nanos = 10 * MS;
    let measure_from = start + (a.warmup * SEC as f64) as Nanos;
    let end = measure_from + (a.seconds * SEC as f64) as Nanos;
    let relay = relay_cluster(&config);
    let mut cfg = SimConfig::new(&config.to_string())
        .workers(a.workers)
        .replicas(if a.cold_gateway { 2 } else { replicas })
        .seed(a.seed)
        .checks(a.check_invariants);
    if a.cold_gateway {
        // The second gateway starts (VMs within 0.5 ms) just before the measured window.
        cfg.replica_start = vec![0, measure_from.saturating_sub(MS)];
    }
    if let Some(w) = &a.wasm {
        cfg.wasm = w.clone();
    }
    // The filter scrapes through the `epp-metrics` cluster of envoy/bootstrap.yaml.in.
    cfg.clusters.push(Cluster {
        name: "epp-metrics".into(),
        dst_header: "x-envoy-original-dst-host".into(),
    });
    let mut sim = Sim::new(cfg)?;
    let servers: Vec<Rc<RefCell<VllmUpstream>>> = eps
        .iter()
        .enumerate()
        .map(|(i, e)| {
            VllmConfig::new(e)
                .profile("h100-llama-8b")
                .max_num_seqs(a.max_num_seqs)
                .kv_blocks(a.kv_blocks)
                .max_waiting(100_000)
                .seed(a.seed.wrapping_add(i as u64))
                .kv_events(relay.is_some())
                .build()
                .shared()
        })
        .collect();
    for (e, s) in eps.iter().zip(&servers) {
        sim.add_endpoint(e, Box::new(s.clone()));
    }
    if let Some(b) = balancer(side, a.seed) {
        sim.set_balancer(b);
    }
    if let Some(cluster) = &relay {
        sim.add_kv_relay(KvRelayConfig::new(cluster).lag(a.kv_event_lag));
    }
    let mut workload = Workload::new(a.spec.clone(), a.seed);
    let mut specs = Vec::new();
    let mut groups = Vec::new();
    let mut owners = Vec::new();
    for (i, at) in Arrivals::new(qps, a.seed).enumerate() {
        let t = start + at.as_nanos() as Nanos;
        if t >= end {
            break;
        }
        let r = workload.next_request(i as u64);
        groups.push(r.group);
        if a.trace.is_some() {
            owners.push(rendezvous_owners(&r.body, &eps));
        }
        let mut spec =
            RequestSpec::post("/v1/completions", r.body)
                .at(t)
                .label(if t >= measure_from {
                    "measure"
                } else {
                    "warmup"
                });
        let connection = if a.clients > 0 {
            i as u64 % a.clients
        } else {
            i as u64
        };
        if a.clients > 0 {
            spec = spec.on_connection(connection);
        }
        if !a.replica_weights.is_empty() {
            spec = spec.to_replica(weighted_replica(&a.replica_weights, a.seed, connection));
        }
        if a.cold_gateway {
            spec = spec.to_replica(usize::from(t >= measure_from));
        }
        specs.push(spec);
    }
    sim.add_requests(specs);

    let counters = |servers: &[Rc<RefCell<VllmUpstream>>]| {
        servers.iter().fold((0u64, 0u64), |(q, h), s| {
            let m = s.borrow().engine().metrics().clone();
            (q + m.prefix_cache_queries, h + m.prefix_cache_hits)
        })
    };
    let mut samples = a.trace.as_ref().map(|_| Vec::new());
    let mut weights = a.trace.as_ref().map(|_| Vec::new());
    run_sampled(&mut sim, measure_from, &servers, samples.as_mut())?;
    let before = counters(&servers);
    // The gateways the measured traffic goes through.
    let measured: Vec<usize> = if a.cold_gateway {
        vec![1]
    } else {
        (0..replicas).collect()
    };
    let index_sum = |sim: &Sim| {
        measured.iter().fold([0.0; 5], |mut acc, &r| {
            for (x, v) in acc.iter_mut().zip(index_counters(sim, r)) {
                *x += v;
            }
            acc
        })
    };
    let index_before = index_sum(&sim);
    let mut waiting = Vec::new();
    let mut in_flight = Vec::new();
    let mut t = measure_from;
    let mut step = 0u64;
    while t < end {
        t += 100 * MS;
        step += 1;
        run_sampled(&mut sim, t, &servers, samples.as_mut())?;
        in_flight.push(eps.iter().map(|e| sim.in_flight(e)).sum::<u64>());
        if let Some(w) = weights.as_mut().filter(|_| step.is_multiple_of(5)) {
            w.push((t, prior_weights(&sim, &eps)));
        }
        if step.is_multiple_of(5) {
            waiting.push(
                servers
                    .iter()
                    .map(|s| s.borrow().snapshot().waiting as f64)
                    .sum::<f64>(),
            );
        }
    }
    let answered = sim.run_until_answered(end + 600 * SEC)?;
    anyhow::ensure!(
        answered,
        "{side} at {qps} QPS, {replicas} replicas: requests still unanswered 600 s after the last arrival"
    );
    let after = counters(&servers);
    let index_after = index_sum(&sim);
    let d: Vec<f64> = index_after
        .iter()
        .zip(index_before)
        .map(|(a, b)| a - b)
        .collect();
    let judged = d[2] + d[3] + d[4];

    let mut r = Measured {
        side: side.to_string(),
        replicas,
        qps,
        sent: 0,
        statuses: BTreeMap::new(),
        ttft: Vec::new(),
        itl: Vec::new(),
        output_tokens: 0,
        window_s: 0.0,
        hit_rate: None,
        waiting_mean: waiting.iter().sum::<f64>() / waiting.len().max(1) as f64,
        in_flight_mean: in_flight.iter().sum::<u64>() as f64 / in_flight.len().max(1) as f64,
        in_flight_max: in_flight.iter().copied().max().unwrap_or(0),
        share: Vec::new(),
        wall_s: 0.0,
        index: (judged > 0.0).then(|| (d[0] / d[1].max(1.0), d[2] / judged)),
    };
    let ms = |n: Nanos| n as f64 / MS as f64;
    let mut per: BTreeMap<&str, usize> = BTreeMap::new();
    let mut last_finish = measure_from;
    for o in sim.outcomes().iter().filter(|o| o.label == "measure") {
        r.sent += 1;
        let key = match (o.fin, o.status) {
            (Final::Response, Some(s)) => s.to_string(),
            (f, _) => format!("{f:?}").to_lowercase(),
        };
        *r.statuses.entry(key).or_default() += 1;
        if let Some(e) = &o.endpoint {
            *per.entry(e.as_str()).or_default() += 1;
        }
        if o.fin != Final::Response || o.status != Some(200) {
            continue;
        }
        if let Some(t) = o.first_token_at {
            r.ttft.push(ms(t - o.sent_at));
        }
        r.itl.extend(o.data_at.windows(2).map(|w| ms(w[1] - w[0])));
        r.output_tokens += output_tokens(&o.body);
        last_finish = last_finish.max(o.finished_at.unwrap_or(0));
    }
    r.window_s = (last_finish - measure_from) as f64 / SEC as f64;
    if let Some(path) = &a.trace {
        let side_name = side.rsplit('/').next().unwrap_or(side);
        write_weights(
            &format!("{path}-{side_name}-{replicas}-{qps}-weights.csv"),
            weights.as_deref().unwrap_or_default(),
        )?;
        write_trace(
            &format!(
                "{path}-{}-{replicas}-{qps}.csv",
                side.rsplit('/').next().unwrap_or(side)
            ),
            &sim,
            &eps,
            &groups,
            &owners,
            samples.as_deref().unwrap_or_default(),
        )?;
    }
    let (q, h) = (after.0 - before.0, after.1 - before.1);
    r.hit_rate = (q > 0).then(|| h as f64 / q as f64);
    r.share = eps
        .iter()
        .map(|e| 100.0 * *per.get(e.as_str()).unwrap_or(&0) as f64 / r.sent.max(1) as f64)
        .collect();
    r.wall_s = wall.elapsed().as_secs_f64();
    Ok(r)
}

/// The rendezvous prior's weights the first replica's scraper last published, per server
/// (0..1; 1 when none published).
fn prior_weights(sim: &Sim, eps: &[String]) -> Vec<f64> {
    use epp_filter::datalayer::snapshot::{Snapshots, SNAPSHOTS_KEY};
    use epp_filter::prefix::rendezvous::FULL_WEIGHT;
    let snaps = sim.shared_data(SNAPSHOTS_KEY).and_then(Snapshots::decode);
    eps.iter()
        .map(|e| {
            let w = snaps
                .as_ref()
                .and_then(|s| s.get(epp_filter::endpoint::key(e)))
                .map_or(0, |s| s.prior_weight());
            if w == 0 {
                1.0
            } else {
                f64::from(w) / f64::from(FULL_WEIGHT)
            }
        })
        .collect()
}

/// `--trace`: the first replica's published prior weights every 0.5 s of the measured
/// window, one line each: the time (ms), then one weight per server.
fn write_weights(file: &str, weights: &[(Nanos, Vec<f64>)]) -> anyhow::Result<()> {
    let mut out = String::new();
    for (t, w) in weights {
        let w: Vec<String> = w.iter().map(|x| format!("{x:.4}")).collect();
        out += &format!("{},{}\n", t / MS, w.join(","));
    }
    std::fs::write(file, out)?;
    Ok(())
}

/// The servers' state at one moment of a traced run: per server (running, waiting, KV
/// usage 0..1).
struct Sample {
    at: Nanos,
    servers: Vec<(usize, usize, f64)>,
}

/// Runs `sim` to `to`; with `samples`, in 10 ms slices, recording the servers' state after
/// each (the simulation is event-driven: the slices change no outcome).
fn run_sampled(
    sim: &mut Sim,
    to: Nanos,
    servers: &[Rc<RefCell<VllmUpstream>>],
    samples: Option<&mut Vec<Sample>>,
) -> anyhow::Result<()> {
    let Some(samples) = samples else {
        return sim.run_until(to);
    };
    let slice = 10 * MS;
    let mut t = (sim.now() / slice + 1) * slice;
    while t <= to {
        sim.run_until(t)?;
        samples.push(Sample {
            at: t,
            servers: servers
                .iter()
                .map(|s| {
                    let snap = s.borrow().snapshot();
                    (snap.running, snap.waiting, snap.kv_usage)
                })
                .collect(),
        });
        t += slice;
    }
    sim.run_until(to)
}

/// The first and second rendezvous owners (indices into `eps`) of a request body's prompt,
/// as the filter's prior computes them: its own prompt hashing (the servers' 16-token
/// blocks, 4 characters a token) and its key of the first 8 blocks.
fn rendezvous_owners(body: &str, eps: &[String]) -> [Option<usize>; 2] {
    use epp_filter::prefix::{hash::hash_prompt, rendezvous};
    let body: Value = serde_json::from_str(body).unwrap_or_default();
    let prompt = body["prompt"].as_str().unwrap_or_default();
    let model = body["model"].as_str().unwrap_or_default();
    let hashes = hash_prompt(model, None, prompt.as_bytes(), 64, 256);
    rendezvous::key(8, &hashes).map_or([None; 2], |key| {
        rendezvous::owners::<2>(key, eps.iter().map(String::as_str))
    })
}

/// `--trace`: one line per request (the module docs list the columns).
fn write_trace(
    file: &str,
    sim: &Sim,
    eps: &[String],
    groups: &[u32],
    owners: &[[Option<usize>; 2]],
    samples: &[Sample],
) -> anyhow::Result<()> {
    use std::io::Write;
    let ms = |n: Nanos| n as f64 / MS as f64;
    let mut f = std::io::BufWriter::new(std::fs::File::create(file)?);
    let name = |i: Option<usize>| i.and_then(|i| eps.get(i)).map_or("-", String::as_str);
    for o in sim.outcomes() {
        let [first, second] = owners.get(o.id).copied().unwrap_or([None; 2]);
        let server = o
            .endpoint
            .as_deref()
            .and_then(|e| eps.iter().position(|x| x == e));
        // The servers' state at the last sample before the dispatch (or the send).
        let at = o.dispatched_at.unwrap_or(o.sent_at);
        let sample = samples
            .partition_point(|s| s.at <= at)
            .checked_sub(1)
            .and_then(|i| samples.get(i));
        let state = |i: Option<usize>| {
            sample
                .zip(i)
                .and_then(|(s, i)| s.servers.get(i))
                .copied()
                .unwrap_or((0, 0, 0.0))
        };
        let (own_run, own_wait, own_kv) = state(first);
        let (srv_run, srv_wait, _) = state(server);
        let mean_wait = sample.map_or(0.0, |s| {
            s.servers.iter().map(|x| x.1 as f64).sum::<f64>() / s.servers.len().max(1) as f64
        });
        writeln!(
            f,
            "{},{},{},{},{},{},{},{},{},{},{},{},{:.3},{},{},{:.2}",
            ms(o.sent_at),
            groups.get(o.id).copied().unwrap_or(0),
            o.replica,
            o.endpoint.as_deref().unwrap_or("-"),
            o.first_token_at.map_or(-1.0, |t| ms(t - o.sent_at)),
            o.dispatched_at.map_or(-1.0, |t| ms(t - o.sent_at)),
            cached_tokens(&o.body),
            u8::from(o.label == "measure"),
            name(first),
            name(second),
            own_run,
            own_wait,
            own_kv,
            srv_run,
            srv_wait,
            mean_wait,
        )?;
    }
    Ok(())
}

/// Prompt tokens the server reported cached (`usage.prompt_tokens_details.cached_tokens`
/// of the last chunk that has a `usage`; 0 when none).
fn cached_tokens(body: &[u8]) -> u64 {
    String::from_utf8_lossy(body)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v["usage"].is_object())
        .map(|v| {
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0)
        })
        .next_back()
        .unwrap_or(0)
}

/// With `--replica-weights`: the replica of connection `connection`, drawn in proportion
/// to the weights (a seeded hash, so every side sees the same spread).
fn weighted_replica(weights: &[f64], seed: u64, connection: u64) -> usize {
    let mut z = seed ^ connection.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let mut u = (z >> 11) as f64 / (1u64 << 53) as f64 * weights.iter().sum::<f64>();
    for (r, w) in weights.iter().enumerate() {
        if u < *w {
            return r;
        }
        u -= w;
    }
    weights.len() - 1
}

fn fmt3(s: &Option<Summary>, f: impl Fn(&Summary) -> Vec<f64>) -> String {
    s.as_ref().map_or("-".into(), |s| {
        f(s).iter()
            .map(|v| format!("{v:.0}"))
            .collect::<Vec<_>>()
            .join(" / ")
    })
}

fn main() -> anyhow::Result<()> {
    let a = parse_args()?;
    let s = &a.spec;
    let demand = u64::from(s.groups) * u64::from(s.system_prompt_len);
    let kv = a.kv_blocks as u64 * 16;
    println!(
        "{} servers (vllm-sim h100-llama-8b, max-num-seqs {}, {} KV tokens each), {} Envoy workers; \
         {} groups × {} prompts, system {} + question {} tokens, output {}{}; prefix demand \
         {demand} tokens = {:.1}× a server's KV, {:.0} % of the pool's; warm-up {} s, measured {} s per step; {}{}; seed {}",
        a.servers,
        a.max_num_seqs,
        kv,
        a.workers,
        s.groups,
        s.prompts_per_group,
        s.system_prompt_len,
        s.question_len,
        s.output_len,
        if s.zipf > 0.0 { format!(", groups Zipf({})", s.zipf) } else { String::new() },
        demand as f64 / kv as f64,
        100.0 * demand as f64 / (kv * a.servers as u64) as f64,
        a.warmup,
        a.seconds,
        if a.clients > 0 {
            format!("{} keep-alive client connections", a.clients)
        } else {
            "a new connection per request".to_string()
        },
        if a.replica_weights.is_empty() {
            String::new()
        } else {
            format!(", spread over the replicas in proportions {:?}", a.replica_weights)
        },
        a.seed
    );
    println!();
    println!("| replicas | QPS | side | TTFT p50 / p90 / p99 ms | ITL p50 / p90 ms | output tok/s | prefix hit rate | servers' waiting (mean) | in flight at servers (mean / max) | share per server % (min–max) | index: predicted ÷ reported hits, within tolerance | statuses | wall s |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut all = Vec::new();
    for (&replicas, &qps) in a
        .replicas
        .iter()
        .flat_map(|r| a.qps.iter().map(move |q| (r, q)))
    {
        for side in &a.sides {
            let r = run(&a, side, replicas, qps)?;
            let ttft = Summary::of(&r.ttft);
            let itl = Summary::of(&r.itl);
            let (lo, hi) = r
                .share
                .iter()
                .fold((f64::MAX, 0.0f64), |(l, h), v| (l.min(*v), h.max(*v)));
            println!(
                "| {} | {} | {} | {} | {} | {:.0} | {} | {:.1} | {:.1} / {} | {:.1}–{:.1} | {} | {:?} | {:.1} |",
                if a.cold_gateway {
                    "1 (cold)".to_string()
                } else {
                    r.replicas.to_string()
                },
                r.qps,
                if r.side == "filter" && a.filter_config.get("plugins").is_some() {
                    "filter (--filter-config)"
                } else {
                    side_label(&r.side)
                },
                fmt3(&ttft, |s| vec![s.p50, s.p90, s.p99]),
                itl.as_ref()
                    .map_or("-".into(), |s| format!("{:.1} / {:.1}", s.p50, s.p90)),
                r.output_tokens as f64 / r.window_s.max(1e-9),
                r.hit_rate
                    .map_or("-".into(), |h| format!("{:.1} %", 100.0 * h)),
                r.waiting_mean,
                r.in_flight_mean,
                r.in_flight_max,
                lo,
                hi,
                r.index.map_or("-".into(), |(ratio, ok)| format!(
                    "{ratio:.2}, {:.0} %",
                    100.0 * ok
                )),
                r.statuses,
                r.wall_s
            );
            all.push(json!({
                "replicas": r.replicas,
                "cold_gateway": a.cold_gateway,
                "qps": r.qps,
                "side": r.side,
                "sent": r.sent,
                "statuses": r.statuses,
                "ttft_ms": summary_json(&r.ttft),
                "itl_ms": summary_json(&r.itl),
                "output_tokens_per_s": r.output_tokens as f64 / r.window_s.max(1e-9),
                "prefix_hit_rate": r.hit_rate,
                "servers_waiting_mean": r.waiting_mean,
                "in_flight_mean": r.in_flight_mean,
                "in_flight_max": r.in_flight_max,
                "share_percent": r.share,
                "index_predicted_over_reported": r.index.map(|i| i.0),
                "index_within_tolerance": r.index.map(|i| i.1),
                "wall_s": r.wall_s,
            }));
        }
    }
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&all)?)?;
    }
    Ok(())
}
