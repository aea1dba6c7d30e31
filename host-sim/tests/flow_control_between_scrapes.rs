//! Flow control with the utilization detector between two metric scrapes: a burst into
//! a pool whose scraped queues still read empty must not be released all at once. The
//! requests dispatched since an endpoint's last scrape count as waiting there, so the
//! gate closes when the pool reads full, not one scrape later.

mod common;

use common::filter::with_scrape_cluster;
use common::flow_control::{all_seeds, request, sim_config, within_capacity};
use common::{endpoints, sim_serving};
use host_sim::{ms, VllmConfig};
use serde_json::json;

/// Per-server concurrency of the simulated engines.
const MAX_NUM_SEQS: u64 = 2;
/// The default utilization detector's `queueDepthThreshold`.
const QUEUE_DEPTH_THRESHOLD: u64 = 5;

/// 120 requests arrive within 12 ms into two idle servers (2 running each). Scrapes every
/// 50 ms; the default `utilization-detector` gates dispatch. The servers never hold more
/// than what the detector admits per endpoint — `maxNumSeqs` running plus
/// `queueDepthThreshold` waiting — plus one request per endpoint for the dispatch that
/// tips the pool over. Without counting the dispatches since the scrape, the first cycle
/// released the whole burst.
#[test]
fn a_burst_between_two_scrapes_is_released_only_up_to_the_detectors_threshold() {
    for (seed, preempt) in all_seeds() {
        let eps = endpoints(2);
        let config = json!({
            "featureGates": ["flowControl"],
            "flowControl": {"defaultRequestTTL": "120s"},
            "pool": {"endpoints": eps},
        })
        .to_string();
        let cfg = with_scrape_cluster(sim_config(&config, seed, preempt));
        let mut sim = sim_serving(cfg, &eps, |a| {
            VllmConfig::new(a)
                .max_num_seqs(MAX_NUM_SEQS as usize)
                .build()
        });
        let per_endpoint = MAX_NUM_SEQS + QUEUE_DEPTH_THRESHOLD + 1;
        sim.add_invariant(within_capacity(per_endpoint * eps.len() as u64));
        // After the first scrapes (the pool reads idle), a burst.
        sim.add_requests(
            (0..120).map(|i| request(i, "standard", "t", 16).at(ms(500) + ms(i as u64 / 10))),
        );
        // Scrapes and ticks never stop: run long enough for the backlog to drain.
        sim.run_until(ms(20_000))
            .unwrap_or_else(|e| panic!("seed {seed}, preempt {preempt}: {e}"));
        let served = sim
            .outcomes()
            .iter()
            .filter(|o| o.status == Some(200))
            .count();
        assert_eq!(
            served, 120,
            "seed {seed}: every request is served in the end"
        );
    }
}
