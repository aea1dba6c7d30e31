//! The cost of flow control's and the prefix index's hot operations, natively.
//!
//! * `dispatch_cycle/10000_queued` — one dispatch cycle (grant one request) with 10,000
//!   requests queued over 4 workers × 50 tenants × 2 bands, including the decode and
//!   re-encode of the shared record through the CAS update, as the proxy does it.
//! * `admit/10000_queued` — admitting (queueing) one more request into that state.
//! * `prefix_hash/N KiB` — hashing an N KiB prompt into chained block hashes.
//!
//! Run: `cargo bench -p filter --bench flow_control`.

// A benchmark, not the data path: panicking on a broken setup is what we want.
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use epp_filter::flow_control::config::FlowControlConfig;
use epp_filter::flow_control::state::{Admission, FlowRef, FlowState, Head, STATE_KEY};
use epp_filter::shared_store::{update, MemoryStore, SharedStore};
use prost::Message;

const VMS: u64 = 4;
const TENANTS: usize = 50;
const BANDS: [i32; 2] = [100, 0];
const QUEUED: usize = 10_000;

fn head(k: u64) -> Head {
    Head {
        primary: k,
        secondary: k,
        bytes: 2048,
        tokens: 1280,
    }
}

/// A shared state with `QUEUED` requests waiting and the pool full (1 slot in use).
fn backlog(config: &FlowControlConfig) -> FlowState {
    let mut s = FlowState::default();
    let full = |s: &FlowState| if s.in_flight() >= 1 { 1.0 } else { 0.0 };
    let first = FlowRef {
        priority: 0,
        fairness_id: "t0",
    };
    let band = config.band(0);
    assert_eq!(
        s.admit(1, first, head(0), config, &band, 0, &full, &|_| Vec::new()),
        Admission::Dispatch
    );
    let tenants: Vec<String> = (0..TENANTS).map(|t| format!("tenant-{t}")).collect();
    for i in 0..QUEUED {
        let vm = 1 + (i as u64 % VMS);
        let priority = BANDS[i % 2];
        let fairness_id = &tenants[(i / 2) % TENANTS];
        let band = config.band(priority);
        let k = 1 + i as u64;
        let a = s.admit(
            vm,
            FlowRef {
                priority,
                fairness_id,
            },
            head(k),
            config,
            &band,
            1,
            &full,
            &|_| (0..8).map(|j| head(k + j)).collect(),
        );
        assert_eq!(a, Admission::Queued);
    }
    s
}

fn bench(c: &mut Criterion) {
    let config = FlowControlConfig::default();
    let state = backlog(&config);
    let bytes = state.encode_to_vec();
    let mut group = c.benchmark_group("flow_control");
    group.bench_function("dispatch_cycle/10000_queued", |b| {
        let store = MemoryStore::default();
        b.iter(|| {
            store.set(STATE_KEY, &bytes, 0).unwrap();
            // One slot frees: the cycle grants exactly one request.
            let grants = update(&store, STATE_KEY, |s: &mut FlowState| {
                s.finish(1, 1280, 2);
                s.dispatch(&config, 2, 64, &|s| {
                    if s.in_flight() >= 1 {
                        1.0
                    } else {
                        0.0
                    }
                })
            })
            .unwrap();
            assert_eq!(grants.len(), 1);
            black_box(grants)
        })
    });
    group.bench_function("admit/10000_queued", |b| {
        let store = MemoryStore::default();
        let band = config.band(0);
        b.iter(|| {
            store.set(STATE_KEY, &bytes, 0).unwrap();
            let a = update(&store, STATE_KEY, |s: &mut FlowState| {
                s.admit(
                    2,
                    FlowRef {
                        priority: 0,
                        fairness_id: "tenant-7",
                    },
                    head(99_999),
                    &config,
                    &band,
                    3,
                    &|_| 1.0,
                    &|_| vec![head(99_999)],
                )
            })
            .unwrap();
            black_box(a)
        })
    });
    group.finish();

    let mut group = c.benchmark_group("prefix_hash");
    for kib in [1usize, 16, 64] {
        let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(kib * 1024 / 45 + 1);
        let prompt = &prompt.as_bytes()[..kib * 1024];
        group.throughput(Throughput::Bytes(prompt.len() as u64));
        group.bench_with_input(
            BenchmarkId::from_parameter(format!("{kib}KiB")),
            &prompt,
            |b, p| {
                b.iter(|| epp_filter::prefix::hash::hash_prompt("m", None, black_box(p), 64, 4096))
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
