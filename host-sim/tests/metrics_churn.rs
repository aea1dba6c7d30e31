//! Client-chosen metric labels come and go with the clients: after a flood of distinct
//! model names (more than the per-VM label cap), the ones nobody used for the configured
//! idle time leave the filter's metrics endpoint, each VM frees their places under the
//! cap, and new names get their own series again instead of `other`; a model still in
//! use keeps its series and its count.

mod common;

use common::*;
use host_sim::{ms, RequestSpec, SimConfig, SimpleUpstream, SEC};
use serde_json::json;

/// host-sim's listener port: the metrics endpoint shares it here, so only the path picks
/// the scrape (in Envoy it is a listener of its own).
const PORT: u16 = 10000;
const IDLE_S: u64 = 60;
/// More distinct names per VM than the cap (1,000) over 4 workers.
const FLOOD: usize = 6_000;

fn scrape(sim: &host_sim::Sim, id: usize) -> String {
    let o = &sim.outcomes()[id];
    assert_eq!(o.status, Some(200), "scrape {id}");
    String::from_utf8_lossy(&o.body).into_owned()
}

fn models_listed(text: &str, prefix: &str) -> usize {
    text.lines()
        .filter(|l| l.starts_with("inference_objective_request_total{"))
        .filter(|l| l.contains(&format!("model_name=\"{prefix}")))
        .count()
}

#[test]
fn idle_model_names_leave_the_metrics_endpoint_and_free_their_places_under_the_cap() {
    let eps = endpoints(2);
    let pool = json!({"metricsEndpoint": {"port": PORT, "idleSeriesSeconds": IDLE_S}});
    let cfg = SimConfig::new(&filter_config(&eps, pool))
        .workers(4)
        .seed(3);
    let mut sim = sim_serving(cfg, &eps, |a| {
        SimpleUpstream::new(a).ttft(ms(2)).itl(ms(1)).tokens(2)
    });
    // 0. "steady" first, on every worker (connections land on workers at random).
    sim.add_requests(
        (0..40).map(|i| RequestSpec::completion("steady", "hi", 2, false).at(ms(1) + i * ms(5))),
    );
    // 1. The flood: 6,000 distinct model names in 3 s.
    sim.add_requests((0..FLOOD).map(|i| {
        RequestSpec::completion(&format!("flood-{i}"), "hi", 2, false)
            .at(ms(300) + i as u64 * ms(1) / 2)
    }));
    let mut next = FLOOD + 40;
    let mut at = |sim: &mut host_sim::Sim, spec: RequestSpec| {
        sim.add_requests([spec]);
        next += 1;
        next - 1
    };
    let during = at(&mut sim, RequestSpec::get("/metrics").at(5 * SEC));
    // 2. Only "steady" is used for the next 4 minutes (idle time 60 s + grace 60 s +
    // the 60 s between expiry passes, with room).
    for t in (6..240).step_by(10) {
        at(
            &mut sim,
            RequestSpec::completion("steady", "hi", 2, false).at(t * SEC),
        );
    }
    let after = at(&mut sim, RequestSpec::get("/metrics").at(240 * SEC));
    // 3. New names after the expiry.
    for i in 0..200 {
        at(
            &mut sim,
            RequestSpec::completion(&format!("late-{i}"), "hi", 2, false)
                .at(241 * SEC + i as u64 * ms(5)),
        );
    }
    let late = at(&mut sim, RequestSpec::get("/metrics").at(250 * SEC));
    sim.run().unwrap();

    let text = scrape(&sim, during);
    let listed = models_listed(&text, "flood-");
    println!(
        "during the flood: {listed} names listed, exposition {} bytes; VM memory {:?}",
        text.len(),
        sim.vm_memory_bytes()
    );
    // One scrape lists at most the cap (1,000) whatever the number of VMs; the rest are
    // counted as `other`.
    assert_eq!(listed, 1_000, "the cap: the names updated last");
    assert!(text.contains("model_name=\"other\""));

    let text = scrape(&sim, after);
    assert_eq!(models_listed(&text, "flood-"), 0, "idle names left");
    // "steady" was counted on every request, whichever VM served it.
    assert!(
        text.contains("inference_objective_request_total{model_name=\"steady\",target_model_name=\"steady\"} 64\n"),
        "{}",
        text.lines().filter(|l| l.contains("steady")).collect::<Vec<_>>().join("\n")
    );

    // The places are free again: every new name has its own series, none is `other`.
    let text = scrape(&sim, late);
    assert_eq!(models_listed(&text, "late-"), 200);
    println!(
        "after the expiry and 200 new names: VM memory {:?}",
        sim.vm_memory_bytes()
    );
    let statuses: Vec<_> = sim.outcomes().iter().map(|o| o.status).collect();
    assert!(statuses.iter().all(|s| *s == Some(200)));
}

/// Envoy's stats never free a stat: a flood of model names that no server serves (every
/// engine answers 404) must not use up the label places of a model asked for later, on any
/// worker. Each worker learns that a model is served from its own first 2xx.
#[test]
fn names_no_server_serves_leave_envoys_places_to_a_model_asked_for_later() {
    const WORKERS: u64 = 4;
    const JUNK: usize = 2_500;
    const LATER: u64 = 80;
    let eps = endpoints(2);
    let cfg = SimConfig::new(&filter_config(&eps, json!({})))
        .workers(WORKERS as usize)
        .seed(5);
    let mut sim = sim_serving(cfg, &eps, |a| host_sim::VllmConfig::new(a).build());
    sim.add_requests((0..JUNK).map(|i| {
        RequestSpec::completion(&format!("junk-{i}"), "hi", 1, false)
            .at(ms(100) + i as u64 * ms(1) / 2)
    }));
    sim.add_requests(
        (0..LATER).map(|i| RequestSpec::completion(MODEL, "hi", 1, false).at(2 * SEC + i * ms(50))),
    );
    sim.run().unwrap();
    let statuses: Vec<_> = sim.outcomes().iter().map(|o| o.status).collect();
    assert!(statuses[..JUNK].iter().all(|s| *s == Some(404)));
    assert!(statuses[JUNK..].iter().all(|s| *s == Some(200)));
    let prom = sim.prometheus();
    let totals: Vec<&str> = prom
        .lines()
        .filter(|l| l.starts_with("inference_objective_request_total{"))
        .collect();
    let counted = totals
        .iter()
        .filter(|l| l.contains(&format!("model_name=\"{MODEL}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    // Only requests a worker routed before its first answer for the model (here at most its
    // first: they come 50 ms apart) went to `other`.
    assert!(
        counted >= (LATER - WORKERS) as f64,
        "{counted} of {LATER} under {MODEL}: {}",
        totals
            .iter()
            .filter(|l| !l.contains("junk-"))
            .copied()
            .collect::<Vec<_>>()
            .join("\n")
    );
    let junk = totals
        .iter()
        .filter(|l| l.contains("model_name=\"junk-"))
        .count();
    assert!(
        junk <= WORKERS as usize * 100,
        "{junk} junk names have a stat of their own"
    );
}
