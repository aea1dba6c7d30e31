//! What one request costs at the VM boundary: every host call the filter makes and every
//! callback Envoy makes into it, per request, with the bytes copied into the VM —
//! deterministic (virtual time, the real release `.wasm`), so a change that adds a host
//! call shows as a number, not as noise.
//!
//! `[HOST_SIM_FUEL=1] cargo run --release -p host-sim --bin host-calls -- [--flow-control] [--stream]
//!  [--tokens N] [--prompt-kib K] [--queued Q] [--requests N] [--rate R] [--fields]
//!  [--config JSON] [--wasm PATH] [--endpoints N] [--prefix-scorer approx|text:MODEL_DIR]
//!  [--chat] [--failing STATUS]` (`--endpoints`: servers in the pool, default 2; `--fields`: the size of the
//!  shared records mid-run, by field; `--wasm`: another build of the filter, e.g. to compare
//!  before and after a change; `--prefix-scorer`: a profile of that scorer and
//!  `max-score-picker` — `text:DIR` is `precise-prefix-cache-scorer` with `tokenizer: relay`
//!  and host-sim's relay publishing text keys of the model in DIR, every server known to it
//!  and holding none of the prompts; `--chat`: chat requests, one user message; `--failing`:
//!  every server answers STATUS, e.g. 503, so passive health ejects them all and each
//!  pick runs the every-endpoint-failing path)
//!
//! Two runs of the same length in the same simulated Envoy (2 workers, 2 servers, metrics
//! scraped every 50 ms): one with N requests at R per second (default 500), one with none; the
//! difference divided by N is what a request costs (ticks, scrapes and lease renewals
//! cancel out). `--queued Q` first parks Q requests behind a full pool (flow control,
//! `maxConcurrency` 1 per server, long responses) so the per-request shared-data bytes
//! show how the flow-control record grows with the backlog. With `HOST_SIM_FUEL=1` each
//! callback's row also gives the wasm instructions the module ran in it, per request, and
//! a last table splits them by stretch between host calls (e.g. the instructions between
//! the ledger's read and its write are the pick).

use host_sim::world::upstream::Upstream;
use host_sim::{ms, RequestSpec, Sim, SimConfig, SimpleUpstream, SEC};
use serde_json::{json, Value};
use std::collections::BTreeMap;

struct Args {
    flow_control: bool,
    stream: bool,
    tokens: u32,
    prompt_kib: usize,
    endpoints: usize,
    queued: usize,
    requests: usize,
    rate: f64,
    fields: bool,
    wasm: Option<String>,
    config: Option<Value>,
    /// `--prefix-scorer`: `None` (the configuration's), `Some(None)` approx, `Some(Some(dir))`
    /// text keys.
    prefix_scorer: Option<Option<String>>,
    chat: bool,
    /// `--failing`: the status every server answers with.
    failing: Option<u16>,
}

fn parse() -> anyhow::Result<Args> {
    let mut a = Args {
        flow_control: false,
        stream: false,
        tokens: 16,
        prompt_kib: 0,
        endpoints: 2,
        queued: 0,
        requests: 500,
        rate: 500.0,
        fields: false,
        wasm: None,
        config: None,
        prefix_scorer: None,
        chat: false,
        failing: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| anyhow::anyhow!("{arg} needs a value"))
        };
        match arg.as_str() {
            "--flow-control" => a.flow_control = true,
            "--stream" => a.stream = true,
            "--tokens" => a.tokens = value()?.parse()?,
            "--prompt-kib" => a.prompt_kib = value()?.parse()?,
            "--endpoints" => a.endpoints = value()?.parse()?,
            "--queued" => a.queued = value()?.parse()?,
            "--requests" => a.requests = value()?.parse()?,
            "--rate" => a.rate = value()?.parse()?,
            "--fields" => a.fields = true,
            "--wasm" => a.wasm = Some(value()?),
            "--config" => a.config = Some(serde_json::from_str(&value()?)?),
            "--chat" => a.chat = true,
            "--failing" => a.failing = Some(value()?.parse()?),
            "--prefix-scorer" => {
                let v = value()?;
                a.prefix_scorer = Some(match v.strip_prefix("text:") {
                    Some(dir) => Some(dir.to_string()),
                    None if v == "approx" => None,
                    None => anyhow::bail!("--prefix-scorer: approx or text:MODEL_DIR, got {v}"),
                });
            }
            other => anyhow::bail!("unknown argument {other} (see the file's doc comment)"),
        }
    }
    if a.queued > 0 {
        a.flow_control = true;
    }
    Ok(a)
}

/// The pool's servers: `10.0.x.y:8000`.
fn servers(a: &Args) -> Vec<String> {
    (0..a.endpoints.max(1))
        .map(|i| format!("10.0.{}.{}:8000", i / 250, i % 250 + 1))
        .collect()
}

fn config(a: &Args) -> Value {
    let mut c = a.config.clone().unwrap_or_else(|| json!({}));
    c["pool"]["endpoints"] = json!(servers(a));
    if let Some(scorer) = &a.prefix_scorer {
        let scorer = match scorer {
            None => json!({"type": "prefix-cache-scorer"}),
            Some(_) => json!({"type": "precise-prefix-cache-scorer",
                "parameters": {"relayCluster": "kv-relay", "tokenizer": "relay"}}),
        };
        let name = scorer["type"].clone();
        c["plugins"] = json!([scorer, {"type": "max-score-picker"}]);
        c["schedulingProfiles"] = json!([{"name": "default", "plugins": [
            {"pluginRef": name}, {"pluginRef": "max-score-picker"}]}]);
    }
    if a.flow_control {
        c["featureGates"] = json!(["flowControl"]);
        if a.queued > 0 {
            // One slot per server: the backlog waits behind two long requests.
            c["plugins"] = json!([{"type": "concurrency-detector",
                "parameters": {"maxConcurrency": 1, "concurrencyMode": "requests"}}]);
            c["saturationDetector"] = json!({"pluginRef": "concurrency-detector"});
        }
    }
    c
}

/// By name: calls, bytes, wasm instructions (fuel; 0 unless `HOST_SIM_FUEL=1`).
type Counts = BTreeMap<String, (u64, u64, u64)>;

/// Counts after `requests` measured requests (and the backlog), run to `end`: by call
/// name, and by shared-data operation and key.
fn run(a: &Args, requests: usize, end: u64) -> anyhow::Result<(Counts, Counts, Counts)> {
    let mut cfg = SimConfig::new(&config(a).to_string()).workers(2).seed(7);
    cfg.check_invariants = false;
    if let Some(w) = &a.wasm {
        cfg.wasm = w.into();
    }
    cfg.clusters.push(host_sim::host::vm::Cluster {
        name: "epp-metrics".into(),
        dst_header: "x-envoy-original-dst-host".into(),
    });
    let mut sim = Sim::new(cfg)?;
    if let Some(Some(dir)) = &a.prefix_scorer {
        let model = kv_relay::model::Model::load(std::path::Path::new(dir), None)
            .map_err(|e| anyhow::anyhow!("--prefix-scorer: {e}"))?;
        let text = kv_relay::state::TextKeys {
            model: std::sync::Arc::new(model),
            block: 64,
        };
        sim.add_kv_relay(host_sim::world::kv_relay::KvRelayConfig::new("kv-relay").text(text));
        for s in &servers(a) {
            sim.register_kv_relay_server(s, "sim-model");
        }
    }
    for s in &servers(a) {
        let mut server = SimpleUpstream::new(s)
            .ttft(ms(2))
            .itl(ms(1))
            .max_running(1_000_000);
        if let Some(status) = a.failing {
            server = server.failing(status);
        }
        let server: Box<dyn Upstream> = Box::new(server);
        sim.add_endpoint(s, server);
    }
    let prompt = "lorem ipsum ".repeat(a.prompt_kib * 1024 / 12 + 1);
    let mut specs = Vec::new();
    // The backlog: two long requests take both slots, the rest wait behind them.
    for i in 0..a.queued {
        let tokens = if i < 2 { 100_000 } else { 1 };
        specs.push(RequestSpec::completion("sim-model", "backlog", tokens, false).at(ms(200)));
    }
    let start = ms(500);
    for i in 0..requests {
        let text = format!("{i} {prompt}");
        let spec = if a.chat {
            let body = json!({"model": "sim-model", "max_tokens": a.tokens, "stream": a.stream,
                "messages": [{"role": "user", "content": text}]});
            RequestSpec::post("/v1/chat/completions", body.to_string())
        } else {
            RequestSpec::completion("sim-model", &text, a.tokens, a.stream)
        };
        specs.push(spec.at(start + gap(a) * i as u64));
    }
    sim.add_requests(specs);
    let mid = ms(500) + gap(a) * requests as u64 / 2;
    sim.run_until(mid)?;
    if a.fields {
        // The in-flight ledger is flat, not protobuf (`Ledger::decode`).
        for key in ["epp.v1.flow-control"] {
            if let Some(b) = sim.shared_data(key) {
                println!(
                    "{key} mid-run: {} bytes; by field (tag: count, bytes): {:?}",
                    b.len(),
                    fields(&b)
                );
            }
        }
    }
    sim.run_until(end)?;
    let counts = sim.host_calls();
    let by_name = counts
        .by_name
        .into_iter()
        .map(|(n, c)| (n.to_string(), (c.calls, c.bytes, c.fuel)))
        .collect();
    let by_key = counts
        .shared_keys
        .into_iter()
        .map(|((op, key), c)| (format!("{op} {key}"), (c.calls, c.bytes, 0)))
        .collect();
    let by_stretch = counts
        .stretches
        .into_iter()
        .map(|((cb, from, to), c)| {
            let cb = cb.trim_start_matches("proxy_on_");
            let short = |p: &str| p.trim_start_matches("proxy_").to_string();
            (
                format!("{cb}: {} -> {}", short(from), short(to)),
                (c.calls, 0, c.fuel),
            )
        })
        .collect();
    Ok((by_name, by_key, by_stretch))
}

/// Prints `with − without`, per request; returns the total calls of the rows matching
/// `callback` and of the others, and the wasm instructions of the callbacks.
fn table(with: &Counts, without: &Counts, n: f64, heading: &str) -> (f64, f64, f64) {
    let fuel_on = host_sim::host::module::counting_fuel();
    let fuel_heading = if fuel_on { "instructions" } else { "" };
    println!(
        "{heading:<40} {:>10} {:>14} {fuel_heading:>14}",
        "calls", "bytes"
    );
    let (mut others, mut callbacks, mut instructions) = (0.0, 0.0, 0.0);
    for (name, (calls, bytes, fuel)) in with {
        let (c0, b0, f0) = without.get(name).copied().unwrap_or((0, 0, 0));
        let calls = calls.saturating_sub(c0) as f64 / n;
        let bytes = bytes.saturating_sub(b0) as f64 / n;
        let fuel = fuel.saturating_sub(f0) as f64 / n;
        if calls < 0.005 && bytes < 0.5 && fuel < 0.5 {
            continue;
        }
        if name.starts_with("proxy_on_") {
            callbacks += calls;
            instructions += fuel;
        } else {
            others += calls;
        }
        if fuel_on && name.starts_with("proxy_on_") {
            println!("{name:<40} {calls:>10.2} {bytes:>14.0} {fuel:>14.0}");
        } else {
            println!("{name:<40} {calls:>10.2} {bytes:>14.0}");
        }
    }
    (others, callbacks, instructions)
}

/// The wasm instructions between two points of a callback (its start, each host call, its
/// end), per request, most first: where the module's own work is.
fn stretches(with: &Counts, without: &Counts, n: f64) {
    let mut rows: Vec<(f64, f64, &str)> = with
        .iter()
        .map(|(name, (calls, _, fuel))| {
            let (c0, _, f0) = without.get(name).copied().unwrap_or((0, 0, 0));
            let calls = calls.saturating_sub(c0) as f64 / n;
            let fuel = fuel.saturating_sub(f0) as f64 / n;
            (fuel, calls, name.as_str())
        })
        .filter(|(fuel, _, _)| *fuel >= 50.0)
        .collect();
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!(
        "{:<72} {:>10} {:>14}",
        "wasm instructions between host calls (callback: from -> to)", "times", "instructions"
    );
    for (fuel, calls, name) in rows {
        println!("{name:<72} {calls:>10.2} {fuel:>14.0}");
    }
}

/// A protobuf record's top-level fields: per tag, how many and how many bytes.
fn fields(bytes: &[u8]) -> BTreeMap<u64, (u64, usize)> {
    fn varint(b: &[u8], i: &mut usize) -> u64 {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(byte) = b.get(*i) else { break };
            *i += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
        }
        v
    }
    let mut out = BTreeMap::new();
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        let key = varint(bytes, &mut i);
        match key & 7 {
            0 => {
                varint(bytes, &mut i);
            }
            1 => i += 8,
            2 => {
                let n = varint(bytes, &mut i) as usize;
                i += n;
            }
            5 => i += 4,
            _ => break,
        }
        let e = out.entry(key >> 3).or_insert((0, 0));
        e.0 += 1;
        e.1 += i - start;
    }
    out
}

/// Time between two measured requests.
fn gap(a: &Args) -> u64 {
    (SEC as f64 / a.rate.max(0.001)) as u64
}

fn main() -> anyhow::Result<()> {
    let a = parse()?;
    let end = ms(500) + gap(&a) * a.requests as u64 + 2 * SEC;
    let with = run(&a, a.requests, end)?;
    let without = run(&a, 0, end)?;
    let n = a.requests as f64;
    println!(
        "per request ({} requests at {}/s{}{}{}, {} output tokens, prompt ~{} KiB):",
        a.requests,
        a.rate,
        if a.flow_control { ", flow control" } else { "" },
        if a.stream { ", streamed" } else { "" },
        if a.queued > 0 {
            format!(", {} queued", a.queued)
        } else {
            String::new()
        },
        a.tokens,
        a.prompt_kib
    );
    let (host, callbacks, instructions) =
        table(&with.0, &without.0, n, "call (bytes: copied into the VM)");
    println!("{:<40} {host:>10.2}", "= host calls");
    println!("{:<40} {callbacks:>10.2}", "= callbacks (VM entries)");
    if host_sim::host::module::counting_fuel() {
        println!(
            "{:<40} {instructions:>10.0}",
            "= wasm instructions in callbacks"
        );
    }
    println!();
    table(
        &with.1,
        &without.1,
        n,
        "shared data (bytes: read or written)",
    );
    if host_sim::host::module::counting_fuel() {
        println!();
        stretches(&with.2, &without.2, n);
    }
    Ok(())
}
