//! How evenly the rendezvous prior spreads prefix groups over servers, against chance.
//!
//! For quality-sim's workload (the same seeded prompts, the same server addresses), the
//! filter's own code keys each group (`epp_filter::prefix::rendezvous::key` of the
//! prompt's block hashes) and finds its owner, the first choice of its rendezvous order.
//! Printed: the groups each server owns and the share of the workload's requests that
//! lands on it if every request went to its group's owner, beside "balls into bins"
//! (the same number of groups thrown uniformly at random, 20,000 times: the mean of the
//! fullest and emptiest server). Then a check of the hash's mixing over 160,000 random
//! keys: first choices per server, and first × second choice pairs (a χ² each, against
//! uniform).
//!
//! `cargo run --release -p tests --features virtual --bin rendezvous-spread -- [--servers
//! 16] [--groups 128] [--zipf 0] [--seed 1]`

use epp_filter::prefix::hash::hash_prompt;
use epp_filter::prefix::rendezvous;
use epp_filter::rng::Rng;
use serde_json::Value;
use tests::loadgen::workload::{Spec, Workload};

fn main() -> anyhow::Result<()> {
    let (mut servers, mut groups, mut zipf, mut seed) = (16usize, 128u32, 0.0f64, 1u64);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it
            .next()
            .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))?;
        match flag.as_str() {
            "--servers" => servers = v.parse()?,
            "--groups" => groups = v.parse()?,
            "--zipf" => zipf = v.parse()?,
            "--seed" => seed = v.parse()?,
            _ => anyhow::bail!("unknown flag {flag}"),
        }
    }
    // quality-sim's addresses and workload.
    let eps: Vec<String> = (0..servers)
        .map(|i| format!("10.0.{}.{}:8000", i / 250, i % 250 + 1))
        .collect();
    let spec = Spec {
        groups,
        prompts_per_group: 16,
        system_prompt_len: 1024,
        question_len: 128,
        output_len: 64,
        zipf,
        ..Spec::default()
    };
    let mut workload = Workload::new(spec, seed);
    // The requests of a 30 s quality-sim step at 32 QPS, about.
    let n = 960u64;
    let mut owner_of = vec![None; groups as usize];
    let mut requests = vec![0u64; servers];
    for i in 0..n {
        let r = workload.next_request(i);
        let body: Value = serde_json::from_str(&r.body)?;
        let prompt = body["prompt"].as_str().unwrap_or_default();
        let model = body["model"].as_str().unwrap_or_default();
        // vllm-sim's 16-token blocks, 4 characters a token; the prior's 8 leading blocks.
        let hashes = hash_prompt(model, None, prompt.as_bytes(), 64, 256);
        let key = rendezvous::key(8, &hashes).ok_or_else(|| anyhow::anyhow!("no blocks"))?;
        let owner = rendezvous::owner(key, eps.iter().map(String::as_str)).unwrap_or(0);
        owner_of[r.group as usize] = Some(owner);
        requests[owner] += 1;
    }
    let mut owned = vec![0u32; servers];
    for o in owner_of.iter().flatten() {
        owned[*o] += 1;
    }
    let seen = owner_of.iter().flatten().count();
    println!("{servers} servers, {seen} of {groups} groups seen in {n} requests (Zipf {zipf}, seed {seed})");
    println!("groups owned per server: {owned:?}");
    let pct: Vec<String> = requests
        .iter()
        .map(|&r| format!("{:.1}", 100.0 * r as f64 / n as f64))
        .collect();
    println!(
        "requests per server if all went to the owner, %: {}",
        pct.join(" ")
    );
    let (max, min) = (owned.iter().max(), owned.iter().min());
    println!("fullest / emptiest: {max:?} / {min:?} groups");
    // Balls into bins: the same number of groups at random.
    let mut rng = Rng::new(seed);
    let trials = 20_000;
    let (mut sum_max, mut sum_min, mut at_least) = (0u64, 0u64, 0u64);
    let observed = max.copied().unwrap_or(0);
    for _ in 0..trials {
        let mut bins = vec![0u32; servers];
        for _ in 0..seen {
            bins[rng.below(servers)] += 1;
        }
        let hi = bins.iter().copied().max().unwrap_or(0);
        sum_max += u64::from(hi);
        sum_min += u64::from(bins.iter().copied().min().unwrap_or(0));
        at_least += u64::from(hi >= observed);
    }
    println!(
        "balls into bins ({trials} throws of {seen} groups): fullest {:.1}, emptiest {:.1} on average; a fullest of {observed} or more in {:.0} % of throws",
        sum_max as f64 / trials as f64,
        sum_min as f64 / trials as f64,
        100.0 * at_least as f64 / trials as f64
    );
    // The hash's mixing: first choices, and first × second choice pairs, over random keys.
    let keys = 160_000usize;
    let mut first = vec![0u64; servers];
    let mut pairs = vec![0u64; servers * servers];
    for _ in 0..keys {
        let key = rng.next_u64();
        let [a, b] = rendezvous::owners::<2>(key, eps.iter().map(String::as_str));
        if let (Some(a), Some(b)) = (a, b) {
            first[a] += 1;
            pairs[a * servers + b] += 1;
        }
    }
    let chi2 = |counts: &[u64], cells: usize| {
        let e = keys as f64 / cells as f64;
        counts
            .iter()
            .map(|&c| (c as f64 - e).powi(2) / e)
            .sum::<f64>()
    };
    let ordered = servers * (servers - 1);
    let pair_counts: Vec<u64> = (0..servers * servers)
        .filter(|i| i / servers != i % servers)
        .map(|i| pairs[i])
        .collect();
    println!(
        "mixing over {keys} random keys: first choice χ² {:.1} ({} degrees of freedom), first × second χ² {:.1} ({} degrees of freedom)",
        chi2(&first, servers),
        servers - 1,
        chi2(&pair_counts, ordered),
        ordered - 1
    );
    Ok(())
}
