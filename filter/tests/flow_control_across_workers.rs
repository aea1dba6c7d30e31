//! Flow control's global guarantees, with several worker VMs sharing one state record
//! through the shared store, as Envoy workers do. Each "VM" here keeps its own parked
//! requests and talks to the others only through the record, so what holds here holds
//! whichever worker a request arrived on.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use epp_filter::flow_control::config::FlowControlConfig;
use epp_filter::flow_control::fairness::FairnessPolicy;
use epp_filter::flow_control::ordering::{OrderInputs, OrderingPolicy};
use epp_filter::flow_control::parked::{Parked, ParkedRequest};
use epp_filter::flow_control::state::{
    Admission, Cancelled, FlowRef, FlowState, Head, Limit, HEADS_PER_QUEUE, STATE_KEY,
};
use epp_filter::shared_store::{read, update, MemoryStore};
use std::collections::HashMap;

/// One simulated worker VM.
struct Vm {
    id: u64,
    parked: Parked<()>,
}

/// Several VMs, one shared store, a pool of fixed concurrency capacity.
struct World {
    store: MemoryStore,
    config: FlowControlConfig,
    vms: Vec<Vm>,
    capacity: u64,
    next_ctx: u32,
    now: u64,
    /// ctx → (vm index, flow) of requests running upstream.
    running: HashMap<u32, (usize, i32, String)>,
    /// Dispatch order: (priority, fairness id).
    dispatched: Vec<(i32, String)>,
}

impl World {
    fn new(vms: usize, capacity: u64, config: FlowControlConfig) -> Self {
        World {
            store: MemoryStore::default(),
            config,
            vms: (0..vms)
                .map(|i| Vm {
                    id: 100 + i as u64,
                    parked: Parked::default(),
                })
                .collect(),
            capacity,
            next_ctx: 1,
            now: 1_000,
            running: HashMap::new(),
            dispatched: Vec::new(),
        }
    }

    fn saturation(&self) -> impl Fn(&FlowState) -> f64 {
        let capacity = self.capacity;
        move |s: &FlowState| s.in_flight() as f64 / capacity as f64
    }

    fn state(&self) -> FlowState {
        read(&self.store, STATE_KEY).unwrap().unwrap_or_default()
    }

    /// A request arrives on VM `v`. Returns its ctx and what flow control decided.
    fn arrive(&mut self, v: usize, priority: i32, tenant: &str) -> (u32, Admission) {
        self.now += 1;
        let ctx = self.next_ctx;
        self.next_ctx += 1;
        let band = self.config.band(priority);
        let key = band.ordering.key(&OrderInputs {
            enqueue_ms: self.now,
            received_ms: self.now,
            ttl_ms: self.config.default_ttl_ms,
            slo_ttft_ms: None,
        });
        let head = Head {
            primary: key.primary,
            secondary: key.secondary,
            bytes: 100,
            tokens: 10,
        };
        let vm_id = self.vms[v].id;
        // Park first (the owner's local view includes it), un-park if not queued.
        self.vms[v].parked.park(ParkedRequest {
            ctx,
            flow: (priority, tenant.to_string()),
            key,
            head,
            enqueue_ms: self.now,
            data: (),
        });
        let (config, now) = (self.config.clone(), self.now);
        let sat = self.saturation();
        let parked = &self.vms[v].parked;
        let admission = update(&self.store, STATE_KEY, |s: &mut FlowState| {
            s.admit(
                vm_id,
                FlowRef {
                    priority,
                    fairness_id: tenant,
                },
                head,
                &config,
                &band,
                now,
                &sat,
                &|skip| parked.heads(priority, tenant, skip, HEADS_PER_QUEUE),
            )
        })
        .unwrap();
        if admission != Admission::Queued {
            self.vms[v].parked.remove(ctx);
        }
        if admission == Admission::Dispatch {
            self.running.insert(ctx, (v, priority, tenant.to_string()));
            self.dispatched.push((priority, tenant.to_string()));
        }
        self.check();
        (ctx, admission)
    }

    /// VM `v` runs a dispatch cycle; the grants are delivered later by `deliver`.
    fn dispatch_on(&mut self, v: usize) -> usize {
        let _ = v; // any VM can run the cycle: the decision lives in the record
        let (config, now) = (self.config.clone(), self.now);
        let sat = self.saturation();
        let grants = update(&self.store, STATE_KEY, |s: &mut FlowState| {
            s.dispatch(&config, now, 64, &sat)
        })
        .unwrap();
        self.check();
        grants.len()
    }

    /// VM `v` takes its pending grants and resumes that many of its parked requests.
    fn deliver(&mut self, v: usize) {
        let vm_id = self.vms[v].id;
        let now = self.now;
        let parked = &self.vms[v].parked;
        let taken = update(&self.store, STATE_KEY, |s: &mut FlowState| {
            s.take_grants(vm_id, now, 64, &|p, id, skip| {
                parked.heads(p, id, skip, HEADS_PER_QUEUE)
            })
        })
        .unwrap();
        for (priority, id, n) in taken {
            for _ in 0..n {
                let r = self.vms[v]
                    .parked
                    .pop_best(priority, &id)
                    .expect("a grant always finds a request");
                self.running.insert(r.ctx, (v, priority, id.clone()));
                self.dispatched.push((priority, id.clone()));
            }
        }
        self.check();
    }

    /// A running request finishes on its VM.
    fn finish(&mut self, ctx: u32) {
        let (v, _, _) = self.running.remove(&ctx).expect("running");
        let (vm_id, now) = (self.vms[v].id, self.now);
        update(&self.store, STATE_KEY, |s: &mut FlowState| {
            s.finish(vm_id, 10, now)
        })
        .unwrap();
        self.check();
    }

    /// A parked request's client goes away.
    fn cancel(&mut self, v: usize, ctx: u32) -> Cancelled {
        let r = self.vms[v].parked.remove(ctx).expect("parked");
        let (vm_id, now) = (self.vms[v].id, self.now);
        let parked = &self.vms[v].parked;
        let (p, id) = r.flow.clone();
        let out = update(&self.store, STATE_KEY, |s: &mut FlowState| {
            s.cancel(
                vm_id,
                FlowRef {
                    priority: p,
                    fairness_id: &id,
                },
                r.head,
                now,
                &|skip| parked.heads(p, &id, skip, HEADS_PER_QUEUE),
            )
        })
        .unwrap();
        self.check();
        out
    }

    fn deliver_all(&mut self) {
        for v in 0..self.vms.len() {
            self.deliver(v);
        }
    }

    /// Invariants after every step: each VM's parked requests are exactly the record's
    /// queued + granted for that VM, and the pool never has more in flight than capacity.
    fn check(&self) {
        let s = self.state();
        for vm in &self.vms {
            let counted: u64 = s
                .queues
                .iter()
                .filter(|q| q.vm == vm.id)
                .map(|q| u64::from(q.queued + q.granted))
                .sum();
            assert_eq!(
                counted,
                vm.parked.len() as u64,
                "VM {} parked vs record",
                vm.id
            );
        }
        assert!(
            s.in_flight() <= self.capacity,
            "in flight {} > capacity {}",
            s.in_flight(),
            self.capacity
        );
        assert_eq!(
            s.in_flight(),
            self.running.len() as u64 + s.queues.iter().map(|q| u64::from(q.granted)).sum::<u64>()
        );
    }
}

fn config_with(fairness: FairnessPolicy) -> FlowControlConfig {
    let mut c = FlowControlConfig::default();
    c.default_band.fairness = fairness;
    c.default_band.ordering = OrderingPolicy::Fcfs;
    c
}

#[test]
fn with_room_requests_go_straight_through_and_without_it_they_wait() {
    let mut w = World::new(2, 2, FlowControlConfig::default());
    assert_eq!(w.arrive(0, 0, "a").1, Admission::Dispatch);
    assert_eq!(w.arrive(1, 0, "a").1, Admission::Dispatch);
    let (ctx, adm) = w.arrive(0, 0, "a");
    assert_eq!(adm, Admission::Queued, "the pool is full: wait");
    let first = *w.running.keys().min().unwrap();
    w.finish(first);
    assert_eq!(
        w.dispatch_on(1),
        1,
        "the freed slot is granted by whichever VM runs the cycle"
    );
    w.deliver_all();
    assert!(w.running.contains_key(&ctx));
}

#[test]
fn a_premium_request_on_any_worker_goes_before_best_effort_on_another() {
    let mut w = World::new(3, 1, FlowControlConfig::default());
    let (first, _) = w.arrive(0, 0, "x"); // fills the pool
    for _ in 0..5 {
        w.arrive(1, -10, "batch"); // best effort parked on VM 1
    }
    w.arrive(2, 100, "premium"); // premium parked on VM 2, after them
    w.arrive(0, 0, "std"); // standard on VM 0
    w.finish(first);
    w.dispatch_on(1);
    w.deliver_all();
    assert_eq!(w.dispatched.last().unwrap(), &(100, "premium".to_string()));
    let running: Vec<u32> = w.running.keys().copied().collect();
    w.finish(running[0]);
    w.dispatch_on(1);
    w.deliver_all();
    assert_eq!(
        w.dispatched.last().unwrap(),
        &(0, "std".to_string()),
        "then the standard band"
    );
    // Best effort only when nothing above waits.
    let order: Vec<i32> = w.dispatched.iter().map(|d| d.0).collect();
    assert_eq!(order, [0, 100, 0]);
}

#[test]
fn round_robin_gives_backlogged_tenants_equal_turns_across_workers() {
    let mut w = World::new(4, 4, config_with(FairnessPolicy::RoundRobin));
    // Fill the pool, then build backlogs: "heavy" sends 10x, spread over all VMs.
    let mut initial = Vec::new();
    for v in 0..4 {
        initial.push(w.arrive(v, 0, "warm").0);
    }
    for i in 0..200 {
        w.arrive(i % 4, 0, "heavy");
        if i % 10 == 0 {
            for (j, t) in ["t1", "t2", "t3"].iter().enumerate() {
                w.arrive((i / 10 + j) % 4, 0, t);
            }
        }
    }
    // Drain 60 dispatches while all four tenants stay backlogged.
    let mut done = initial;
    for step in 0..60 {
        let ctx = done.remove(0);
        w.finish(ctx);
        w.dispatch_on(step % 4);
        w.deliver_all();
        done.extend(
            w.running
                .keys()
                .copied()
                .filter(|c| !done.contains(c))
                .collect::<Vec<_>>(),
        );
    }
    let counts = |t: &str| w.dispatched.iter().filter(|d| d.1 == t).count();
    for t in ["heavy", "t1", "t2", "t3"] {
        assert_eq!(counts(t), 15, "{t}: {:?}", w.dispatched);
    }
}

#[test]
fn global_strict_serves_in_arrival_order_across_workers() {
    let mut w = World::new(3, 1, config_with(FairnessPolicy::GlobalStrict));
    let (first, _) = w.arrive(0, 0, "warm");
    let mut expected = Vec::new();
    for i in 0..12 {
        let tenant = ["a", "b", "c"][i % 3];
        w.arrive((i * 7) % 3, 0, tenant);
        expected.push(tenant.to_string());
    }
    let mut running = first;
    for step in 0..12 {
        w.finish(running);
        w.dispatch_on(step % 3);
        w.deliver_all();
        running = *w.running.keys().next().unwrap();
    }
    let got: Vec<String> = w.dispatched.iter().skip(1).map(|d| d.1.clone()).collect();
    assert_eq!(got, expected);
}

#[test]
fn capacity_limits_reject_exactly_at_the_limit() {
    let config = FlowControlConfig {
        max_requests: 3,
        ..FlowControlConfig::default()
    };
    let mut w = World::new(2, 1, config);
    w.arrive(0, 0, "a"); // dispatched
    for i in 0..3 {
        assert_eq!(w.arrive(i % 2, 0, "a").1, Admission::Queued);
    }
    assert_eq!(
        w.arrive(1, 5, "a").1,
        Admission::Rejected(Limit::GlobalRequests)
    );

    let mut config = FlowControlConfig::default();
    config.bands.push(epp_filter::flow_control::config::Band {
        priority: -1,
        max_requests: 2,
        ..config.default_band.clone()
    });
    let mut w = World::new(2, 1, config);
    w.arrive(0, 0, "a");
    assert_eq!(w.arrive(0, -1, "b").1, Admission::Queued);
    assert_eq!(w.arrive(1, -1, "b").1, Admission::Queued);
    assert_eq!(
        w.arrive(1, -1, "b").1,
        Admission::Rejected(Limit::BandRequests)
    );
    assert_eq!(
        w.arrive(1, 0, "c").1,
        Admission::Queued,
        "other bands keep their room"
    );
}

#[test]
fn cancellation_leaves_no_residue_even_with_a_grant_in_transit() {
    let mut w = World::new(2, 1, FlowControlConfig::default());
    let (first, _) = w.arrive(0, 0, "a");
    let (c1, _) = w.arrive(1, 0, "a");
    let (c2, _) = w.arrive(1, 0, "a");
    assert_eq!(w.cancel(1, c2), Cancelled::Dequeued);
    w.finish(first);
    assert_eq!(w.dispatch_on(0), 1); // grant for VM 1 in transit...
    assert_eq!(w.cancel(1, c1), Cancelled::GrantReturned); // ...and its client leaves
    let s = w.state();
    assert_eq!(s.in_flight(), 0, "the reservation came back");
    assert_eq!(s.queued(None), 0);
    assert!(s.queues.is_empty() && s.vms.is_empty(), "{s:?}");
    // The pool is free again for the next request.
    assert_eq!(w.arrive(0, 0, "b").1, Admission::Dispatch);
}

#[test]
fn a_dead_workers_queue_and_load_disappear() {
    let mut w = World::new(2, 1, FlowControlConfig::default());
    w.arrive(1, 0, "a"); // VM 1 holds the only slot, then dies
    w.arrive(1, 0, "a");
    w.now += epp_filter::flow_control::state::VM_STALE_MS + 1;
    w.vms[1].parked = Parked::default(); // its streams died with it
    w.running.clear();
    assert_eq!(
        w.arrive(0, 0, "b").1,
        Admission::Dispatch,
        "capacity is not leaked"
    );
}

#[test]
fn random_interleavings_keep_the_invariants() {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let mut config = config_with(FairnessPolicy::RoundRobin);
    config.max_requests = 40;
    let mut w = World::new(4, 5, config);
    for _ in 0..3000 {
        match rnd(6) {
            0 | 1 => {
                let tenant = ["a", "b", "c"][rnd(3)];
                let priority = [-1, 0, 10][rnd(3)];
                w.arrive(rnd(4), priority, tenant);
            }
            2 => {
                let running: Vec<u32> = w.running.keys().copied().collect();
                if !running.is_empty() {
                    w.finish(running[rnd(running.len())]);
                }
            }
            3 => {
                w.dispatch_on(rnd(4));
            }
            4 => w.deliver(rnd(4)),
            _ => {
                let v = rnd(4);
                if let Some(ctx) = w.vms[v].parked.some(1).first().copied() {
                    w.cancel(v, ctx);
                }
            }
        }
    }
    // Drain: everything parked is eventually dispatched.
    for _ in 0..500 {
        let running: Vec<u32> = w.running.keys().copied().collect();
        for c in running {
            w.finish(c);
        }
        w.dispatch_on(0);
        w.deliver_all();
    }
    assert!(w.vms.iter().all(|v| v.parked.is_empty()));
}
