//! Workers racing inside callbacks: with preemption on, a VM is suspended inside a
//! shared-data host call while another worker's pending callback runs, as two Envoy
//! threads interleave. The filter's CAS loops must keep the ledger exact.

mod common;

use common::*;
use host_sim::world::clock::Rng;
use host_sim::{ms, us, Final, Poisson, SimConfig, SimpleUpstream};
use serde_json::json;

fn burst(preempt: f64, seed: u64) -> host_sim::Sim {
    let eps = endpoints(3);
    let cfg = SimConfig::new(&filter_config(&eps, json!({})))
        .workers(4)
        .seed(seed)
        .preempt(preempt);
    let mut sim = sim_with(cfg, &eps, |a| SimpleUpstream::new(a).ttft(ms(300)));
    // 24 requests within 50 µs: every worker is picking at the same time.
    sim.add_requests((0..24).map(|i| {
        host_sim::RequestSpec::completion(MODEL, &format!("{i}"), 2, false).at(ms(10) + us(2) * i)
    }));
    sim.run().unwrap();
    sim
}

#[test]
fn workers_that_pick_at_the_same_time_really_race_and_the_spread_still_holds() {
    let calm = burst(0.0, 3);
    assert_eq!(calm.yields(), 0);
    assert_eq!(
        calm.cas_mismatches(),
        0,
        "atomic callbacks never lose a CAS race"
    );

    let racing = burst(0.5, 3);
    assert!(racing.yields() > 10, "{}", racing.yields());
    assert!(
        racing.cas_mismatches() > 0,
        "suspended pickers lost CAS races"
    );
    for o in racing.outcomes() {
        assert_eq!(o.status, Some(200), "{}", o.text());
    }
    let per_ep = per_endpoint(racing.outcomes());
    assert_eq!(
        per_ep.values().copied().collect::<Vec<_>>(),
        vec![8, 8, 8],
        "{per_ep:?}"
    );
    assert!(ledger(&racing).workers.is_empty());
    assert_eq!(running_requests(&racing), 0.0);
}

#[test]
fn preempted_runs_are_still_deterministic_per_seed() {
    let a = burst(0.5, 9);
    let b = burst(0.5, 9);
    assert_eq!(a.trace_hash(), b.trace_hash());
    assert_eq!(a.cas_mismatches(), b.cas_mismatches());
    let c = burst(0.5, 10);
    assert_ne!(a.trace_hash(), c.trace_hash());
}

#[test]
fn twenty_seeds_of_racing_load_with_disconnects_keep_every_invariant() {
    let eps = endpoints(4);
    for seed in 0..20 {
        let cfg = SimConfig::new(&filter_config(&eps, json!({})))
            .workers(4)
            .seed(seed)
            .preempt(0.3);
        let mut sim = sim_with(cfg, &eps, |a| {
            SimpleUpstream::new(a).ttft(ms(20)).itl(ms(2))
        });
        let mut w = Poisson::new(2000.0, 150, MODEL);
        w.start = ms(5);
        w.disconnects = Some((0.2, ms(15)));
        sim.add_requests(w.generate(&mut Rng::new(seed, 1)));
        sim.run().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert!(sim.outcomes().iter().all(|o| o.fin != Final::Pending));
        assert_eq!(running_requests(&sim), 0.0, "seed {seed}");
        assert!(
            ledger(&sim).workers.is_empty(),
            "seed {seed}: {:?}",
            ledger(&sim)
        );
    }
}
