//! Several gateway replicas in front of one pool: independent Envoy processes (each its
//! own shared data, workers and filter VMs, as the pods of an ingress Deployment) that
//! never exchange state. The filter's rendezvous prior makes them agree on where a new
//! prefix group goes; without it each replica chooses on its own. Flow control's
//! `concurrency-detector` with `inFlightSource: servers` keeps the pool's bound across
//! replicas from the servers' own counts.

mod common;

use common::filter::with_scrape_cluster;
use common::{endpoints, sim_serving, sum_series, MODEL};
use host_sim::world::invariants::Invariant;
use host_sim::world::upstream::{Emit, UpstreamRequest};
use host_sim::{ms, Nanos, RequestSpec, Sim, SimConfig, SimpleUpstream, Upstream, VllmConfig, US};
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
    for &id in ids.iter().flatten() {
        assert_eq!(sim.outcome(id).replica, id % 2, "pinned to its replica");
    }
    endpoints_per_group(sim, &ids)
}

/// Per group of request ids: the endpoint each went to (each answered 200).
fn endpoints_per_group(sim: &Sim, ids: &[Vec<usize>]) -> Vec<Vec<String>> {
    ids.iter()
        .map(|group| {
            group
                .iter()
                .map(|&id| {
                    let o = sim.outcome(id);
                    assert_eq!(o.status, Some(200), "{}", o.text());
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

// --- Capacity across replicas -------------------------------------------------------

/// Requests each server runs at once; `maxConcurrency` is the same, so the pool's bound is
/// `CAPACITY_SERVERS × MAX_CONCURRENCY`.
const MAX_CONCURRENCY: u64 = 4;
const CAPACITY_SERVERS: usize = 4;
const REPLICAS: usize = 4;

/// Flow control gated by `concurrency-detector` at `MAX_CONCURRENCY` per server with the
/// extra detector parameters `detector`, four replicas of two workers in front of four
/// `vllm-sim` engines, and the most requests in flight at the servers (checked after
/// every event): over the whole run, from `STEADY` on (once every replica has requests
/// queued), and replica 0's alone.
fn capacity_sim(seed: u64, detector: Value) -> (Sim, Most) {
    let eps = endpoints(CAPACITY_SERVERS);
    let mut params = json!({"maxConcurrency": MAX_CONCURRENCY, "concurrencyMode": "requests"});
    for (k, v) in detector.as_object().into_iter().flatten() {
        params[k] = v.clone();
    }
    let config = json!({
        "featureGates": ["flowControl"],
        "plugins": [{"type": "concurrency-detector", "parameters": params}],
        "saturationDetector": {"pluginRef": "concurrency-detector"},
        "flowControl": {"defaultRequestTTL": "120s"},
        "pool": {"endpoints": eps},
    })
    .to_string();
    let cfg = with_scrape_cluster(
        SimConfig::new(&config)
            .workers(2)
            .replicas(REPLICAS)
            .seed(seed),
    );
    let mut sim = sim_serving(cfg, &eps, |a| {
        VllmConfig::new(a)
            .max_num_seqs(MAX_CONCURRENCY as usize)
            .seed(seed)
            .build()
    });
    let most = Most::default();
    let seen = most.clone();
    sim.add_invariant(Invariant::new("records the most in flight", move |sim| {
        let now: u64 = sim
            .endpoint_addresses()
            .iter()
            .map(|e| sim.in_flight(e))
            .sum();
        seen.all.set(seen.all.get().max(now));
        let first = sim
            .outcomes()
            .iter()
            .filter(|o| o.replica == 0 && o.dispatched_at.is_some() && o.finished_at.is_none())
            .count() as u64;
        seen.first.set(seen.first.get().max(first));
        if sim.now() >= STEADY {
            seen.steady.set(seen.steady.get().max(now));
        }
        Ok(())
    }));
    (sim, most)
}

/// When the offered load has built queues at every replica (1 s after it starts).
const STEADY: u64 = 1_500 * 1_000_000;

/// The most requests in flight at the servers.
#[derive(Clone, Default)]
struct Most {
    all: std::rc::Rc<std::cell::Cell<u64>>,
    steady: std::rc::Rc<std::cell::Cell<u64>>,
    /// Replica 0's own (sent upstream, not yet answered).
    first: std::rc::Rc<std::cell::Cell<u64>>,
}

/// `n` requests of 48 output tokens, one every `gap_us` µs from 0.5 s (after the first
/// scrapes), the `i`-th sent to replica `replica(i)`; runs until all are answered and
/// returns how many got a 200.
fn offer(sim: &mut Sim, n: usize, gap_us: u64, replica: impl Fn(usize) -> usize) -> usize {
    sim.add_requests((0..n).map(|i| {
        RequestSpec::completion(MODEL, &format!("request {i:05}"), 48, false)
            .at(ms(500) + i as u64 * gap_us * US)
            .to_replica(replica(i))
    }));
    sim.run_until(ms(15_000)).unwrap();
    sim.outcomes()
        .iter()
        .filter(|o| o.status == Some(200))
        .count()
}

/// The pool's bound, 16 requests; 240 requests arriving over 1.2 s (about 4× what the
/// pool serves) spread evenly over four replicas. Each replica counts only its own: alone
/// each lets 16 through, together 4× the bound. With `inFlightSource: servers` each adds
/// what the servers' last scrape shows beyond its own, and the four together stay under
/// twice the bound (29 of 16 in this 4-server pool; 1.2× at 16 servers, BENCHMARKS §10);
/// with `gatewayReplicas: 4` as well, within 1.5× (21–23).
#[test]
fn with_the_servers_counts_four_replicas_keep_the_pools_bound_where_each_alone_overshoots() {
    let bound = MAX_CONCURRENCY * CAPACITY_SERVERS as u64;
    for seed in 1..=3 {
        let (mut sim, most) = capacity_sim(seed, json!({}));
        assert_eq!(offer(&mut sim, 240, 5_000, |i| i % REPLICAS), 240);
        let alone = most.steady.get();
        let (mut sim, most) = capacity_sim(seed, json!({"inFlightSource": "servers"}));
        assert_eq!(offer(&mut sim, 240, 5_000, |i| i % REPLICAS), 240);
        let (shared, burst) = (most.steady.get(), most.all.get());
        assert!(
            burst < 2 * bound,
            "seed {seed}: {burst} in flight in the first burst"
        );
        assert!(
            alone >= 3 * bound,
            "seed {seed}: per-replica bounds let {alone} through"
        );
        // What other replicas sent since this one's last scrape is unseen (and in this
        // small pool the servers' counts trail the requests in flight by a few): under
        // twice the bound, where alone the replicas reach four times it.
        assert!(
            shared < 2 * bound,
            "seed {seed}: {shared} in flight with the servers' counts, bound {bound}"
        );
        assert!(
            shared >= bound,
            "seed {seed}: the pool was never filled ({shared})"
        );
        let (mut sim, most) = capacity_sim(
            seed,
            json!({"inFlightSource": "servers", "gatewayReplicas": REPLICAS}),
        );
        assert_eq!(offer(&mut sim, 240, 5_000, |i| i % REPLICAS), 240);
        // With the share as well, each replica borrows only 1/4 of the room a scrape
        // shows (every replica sees it at once): closer to the bound (21–23 here).
        let both = most.all.get();
        assert!(
            both < shared && both <= bound + bound / 2,
            "seed {seed}: {both} in flight with the servers' counts and the share ({shared} without the share)"
        );
    }
}

/// Nearly all the traffic through one replica: a static `gatewayReplicas: 4` split holds
/// it to a quarter of the pool while the others' shares idle; with the servers' counts
/// (alone, or on top of the share) it may borrow what the others leave idle.
///
/// What is asserted is replica 0's own requests at the servers: it has a backlog all run
/// (108 requests in 1.2 s where the pool serves a few a second), so it fills exactly what
/// it is allowed, whichever servers its picks chose. The pool's total also counts the
/// other replicas' light traffic, whose overlap depends on which servers each request
/// drew (7–11 in flight under the static split over seeds 1–12, with either way of
/// breaking score ties), so it is no measure of the split.
#[test]
fn a_replica_with_most_of_the_traffic_borrows_the_capacity_others_leave_idle() {
    let bound = MAX_CONCURRENCY * CAPACITY_SERVERS as u64;
    let share = bound / REPLICAS as u64;
    // 9 of every 10 requests through replica 0, the rest spread over the others.
    let uneven = |i: usize| if i % 10 == 9 { 1 + i / 10 % 3 } else { 0 };
    for seed in 1..=3 {
        let (mut sim, most) = capacity_sim(seed, json!({"gatewayReplicas": REPLICAS}));
        assert_eq!(offer(&mut sim, 120, 10_000, uneven), 120);
        let (own, split) = (most.first.get(), most.all.get());
        assert_eq!(
            own, share,
            "seed {seed}: the static split let replica 0 have {own} in flight (share {share}; {split} in the pool)"
        );
        for detector in [
            json!({"inFlightSource": "servers"}),
            json!({"inFlightSource": "servers", "gatewayReplicas": REPLICAS}),
        ] {
            let (mut sim, most) = capacity_sim(seed, detector.clone());
            assert_eq!(offer(&mut sim, 120, 10_000, uneven), 120);
            let (own, borrowed) = (most.first.get(), most.steady.get());
            // Replica 0 borrows the idle shares: all or nearly all of the pool's bound.
            assert!(
                own >= bound - 2,
                "seed {seed}, {detector}: replica 0 had at most {own} in flight (bound {bound})"
            );
            assert!(
                borrowed >= bound - 2 && borrowed < 2 * bound,
                "seed {seed}, {detector}: {borrowed} in flight (bound {bound})"
            );
        }
    }
}

// --- Near the pool's capacity ---------------------------------------------------------

/// The default profile, or with `home` the profile of `envoy/config/rendezvous-home.json`
/// (`rendezvous-home-filter` in place of the utilization detector's filter, acting only
/// while the servers show other gateways' requests; alone, the utilization detector's
/// filter).
fn near_capacity_config(eps: &[String], home: bool) -> String {
    let mut cfg = if home {
        let path = tests::paths::root().join("envoy/config/rendezvous-home.json");
        let text = std::fs::read_to_string(&path).expect("envoy/config/rendezvous-home.json");
        serde_json::from_str(&text).expect("rendezvous-home.json is JSON")
    } else {
        json!({})
    };
    cfg["pool"] = json!({ "endpoints": eps });
    cfg.to_string()
}

/// The servers' prefix-cache hit rate over the second half of a run of `replicas`
/// gateways in front of 6 `vllm-sim` engines (h100-llama-8b, 8 sequences, 8,192 KV tokens
/// each) offered 18 QPS (about what they serve: the 16-server pool of BENCHMARKS §10 at
/// 48 QPS, scaled) of 24 prompt groups sharing a 1,024-token system prompt (half the
/// pool's KV), 16 s, every request on a new connection.
fn hit_rate_near_capacity(replicas: usize, home: bool) -> f64 {
    use tests::loadgen::workload::{Arrivals, Spec, Workload};
    let eps = endpoints(6);
    let cfg = with_scrape_cluster(
        SimConfig::new(&near_capacity_config(&eps, home))
            .workers(2)
            .replicas(replicas)
            .seed(1),
    );
    let mut sim = Sim::new(cfg).expect("sim starts");
    let servers: Vec<_> = eps
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let s = VllmConfig::new(e)
                .profile("h100-llama-8b")
                .max_num_seqs(8)
                .kv_blocks(512)
                .max_waiting(100_000)
                .seed(1 + i as u64)
                .build()
                .shared();
            sim.add_endpoint(e, Box::new(s.clone()));
            s
        })
        .collect();
    let spec = Spec {
        model: MODEL.into(),
        groups: 24,
        prompts_per_group: 16,
        system_prompt_len: 1024,
        question_len: 128,
        output_len: 64,
        ..Spec::default()
    };
    let mut workload = Workload::new(spec, 1);
    let end = ms(16_000);
    let specs: Vec<RequestSpec> = Arrivals::new(18.0, 1)
        .map(|at| ms(10) + at.as_nanos() as u64)
        .take_while(|&t| t < end)
        .enumerate()
        .map(|(i, t)| {
            RequestSpec::post("/v1/completions", workload.next_request(i as u64).body).at(t)
        })
        .collect();
    sim.add_requests(specs);
    let counters = |servers: &[std::rc::Rc<std::cell::RefCell<host_sim::VllmUpstream>>]| {
        servers.iter().fold((0u64, 0u64), |(q, h), s| {
            let m = s.borrow().engine().metrics().clone();
            (q + m.prefix_cache_queries, h + m.prefix_cache_hits)
        })
    };
    sim.run_until(end / 2).unwrap();
    let before = counters(&servers);
    sim.run_until(end).unwrap();
    let after = counters(&servers);
    (after.1 - before.1) as f64 / (after.0 - before.0).max(1) as f64
}

/// Near the pool's capacity, replicas that decide apart scatter a prefix group once its
/// owner queues (each learns its own fallback), and the lost hits tip the pool into
/// overload: with the default profile four replicas lose more than 20 points of hits.
/// With `envoy/config/rendezvous-home.json` every replica keeps a group on the same few
/// servers, and four replicas keep the hit rate of one within 5 points; one replica,
/// alone in front of the pool, routes exactly as with the default profile.
#[test]
fn near_capacity_four_replicas_with_the_home_filter_keep_one_replicas_hit_rate() {
    let one = hit_rate_near_capacity(1, true);
    assert_eq!(
        one,
        hit_rate_near_capacity(1, false),
        "alone, the home filter's profile routes as the default profile"
    );
    let four = hit_rate_near_capacity(4, true);
    let four_default = hit_rate_near_capacity(4, false);
    assert!(
        four >= one - 0.05,
        "four replicas {four:.3} against one {one:.3}"
    );
    assert!(
        four_default < four - 0.2,
        "the default profile's four replicas ({four_default:.3}) no longer scatter: is the \
         pool still near capacity?"
    );
}

// --- A hot group's overflow -----------------------------------------------------------

/// Where a hot prefix group's requests went, per replica (in the order sent), when two
/// replicas that share nothing route it with the plugin configuration `plugins` (one
/// profile of the filter `filter` and the three scorers of the default profile, weights
/// 2 / 2 / 3): 24 requests of one group, 8 a second, alternately through the two
/// replicas, in front of 8 `vllm-sim` engines of 3 sequences each (h100-llama-8b, about
/// 2.5 requests a second each), so that the group's first server queues and the rest
/// must go elsewhere. The run is
/// bounded in virtual time (the scrapes never stop, so `Sim::run` would not return).
fn hot_group_routes(filter: Value) -> [Vec<String>; 2] {
    let eps = endpoints(8);
    let mut cfg = json!({
        "pool": {"endpoints": eps},
        "plugins": [
            filter,
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "prefix-cache-scorer"},
        ],
    });
    let name = cfg["plugins"][0]["type"].clone();
    cfg["schedulingProfiles"] = json!([{"name": "default", "plugins": [
        {"pluginRef": name},
        {"pluginRef": "queue-scorer", "weight": 2},
        {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
        {"pluginRef": "prefix-cache-scorer", "weight": 3},
    ]}]);
    let cfg = with_scrape_cluster(
        SimConfig::new(&cfg.to_string())
            .workers(2)
            .replicas(2)
            .seed(1),
    );
    let mut sim = sim_serving(cfg, &eps, |a| {
        VllmConfig::new(a)
            .profile("h100-llama-8b")
            .max_num_seqs(3)
            .max_waiting(1_000)
            .build()
    });
    let ids = sim.add_requests((0..24).map(|q| {
        let body = json!({"model": MODEL, "prompt": prompt(7, q), "max_tokens": 64,
            "ignore_eos": true, "stream": false});
        RequestSpec::post("/v1/completions", body.to_string())
            .at(ms(1_000 + 125 * q as u64))
            .to_replica(q % 2)
    }));
    assert!(
        sim.run_until_answered(ms(60_000)).unwrap(),
        "every request answered within 60 s"
    );
    let mut routes = [Vec::new(), Vec::new()];
    for (q, &id) in ids.iter().enumerate() {
        let o = sim.outcome(id);
        assert_eq!(o.status, Some(200), "{}", o.text());
        routes[q % 2].push(o.endpoint.clone().expect("an endpoint"));
    }
    routes
}

/// The servers a replica's requests went to other than the group's first one, in order of
/// first use.
fn overflow(routes: &[String], first: &str) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for e in routes.iter().filter(|e| *e != first) {
        if !seen.contains(e) {
            seen.push(e.clone());
        }
    }
    seen
}

/// With `growWhenQueueing` (a home of one server here, so that the overflow has one
/// place to go), when the group's server queues, both replicas send the overflow to the
/// same next server of its rendezvous order, and past that one to the same next: they
/// read the same servers' queues and compute the same order, without exchanging
/// anything.
#[test]
fn two_replicas_that_never_shared_state_send_a_hot_groups_overflow_to_the_same_second_server() {
    let routes = hot_group_routes(json!({
        "type": "rendezvous-home-filter",
        "parameters": {"homeSize": 1, "growWhenQueueing": true},
    }));
    let first = routes[0][0].clone();
    assert_eq!(
        routes[1][0], first,
        "both replicas start on the owner: {routes:?}"
    );
    let (a, b) = (overflow(&routes[0], &first), overflow(&routes[1], &first));
    assert!(
        !a.is_empty() && !b.is_empty(),
        "the owner queued and both replicas overflowed: {routes:?}"
    );
    assert_eq!(a[0], b[0], "the same second server: {routes:?}");
    let n = a.len().min(b.len());
    assert_eq!(
        a[..n],
        b[..n],
        "past it, the same order (one replica may need fewer): {routes:?}"
    );
}

// --- Load weights of the rendezvous prior ----------------------------------------------

/// A server that also runs `extra` requests of clients these gateways do not see: its
/// `/metrics` counts them as running.
struct Busier {
    inner: SimpleUpstream,
    extra: u64,
    /// From when (0: always).
    from: Nanos,
}

impl Upstream for Busier {
    fn start(&mut self, now: Nanos, id: u64, req: &UpstreamRequest) {
        self.inner.start(now, id, req)
    }
    fn cancel(&mut self, now: Nanos, id: u64) {
        self.inner.cancel(now, id)
    }
    fn next_wake(&self) -> Option<Nanos> {
        self.inner.next_wake()
    }
    fn poll(&mut self, now: Nanos, out: &mut Vec<Emit>) {
        self.inner.poll(now, out)
    }
    fn metrics(&mut self, now: Nanos) -> String {
        let text = self.inner.metrics(now);
        let add = |line: &str| -> String {
            let Some((series, value)) = line.rsplit_once(' ') else {
                return line.to_string();
            };
            let n: u64 = value.parse().expect("a count");
            let extra = if now >= self.from { self.extra } else { 0 };
            format!("{series} {}", n + extra)
        };
        text.lines()
            .map(|l| {
                if l.starts_with("vllm:num_requests_running") {
                    add(l)
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
            + "\n"
    }
}

/// The first and second rendezvous owners (indices into `eps`) of group `g`'s prompts,
/// without weights, as the filter computes them (64-character blocks, the key of the
/// first 8).
fn plain_owners(g: usize, eps: &[String]) -> [usize; 2] {
    use epp_filter::prefix::{hash::hash_prompt, rendezvous};
    let hashes = hash_prompt(MODEL, None, prompt(g, 0).as_bytes(), 64, 256);
    let key = rendezvous::key(8, &hashes).expect("a key");
    let [a, b] = rendezvous::owners::<2>(key, eps.iter().map(String::as_str));
    [a.expect("an owner"), b.expect("a second owner")]
}

/// The server (index) that owns the most of the groups whose `owners` are given (at least
/// four of them, so that giving up half is visible).
fn busiest_owner(owners: &[[usize; 2]], servers: usize) -> usize {
    let owned = |i: usize| owners.iter().filter(|o| o[0] == i).count();
    let busy = (0..servers).max_by_key(|&i| owned(i)).unwrap_or(0);
    assert!(
        owned(busy) >= 4,
        "server {busy} owns {} of {}",
        owned(busy),
        owners.len()
    );
    busy
}

/// Every group stayed on one server on both replicas; the busier server's groups each
/// went to it or to their second owner, and it kept at most half of them; every other
/// group stayed with its owner.
fn busier_server_gave_up_groups_to_their_second_owners(
    routes: &[Vec<String>],
    owners: &[[usize; 2]],
    busy: usize,
    eps: &[String],
) {
    let owned = owners.iter().filter(|o| o[0] == busy).count();
    let mut kept = 0;
    for (g, group) in routes.iter().enumerate() {
        assert!(
            group.iter().all(|e| *e == group[0]),
            "group {g} split between servers: {group:?}"
        );
        let [first, second] = owners[g];
        if first == busy {
            assert!(
                group[0] == eps[busy] || group[0] == eps[second],
                "group {g} of the busier server went to {} (second owner {})",
                group[0],
                eps[second]
            );
            kept += usize::from(group[0] == eps[busy]);
        } else {
            assert_eq!(group[0], eps[first], "group {g} of another server moved");
        }
    }
    assert!(
        kept * 2 <= owned,
        "the busier server kept {kept} of its {owned} groups"
    );
}

/// Two replicas (2 workers each, scraping every 50 ms) in front of 8 servers of which
/// `busy` also runs 6 requests of other clients, with the default profile and the prefix
/// parameters `prefix`: 30 s of scrapes, then `groups` new prompt groups as
/// [`route_groups`] sends them (both replicas cold at once). Per group, the servers its
/// requests went to.
fn groups_beside_a_busier_server(busy: usize, groups: usize, prefix: Value) -> Vec<Vec<String>> {
    let eps = endpoints(8);
    let cfg = with_scrape_cluster(
        SimConfig::new(&config(&eps, Some(prefix)))
            .workers(2)
            .replicas(2)
            .seed(1),
    );
    let mut sim = sim_serving(cfg, &eps, |a| Busier {
        inner: SimpleUpstream::new(a).ttft(ms(20)),
        extra: if *a == eps[busy] { 6 } else { 0 },
        from: 0,
    });
    let start = ms(30_000);
    let ids: Vec<Vec<usize>> = (0..groups)
        .map(|g| {
            let at = start + ms(300 * g as u64);
            sim.add_requests((0..8).map(|q| {
                RequestSpec::completion(MODEL, &prompt(g, q), 2, false)
                    .at(at + ms(40 * (q as u64 / 2)))
                    .to_replica(q % 2)
            }))
        })
        .collect();
    let end = start + ms(300 * groups as u64 + 2_000);
    assert!(
        sim.run_until_answered(end).unwrap(),
        "every request answered"
    );
    endpoints_per_group(&sim, &ids)
}

/// With `rendezvousPriorLoadWeights` (the default), a server persistently busier than the
/// rest (here with clients the gateways do not see) owns fewer new prompt groups: every
/// replica's scraper lowers its weight from the same scraped load, so two replicas that
/// never shared state still agree on every group, and a group the busier server gives up goes, on both, to the server that is
/// second in its rendezvous order. The other servers' groups do not move.
#[test]
fn a_persistently_busier_server_gives_up_groups_to_the_same_second_server_on_both_replicas() {
    let eps = endpoints(8);
    let groups = 24;
    let owners: Vec<[usize; 2]> = (0..groups).map(|g| plain_owners(g, &eps)).collect();
    let busy = busiest_owner(&owners, eps.len());
    // The default prefix parameters: the load weights are on.
    let with = groups_beside_a_busier_server(busy, groups, json!({}));
    busier_server_gave_up_groups_to_their_second_owners(&with, &owners, busy, &eps);
    // Without the weights (`rendezvousPriorLoadWeights: false`), it keeps them all.
    let without =
        groups_beside_a_busier_server(busy, groups, json!({"rendezvousPriorLoadWeights": false}));
    for (g, group) in without.iter().enumerate() {
        assert_eq!(group[0], eps[owners[g][0]], "group {g} without weights");
    }
}

/// Two replicas route `groups` prompt groups (four requests each, alternating) while
/// every server is equally loaded, then server `busy` also runs 6 requests of other
/// clients for 30 s, then they route the same groups again. Per group, the servers its
/// second round went to.
fn groups_after_their_owner_became_busier(busy: usize, groups: usize) -> Vec<Vec<String>> {
    let eps = endpoints(8);
    let prefix = json!({"rendezvousPriorLoadWeights": true});
    let cfg = with_scrape_cluster(
        SimConfig::new(&config(&eps, Some(prefix)))
            .workers(2)
            .replicas(2)
            .seed(1),
    );
    let busier_from = ms(2_000 + 300 * groups as u64);
    let mut sim = sim_serving(cfg, &eps, |a| Busier {
        inner: SimpleUpstream::new(a).ttft(ms(20)),
        extra: if *a == eps[busy] { 6 } else { 0 },
        from: busier_from,
    });
    let round = |sim: &mut Sim, start: Nanos| -> Vec<Vec<usize>> {
        (0..groups)
            .map(|g| {
                let at = start + ms(300 * g as u64);
                sim.add_requests((0..4).map(|q| {
                    RequestSpec::completion(MODEL, &prompt(g, q), 2, false)
                        .at(at + ms(40 * q as u64))
                        .to_replica(q % 2)
                }))
            })
            .collect()
    };
    round(&mut sim, ms(1_000));
    let start = busier_from + ms(30_000);
    let ids = round(&mut sim, start);
    let end = start + ms(300 * groups as u64 + 2_000);
    assert!(
        sim.run_until_answered(end).unwrap(),
        "every request answered"
    );
    endpoints_per_group(&sim, &ids)
}

/// A group both replicas have already routed to its owner, when that server becomes
/// persistently busier: the load weights move it to its second owner on every replica
/// at once (a replica's learned index, which holds it on the old owner, does not keep
/// it there), so it is not split between the two.
#[test]
fn a_group_already_routed_follows_the_weights_to_the_same_second_server_on_both_replicas() {
    let eps = endpoints(8);
    let groups = 24;
    let owners: Vec<[usize; 2]> = (0..groups).map(|g| plain_owners(g, &eps)).collect();
    let busy = busiest_owner(&owners, eps.len());
    let routes = groups_after_their_owner_became_busier(busy, groups);
    busier_server_gave_up_groups_to_their_second_owners(&routes, &owners, busy, &eps);
}
