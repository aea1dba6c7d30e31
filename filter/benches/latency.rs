//! The latency predictor's cost, natively:
//!
//! * `estimate/N` — features, TTFT and TPOT predictions and headroom for one request
//!   over N endpoints (what every pick with a latency producer adds);
//! * `train/256` — one training tick's worth of samples (the trainer's worst case per
//!   tick, without the shared-data read and write).
//!
//! Run: `cargo bench -p filter --bench latency`.

// A benchmark, not the data path: panicking on a broken setup is what we want.
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use epp_filter::latency::features::N;
use epp_filter::latency::predictor::Predictor;
use epp_filter::latency::{self, Model, Sample, Settings, Slo, View};
use epp_filter::rng::Rng;
use epp_filter::scheduler::{Candidate, Metrics};
use std::rc::Rc;

fn candidates(n: usize, rng: &mut Rng) -> Vec<Candidate> {
    (0..n)
        .map(|i| Candidate {
            address: format!("10.{}.{}.{}:8000", i / 65536, (i / 256) % 256, i % 256),
            metrics: Metrics {
                waiting: rng.below(8) as u64,
                running: rng.below(32) as u64,
                kv_usage: rng.next_f64(),
                updated_ms: Some(0),
                ..Metrics::default()
            },
            in_flight: rng.below(40) as u64,
            in_flight_tokens: rng.below(40_000) as u64,
            ..Candidate::default()
        })
        .collect()
}

fn samples(cands: &[Candidate], n: usize, rng: &mut Rng) -> Vec<Sample> {
    (0..n)
        .map(|_| {
            let c = &cands[rng.below(cands.len())];
            let x = latency::features::of(200 + rng.below(2000) as u64, rng.next_f64(), c);
            Sample {
                address: c.address.clone(),
                x: x.to_vec(),
                ttft_ms: 50.0 + 20.0 * x[3] + 30.0 * x[2] + rng.next_f64() * 10.0,
                tpot_ms: 8.0 + 0.8 * x[4] + rng.next_f64(),
                ..Sample::default()
            }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut rng = Rng::new(7);
    let settings = Settings {
        streaming_mode: true,
        ..Settings::default()
    };
    let slo = Slo {
        ttft_ms: Some(500.0),
        tpot_ms: Some(50.0),
    };
    let mut group = c.benchmark_group("estimate");
    for n in [8usize, 64, 512] {
        let cands = candidates(n, &mut rng);
        let mut model = Model::default();
        for s in samples(&cands, 4 * n.max(100), &mut rng) {
            model.train(&s, 0);
        }
        let view = View {
            model: Some(Rc::new(Predictor::new(model))),
            min_tpot_slo: Rc::new(
                cands
                    .iter()
                    .step_by(3)
                    .map(|c| (c.address.clone(), 40.0))
                    .collect(),
            ),
        };
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                let e = latency::estimate(&settings, Some(&view), 900, slo, black_box(&cands), &[]);
                black_box(e.len())
            })
        });
    }
    group.finish();
    let mut group = c.benchmark_group("train");
    let cands = candidates(64, &mut rng);
    let batch = samples(&cands, 256, &mut rng);
    let mut model = Model::default();
    for s in samples(&cands, 1000, &mut rng) {
        model.train(&s, 0);
    }
    group.bench_function(BenchmarkId::from_parameter(256), |b| {
        b.iter(|| {
            let mut m = model.clone();
            for s in &batch {
                m.train(s, 0);
            }
            black_box(m.samples(latency::Target::Ttft))
        })
    });
    group.finish();
    let _ = N;
}

criterion_group!(benches, bench);
criterion_main!(benches);
