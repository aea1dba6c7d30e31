//! Several gateway replicas in front of one pool: independent Envoy processes (each its
//! own shared data, workers and filter VMs, as the pods of an ingress Deployment) that
//! never exchange state. The filter's rendezvous prior makes them agree on where a new
//! prefix group goes; without it each replica chooses on its own.

mod common;

use common::{endpoints, sum_series, MODEL};
use host_sim::{ms, RequestSpec, Sim, SimConfig, SimpleUpstream};
use serde_json::{json, Value};

/// The default profile, with the prefix parameters on an `approx-prefix-cache-producer`
/// when `prefix` is given.
fn config(eps: &[String], prefix: Option<Value>) -> String {
    let mut cfg = json!({ "pool": { "endpoints": eps } });
    if let Some(p) = prefix {
        cfg["plugins"] = json!([
            {"type": "approx-prefix-cache-producer", "parameters": p},
            {"type": "utilization-detector"},
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "prefix-cache-scorer"},
        ]);
        cfg["schedulingProfiles"] = json!([{"name": "default", "plugins": [
            {"pluginRef": "utilization-detector"},
            {"pluginRef": "queue-scorer", "weight": 2},
            {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
            {"pluginRef": "prefix-cache-scorer", "weight": 3},
        ]}]);
    }
    cfg.to_string()
}

fn sim(seed: u64, eps: &[String], prefix: Option<Value>) -> Sim {
    let cfg = SimConfig::new(&config(eps, prefix))
        .workers(2)
        .replicas(2)
        .seed(seed);
    let mut sim = Sim::new(cfg).expect("sim starts");
    for e in eps {
        sim.add_endpoint(e, Box::new(SimpleUpstream::new(e).ttft(ms(20))));
    }
    sim
}

/// A prompt of group `g`: a shared system prompt of about 1,100 characters (17 blocks of
/// 64), then a question of its own.
fn prompt(g: usize, q: usize) -> String {
    format!(
        "{}Question {q}: what is {q} times {g}?",
        format!("System prompt of tenant {g}: answer briefly and politely. ").repeat(20)
    )
}

/// Per group: the endpoint each request went to, in the order sent. Every group's
/// requests alternate between the two replicas, the first one to replica 0 and the second
/// to replica 1 at the same moment (both cold), then three more each.
fn route_groups(sim: &mut Sim, groups: usize) -> Vec<Vec<String>> {
    let mut ids = Vec::new();
    for g in 0..groups {
        let at = ms(200 + 300 * g as u64);
        let specs = (0..8).map(|q| {
            RequestSpec::completion(MODEL, &prompt(g, q), 2, false)
                .at(at + ms(40 * (q as u64 / 2)))
                .to_replica(q % 2)
        });
        ids.push(sim.add_requests(specs));
    }
    sim.run().unwrap();
    ids.iter()
        .map(|group| {
            group
                .iter()
                .map(|&id| {
                    let o = sim.outcome(id);
                    assert_eq!(o.status, Some(200), "{}", o.text());
                    assert_eq!(o.replica, id % 2, "pinned to its replica");
                    o.endpoint.clone().expect("routed")
                })
                .collect()
        })
        .collect()
}

#[test]
fn two_replicas_that_never_shared_state_send_a_new_prefix_groups_requests_to_the_same_server() {
    let eps = endpoints(8);
    for seed in 1..=3 {
        let mut sim = sim(seed, &eps, None);
        let routed = route_groups(&mut sim, 6);
        for (g, group) in routed.iter().enumerate() {
            assert!(
                group.iter().all(|e| *e == group[0]),
                "seed {seed}: group {g} split between servers: {group:?}"
            );
        }
        let servers: std::collections::BTreeSet<&String> = routed.iter().map(|g| &g[0]).collect();
        assert!(
            servers.len() >= 3,
            "seed {seed}: six groups crowd onto {servers:?}"
        );
        // The replicas are independent processes: each counts only its own requests.
        for r in 0..2 {
            let text = sim.replica_prometheus(r);
            let counted = sum_series(&text, "inference_objective_request_total{");
            assert_eq!(counted, 24.0, "seed {seed}: replica {r} counted {counted}");
        }
    }
}

#[test]
fn without_the_prior_the_replicas_choose_on_their_own() {
    let eps = endpoints(8);
    let mut split = 0;
    for seed in 1..=3 {
        let mut sim = sim(seed, &eps, Some(json!({"rendezvousPrior": false})));
        for group in route_groups(&mut sim, 6) {
            // Each replica still keeps a group where it first sent it.
            assert!(group.iter().step_by(2).all(|e| *e == group[0]), "{group:?}");
            assert!(
                group.iter().skip(1).step_by(2).all(|e| *e == group[1]),
                "{group:?}"
            );
            split += usize::from(group[0] != group[1]);
        }
    }
    assert!(
        split >= 6,
        "only {split} of 18 groups went to two servers without the prior"
    );
}
