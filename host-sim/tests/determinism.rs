//! The same seed replays the same interleaving; another seed explores another.

mod common;

use common::*;
use host_sim::world::clock::Rng;
use host_sim::{ms, Poisson, SimConfig, SimpleUpstream};
use serde_json::json;

/// Status, endpoint, worker and completion time of one request.
type Seen = (Option<u16>, Option<String>, Option<usize>, Option<u64>);

fn run(seed: u64) -> (u64, Vec<String>, Vec<Seen>) {
    let eps = endpoints(4);
    let cfg = SimConfig::new(&filter_config(&eps, json!({})))
        .workers(4)
        .seed(seed)
        .record_trace(true);
    let mut sim = sim_with(cfg, &eps, |a| {
        SimpleUpstream::new(a).ttft(ms(20)).itl(ms(3))
    });
    let mut w = Poisson::new(300.0, 120, MODEL);
    w.start = ms(5);
    w.disconnects = Some((0.1, ms(30)));
    // The workload is fixed; only the simulation seed varies.
    sim.add_requests(w.generate(&mut Rng::new(42, 0)));
    sim.run().unwrap();
    let outcomes = sim
        .outcomes()
        .iter()
        .map(|o| (o.status, o.endpoint.clone(), o.worker, o.last_token_at))
        .collect();
    (sim.trace_hash(), sim.trace().to_vec(), outcomes)
}

#[test]
fn the_same_seed_gives_the_same_event_trace_and_outcomes() {
    let (h1, t1, o1) = run(7);
    let (h2, t2, o2) = run(7);
    assert_eq!(h1, h2);
    assert_eq!(t1.len(), t2.len());
    if let Some(i) = (0..t1.len()).find(|&i| t1[i] != t2[i]) {
        panic!("traces differ at event {i}: {} vs {}", t1[i], t2[i]);
    }
    assert_eq!(o1, o2);
}

#[test]
fn a_different_seed_explores_a_different_interleaving() {
    let (h1, t1, o1) = run(7);
    let (h2, t2, o2) = run(8);
    assert_ne!(h1, h2);
    assert_ne!(t1, t2, "the event order differs");
    let workers = |o: &Vec<Seen>| o.iter().map(|x| x.2).collect::<Vec<_>>();
    assert_ne!(
        workers(&o1),
        workers(&o2),
        "connections land on other workers"
    );
}
