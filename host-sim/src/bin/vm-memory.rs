//! The filter's memory over a long run: each worker VM's linear memory (a Wasm memory only
//! grows, so this is the most its heap ever needed) and Envoy's shared data, at rest and
//! after every `--every` requests, up to `--requests` (default 1,000,000).
//!
//! `cargo run --release -p host-sim --bin vm-memory -- [--requests N] [--every N]
//!  [--rate R] [--servers S] [--groups G] [--flow-control] [--wasm PATH]`
//!
//! 2 workers, `S` servers (default 4, fixed latency), the default profile (scraping on),
//! Poisson arrivals (default 2,000/s), half of them streamed, prompts from `G` shared
//! system prompts (default 64) with a unique question each, so the prefix index fills to
//! its bound and keeps evicting. A leak shows as memory that keeps growing once the index
//! is full; a bounded filter levels off. Not a test: it prints, and fails only when a
//! request gets no answer or another status than 200.

use host_sim::world::clock::Rng;
use host_sim::world::upstream::Upstream;
use host_sim::{ms, Final, Poisson, Sim, SimConfig, SimpleUpstream};
use std::time::Instant;

struct Args {
    requests: usize,
    every: usize,
    rate: f64,
    servers: usize,
    groups: usize,
    flow_control: bool,
    wasm: Option<String>,
}

fn parse() -> anyhow::Result<Args> {
    let mut a = Args {
        requests: 1_000_000,
        every: 100_000,
        rate: 2_000.0,
        servers: 4,
        groups: 64,
        flow_control: false,
        wasm: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| anyhow::anyhow!("{arg} needs a value"))
        };
        match arg.as_str() {
            "--requests" => a.requests = value()?.parse()?,
            "--every" => a.every = value()?.parse()?,
            "--rate" => a.rate = value()?.parse()?,
            "--servers" => a.servers = value()?.parse()?,
            "--groups" => a.groups = value()?.parse()?,
            "--flow-control" => a.flow_control = true,
            "--wasm" => a.wasm = Some(value()?),
            other => anyhow::bail!("unknown argument {other} (see the file's doc comment)"),
        }
    }
    anyhow::ensure!(
        a.every > 0 && a.rate > 0.0,
        "--every and --rate must be positive"
    );
    Ok(a)
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn report(sim: &mut Sim, done: usize, wall: f64) {
    let vms: Vec<String> = sim
        .vm_memory_bytes()
        .iter()
        .map(|b| format!("{:.2}", mib(*b)))
        .collect();
    let (keys, bytes) = sim.shared_data_footprint();
    println!(
        "| {done} | {} | {keys} | {:.2} | {:.0} |",
        vms.join(" / "),
        mib(bytes),
        wall
    );
}

fn main() -> anyhow::Result<()> {
    let a = parse()?;
    let servers: Vec<String> = (1..=a.servers)
        .map(|i| format!("10.0.0.{i}:8000"))
        .collect();
    let mut config = serde_json::json!({"pool": {"endpoints": servers}});
    if a.flow_control {
        config["featureGates"] = serde_json::json!(["flowControl"]);
    }
    let mut cfg = SimConfig::new(&config.to_string())
        .workers(2)
        .seed(1)
        .checks(false);
    if let Some(w) = &a.wasm {
        cfg.wasm = w.into();
    }
    let mut sim = Sim::new(cfg)?;
    for s in &servers {
        let server: Box<dyn Upstream> = Box::new(
            SimpleUpstream::new(s)
                .ttft(ms(5))
                .itl(ms(1))
                .max_running(100_000),
        );
        sim.add_endpoint(s, server);
    }
    let t0 = Instant::now();
    // At rest: configured, the first scrapes and ticks done, no request yet.
    sim.run_until(ms(500))?;
    println!(
        "{} requests at {}/s, 2 workers, {} servers, {} prompt groups{}",
        a.requests,
        a.rate,
        a.servers,
        a.groups,
        if a.flow_control { ", flow control" } else { "" }
    );
    println!();
    println!("| requests answered | VM linear memory MiB (each) | shared-data keys | shared data MiB | wall s |");
    println!("|---|---|---|---|---|");
    report(&mut sim, 0, t0.elapsed().as_secs_f64());
    let mut rng = Rng::new(1, 17);
    let mut done = 0;
    let mut checked = 0;
    while done < a.requests {
        let n = a.every.min(a.requests - done);
        let mut w = Poisson::new(a.rate, n, "sim-model");
        w.start = sim.now() + ms(1);
        w.prefix_groups = a.groups;
        w.prefix_words = 200;
        w.suffix_words = 20;
        w.stream_fraction = 0.5;
        w.max_tokens = (4, 16);
        w.tenants = vec![("a".into(), 2.0), ("b".into(), 1.0)];
        sim.add_requests(w.generate(&mut rng));
        anyhow::ensure!(
            sim.run_until_answered(sim.now() + ms(1_000) + (n as f64 / a.rate * 2e9) as u64)?,
            "requests left unanswered after {done}"
        );
        done += n;
        for o in sim.outcomes().get(checked..).unwrap_or_default() {
            anyhow::ensure!(
                o.fin == Final::Response && o.status == Some(200),
                "a request ended {:?} with status {:?}",
                o.fin,
                o.status
            );
        }
        checked = sim.outcomes().len();
        report(&mut sim, done, t0.elapsed().as_secs_f64());
    }
    Ok(())
}
