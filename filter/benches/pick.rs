//! The cost of one pick, natively: the default profile (queue 2, kv-cache 2, prefix 3,
//! max-score picker) over 8, 64 and 512 endpoints with a warm prefix index.
//!
//! * `schedule/N` — hashing the prompt, matching it against the index, scoring, picking.
//! * `pick_with_ledger/N` — the same inside the cross-worker in-flight ledger's CAS
//!   update (what the proxy does per request), on the in-memory store.
//! * `schedule_cold/{prior,no_prior}/N` — a prompt whose system prompt no endpoint holds,
//!   with the rendezvous prior (the default) and without (`rendezvousPrior: false`): what
//!   the prior costs when it applies (one hash per candidate).
//! * `schedule_replicas/{default,home_filter}/{others,alone}/N` — the warm prompt of
//!   `schedule/N` with the servers reporting other gateway replicas' requests (`others`)
//!   or only this gateway's (`alone`): the default profile, and
//!   `envoy/config/rendezvous-home-growing.json` (`rendezvous-home-filter`: its
//!   `otherGatewayShare` pass reads every candidate's report, then with others the home,
//!   a hash per candidate and a sort; alone, the utilization filter).
//!
//! Run: `cargo bench -p filter --bench pick`.

// A benchmark, not the data path: panicking on a broken setup is what we want.
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]

use criterion::measurement::WallTime;
use criterion::{
    black_box, criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion,
};
use epp_filter::inflight;
use epp_filter::prefix::index::PrefixIndex;
use epp_filter::rng::Rng;
use epp_filter::scheduler::{Candidate, Metrics, Probe, Request, Scheduler};
use epp_filter::shared_store::MemoryStore;

fn setup(n: usize) -> (Scheduler, Vec<Candidate>, PrefixIndex, String) {
    let scheduler = epp_filter::runtime::load("")
        .expect("default config")
        .scheduler;
    let mut rng = Rng::new(42);
    let candidates: Vec<Candidate> = (0..n)
        .map(|i| Candidate {
            address: format!("10.{}.{}.{}:8000", i / 65536, (i / 256) % 256, i % 256),
            metrics: Metrics {
                waiting: rng.below(8) as u64,
                running: rng.below(32) as u64,
                kv_usage: rng.next_f64(),
                updated_ms: Some(0),
                ..Metrics::default()
            },
            ..Candidate::default()
        })
        .collect();
    // Warm index: 2,000 conversations of ~2 KB (32 blocks) spread over the endpoints,
    // 20 system prompts shared between them.
    let mut index = PrefixIndex::new();
    let block_chars = 64;
    for k in 0..2000 {
        let prompt = format!(
            "{}{}",
            format!("system prompt {} ", k % 20).repeat(40),
            format!("user turn {k} ").repeat(60)
        );
        let hashes =
            epp_filter::prefix::hash::hash_prompt("m", None, prompt.as_bytes(), block_chars, 256);
        let ep = &candidates[rng.below(n)].address;
        index.insert(ep, &hashes, 31_250);
    }
    let request = format!(
        "{}{}",
        "system prompt 7 ".repeat(40),
        "a new question about something else ".repeat(30)
    );
    (scheduler, candidates, index, request)
}

/// Benchmarks one scheduling decision (a new tie-break seed each time) as `id`.
fn schedule(
    group: &mut BenchmarkGroup<'_, WallTime>,
    id: BenchmarkId,
    scheduler: &Scheduler,
    request: &Request,
    candidates: &[Candidate],
    index: &PrefixIndex,
) {
    let mut seed = 0u64;
    group.bench_function(id, |b| {
        b.iter(|| {
            seed += 1;
            let d = scheduler.schedule(
                black_box(request),
                black_box(candidates),
                index,
                &mut Rng::new(seed),
                &mut Probe::new(None),
            );
            black_box(d.ok())
        })
    });
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("schedule");
    for n in [8usize, 64, 512] {
        let (scheduler, candidates, index, prompt) = setup(n);
        let request = Request {
            model: "m",
            prompt: &prompt,
            body_bytes: prompt.len() + 40,
            ..Request::default()
        };
        schedule(
            &mut group,
            BenchmarkId::from_parameter(n),
            &scheduler,
            &request,
            &candidates,
            &index,
        );
    }
    group.finish();
    let mut group = c.benchmark_group("schedule_cold");
    let no_prior = r#"{"plugins": [
        {"type": "approx-prefix-cache-producer", "parameters": {"rendezvousPrior": false}},
        {"type": "utilization-detector"}, {"type": "queue-scorer"},
        {"type": "kv-cache-utilization-scorer"}, {"type": "prefix-cache-scorer"}],
      "schedulingProfiles": [{"name": "default", "plugins": [
        {"pluginRef": "utilization-detector"}, {"pluginRef": "queue-scorer", "weight": 2},
        {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
        {"pluginRef": "prefix-cache-scorer", "weight": 3}]}]}"#;
    for (name, config) in [("prior", ""), ("no_prior", no_prior)] {
        for n in [8usize, 64, 512] {
            let (_, candidates, index, _) = setup(n);
            let scheduler = epp_filter::runtime::load(config).expect("config").scheduler;
            let prompt = format!(
                "{}{}",
                "a system prompt nobody has sent yet ".repeat(20),
                "a new question about something else ".repeat(30)
            );
            let request = Request {
                model: "m",
                prompt: &prompt,
                body_bytes: prompt.len() + 40,
                ..Request::default()
            };
            let id = BenchmarkId::new(name, n);
            schedule(&mut group, id, &scheduler, &request, &candidates, &index);
        }
    }
    group.finish();
    // Several gateway replicas: a warm prompt (`schedule/N`'s) with the servers reporting
    // requests of other replicas (`others`) or only this gateway's (`alone`).
    let mut group = c.benchmark_group("schedule_replicas");
    let configs = [
        ("default", ""),
        (
            "home_filter",
            include_str!("../../envoy/config/rendezvous-home-growing.json"),
        ),
    ];
    for (name, config) in configs {
        let scheduler = epp_filter::runtime::load(config).expect("config").scheduler;
        for (view, own) in [("others", false), ("alone", true)] {
            if name == "default" && own {
                continue;
            }
            for n in [8usize, 64, 512] {
                let (_, mut candidates, index, prompt) = setup(n);
                for c in &mut candidates {
                    let reported = c.metrics.running + c.metrics.waiting;
                    c.metrics.gateway_in_flight = if own { reported } else { 0 };
                }
                let request = Request {
                    model: "m",
                    prompt: &prompt,
                    body_bytes: prompt.len() + 40,
                    ..Request::default()
                };
                let id = BenchmarkId::new(format!("{name}/{view}"), n);
                schedule(&mut group, id, &scheduler, &request, &candidates, &index);
            }
        }
    }
    group.finish();
    let mut group = c.benchmark_group("pick_with_ledger");
    for n in [8usize, 64, 512] {
        let (scheduler, mut candidates, index, prompt) = setup(n);
        let request = Request {
            model: "m",
            prompt: &prompt,
            body_bytes: prompt.len() + 40,
            ..Request::default()
        };
        let store = MemoryStore::default();
        let mut seed = 0u64;
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                seed += 1;
                let picked = inflight::acquire_with(&store, 1, 0, |ledger| {
                    let loads = ledger.loads();
                    for c in candidates.iter_mut() {
                        let l = loads.get(c.key()).copied().unwrap_or_default();
                        c.in_flight = l.requests;
                        c.in_flight_tokens = l.tokens;
                    }
                    let d = scheduler.schedule(
                        &request,
                        &candidates,
                        &index,
                        &mut Rng::new(seed),
                        &mut Probe::new(None),
                    );
                    let pick = d
                        .ok()
                        .and_then(|d| d.primary())
                        .map(|i| (candidates[i].address.clone(), 100));
                    let counted = pick
                        .clone()
                        .map(|(ep, t)| inflight::Counted::new(inflight::endpoint_key(&ep), t));
                    (counted, pick)
                })
                .expect("ledger");
                // Release at once so the ledger stays at its steady-state size.
                if let Some((ep, t)) = picked {
                    inflight::release(&store, 1, &ep, t, 0, None).expect("release");
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
