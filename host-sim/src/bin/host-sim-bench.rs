//! Benchmark: 10,000 requests through a simulated 4-worker Envoy running the real filter
//! in front of 8 simulated model servers. Prints the wall time (not a test: nothing is
//! asserted beyond every request having an outcome).
//!
//! `cargo run --release -p host-sim --bin host-sim-bench [-- [--engine] [--rate=R] REQUESTS [SEED [PREEMPT]]]`
//! (PREEMPT: probability of suspending a VM inside a shared-data call, default 0;
//! `--engine`: the servers are `vllm-sim` engines with the `h100-llama-8b` profile and
//! `--max-num-seqs 256` (vLLM's default) instead of fixed-latency [`SimpleUpstream`]s;
//! `--rate=R`: Poisson arrivals per second, default 1,000).

use host_sim::world::clock::Rng;
use host_sim::world::upstream::Upstream;
use host_sim::{ms, Final, Nanos, Poisson, Sim, SimConfig, SimpleUpstream, VllmConfig};
use std::collections::BTreeMap;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let engine = all.iter().any(|a| a == "--engine");
    let rate: f64 = all
        .iter()
        .find_map(|a| a.strip_prefix("--rate="))
        .map_or(Ok(1000.0), str::parse)?;
    let mut args = all
        .into_iter()
        .filter(|a| a != "--engine" && !a.starts_with("--rate="));
    let requests: usize = args.next().map_or(Ok(10_000), |a| a.parse())?;
    let seed: u64 = args.next().map_or(Ok(1), |a| a.parse())?;
    let preempt: f64 = args.next().map_or(Ok(0.0), |a| a.parse())?;
    let eps: Vec<String> = (1..=8).map(|i| format!("10.0.0.{i}:8000")).collect();
    let config = serde_json::json!({"pool": {"endpoints": eps}}).to_string();
    let cfg = SimConfig::new(&config)
        .workers(4)
        .seed(seed)
        .preempt(preempt)
        // A throughput measurement: the per-event invariant checks are off.
        .checks(false);

    let t0 = Instant::now();
    let mut sim = Sim::new(cfg)?;
    let setup = t0.elapsed();
    for (i, e) in eps.iter().enumerate() {
        let server: Box<dyn Upstream> = if engine {
            Box::new(
                VllmConfig::new(e)
                    .profile("h100-llama-8b")
                    .max_num_seqs(256)
                    .seed(seed.wrapping_add(i as u64))
                    .build(),
            )
        } else {
            Box::new(
                SimpleUpstream::new(e)
                    .ttft(ms(20))
                    .itl(ms(5))
                    .max_running(64),
            )
        };
        sim.add_endpoint(e, server);
    }
    let mut w = Poisson::new(rate, requests, "sim-model");
    w.start = ms(10);
    w.tenants = vec![("a".into(), 2.0), ("b".into(), 1.0)];
    w.prefix_groups = 8;
    w.max_tokens = (8, 24);
    sim.add_requests(w.generate(&mut Rng::new(seed, 9)));
    let t1 = Instant::now();
    sim.run()?;
    let run = t1.elapsed();

    let mut status: BTreeMap<String, usize> = BTreeMap::new();
    let mut ttfts: Vec<Nanos> = Vec::new();
    let mut per_ep: BTreeMap<String, usize> = BTreeMap::new();
    for o in sim.outcomes() {
        let k = match o.fin {
            Final::Response => o.status.map_or("none".into(), |s| s.to_string()),
            f => format!("{f:?}"),
        };
        *status.entry(k).or_default() += 1;
        if let Some(e) = &o.endpoint {
            *per_ep.entry(e.clone()).or_default() += 1;
        }
        let streamed = o
            .header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream"));
        if let (true, Some(t)) = (streamed, o.first_token_at) {
            ttfts.push(t - o.sent_at);
        }
    }
    ttfts.sort_unstable();
    let pct = |p: usize| {
        ttfts
            .get(ttfts.len() * p / 100)
            .map_or(0.0, |t| *t as f64 / 1e6)
    };
    let (events, calls) = sim.counts();
    println!("requests        {requests} at {rate}/s");
    println!(
        "workers/servers 4 / 8 {}",
        if engine {
            "vllm-sim engines (h100-llama-8b, max-num-seqs 256)"
        } else {
            "simple (TTFT 20 ms, ITL 5 ms)"
        }
    );
    println!("virtual time    {:.2} s", sim.now() as f64 / 1e9);
    println!("events          {events}");
    println!("vm callbacks    {calls}");
    println!("outcomes        {status:?}");
    println!("per endpoint    {per_ep:?}");
    println!(
        "TTFT (streamed) p50 {:.1} ms, p99 {:.1} ms (at the client, virtual)",
        pct(50),
        pct(99)
    );
    println!("trace hash      {:016x}", sim.trace_hash());
    println!(
        "preemption      p={preempt}: {} suspensions, {} lost CAS races",
        sim.yields(),
        sim.cas_mismatches()
    );
    println!("setup (module)  {:.3} s", setup.as_secs_f64());
    println!("run wall time   {:.3} s", run.as_secs_f64());
    println!("total wall time {:.3} s", t0.elapsed().as_secs_f64());
    Ok(())
}
