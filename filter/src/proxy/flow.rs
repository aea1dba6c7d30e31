//! Flow control on Envoy's callbacks: admission on the request path, parking the
//! stream, and waking it when the global dispatcher grants it — on this VM or, through
//! a message to its inbox queue, on the VM that holds it.
//!
//! Every decision is one CAS of the shared state (`flow_control::state`); this module
//! only moves streams: `set_effective_context` + destination header + resume, or a local
//! reply. Wake-ups and replies are capped per callback: waking many streams in one
//! callback nests deeply in V8 and can exhaust its stack.

use super::route::RouteInput;
use super::vm::{self, Running, Waiting};
use super::{host, route, stats, store::HostStore};
use crate::datalayer::subset_allows;
use crate::endpoint::Endpoint;
use crate::errors::ApiError;
use crate::flow_control::legacy;
use crate::flow_control::ordering::OrderInputs;
use crate::flow_control::outcome::Outcome;
use crate::flow_control::parked::ParkedRequest;
use crate::flow_control::saturation::{concurrency, reported, with_unseen, EndpointLoad, PoolLoad};
use crate::flow_control::state::{
    Admission, Cancelled, FlowRef, FlowState, Grant, Head, HEADS_PER_QUEUE, STATE_KEY,
};
use crate::flow_control::ttl;
use crate::inflight::{self, endpoint_key};
use crate::metrics;
use crate::runtime::Runtime;
use crate::shared_store::{ensure, update};

/// Most streams woken or answered in one callback.
pub const MAX_WAKES_PER_CALLBACK: usize = 64;
/// Prefix of each VM's inbox queue name (followed by the VM id).
pub const INBOX_PREFIX: &str = "epp.v1.inbox.";

/// What flow control needs to know about a request.
pub struct RequestMeta<'a> {
    /// `x-gateway-inference-fairness-id` (or its default).
    pub fairness_id: &'a str,
    /// The priority of its objective.
    pub priority: i32,
    /// Its `model`.
    pub model: &'a str,
    /// Body bytes.
    pub bytes: u64,
    /// When its headers arrived (µs).
    pub received_us: u64,
    /// `x-slo-ttft-ms`.
    pub slo_ttft_ms: Option<u64>,
    /// What routing needs when the request is released.
    pub route: &'a RouteInput,
}

/// The admission decision.
pub enum Admit {
    /// Route it now; `flow_controlled` when counted in flight by flow control, which
    /// dispatched it at `dispatched_ms`.
    Go {
        /// When flow control dispatched it (ms; 0 when it did not).
        dispatched_ms: u64,
        /// Counted by flow control (tell it when the request finishes).
        flow_controlled: bool,
        /// Token estimate.
        tokens: u64,
    },
    /// Parked: the stream stays paused until released.
    Parked,
    /// Refused: answer with this error.
    Reject(ApiError),
}

/// The pool as this VM sees it: scraped endpoint loads for the utilization detector
/// (an endpoint not scraped yet reads as never scraped, i.e. saturated until it is), and
/// how many endpoints a request could be sent to now.
struct PoolView {
    loads: Vec<EndpointLoad>,
    available: usize,
}

fn endpoint_loads(rt: &Runtime) -> PoolView {
    pool_view(rt, None)
}

/// [`PoolView`] of the endpoints within a subset hint.
fn pool_view(rt: &Runtime, subset: Option<&[String]>) -> PoolView {
    let discovery = rt.pool.discovery.is_some();
    vm::with(|vm| {
        vm.view.refresh(discovery);
        let available = vm
            .view
            .with_candidates(&rt.pool.endpoints, subset, |c| c.len());
        PoolView {
            loads: vm.view.loads(&rt.pool.endpoints, subset),
            available,
        }
    })
    .unwrap_or(PoolView {
        loads: Vec::new(),
        available: 0,
    })
}

/// The pool's saturation for `state` (in-flight counts come from the shared state).
fn saturation(rt: &Runtime, view: &PoolView, state: &FlowState, now_ms: u64) -> f64 {
    let loads = with_unseen(&view.loads, |since| state.dispatched_since(since));
    pool_saturation(
        rt,
        &loads,
        view.available,
        (state.in_flight(), state.in_flight_tokens()),
        now_ms,
    )
}

fn pool_saturation(
    rt: &Runtime,
    loads: &[EndpointLoad],
    available: usize,
    in_flight: (u64, u64),
    now_ms: u64,
) -> f64 {
    rt.flow.detector.saturation(&PoolLoad {
        endpoints: loads,
        endpoint_count: loads.len(),
        available,
        in_flight_requests: in_flight.0,
        in_flight_tokens: in_flight.1,
        now_ms,
    })
}

/// The pool gauges of flow control, set between dispatch cycles too (by the scrape-lease
/// holder after each scrape) so an idle pool's saturation does not freeze: the
/// detector's value and its count of stale endpoints.
pub fn pool_gauges(rt: &Runtime, now_ms: i64) {
    let now = u64::try_from(now_ms).unwrap_or(0);
    let view = endpoint_loads(rt);
    let in_flight = ledger_in_flight(rt, now, None);
    let pool = PoolLoad {
        endpoints: &view.loads,
        endpoint_count: view.loads.len(),
        available: view.available,
        in_flight_requests: in_flight.0,
        in_flight_tokens: in_flight.1,
        now_ms: now,
    };
    let sat = reported(rt.flow.detector.saturation(&pool));
    stats::set_value(&metrics::FLOW_POOL_SATURATION, &[&rt.pool.name], sat);
    if let Some(stale) = rt.flow.detector.stale(&pool) {
        stats::set(
            &metrics::FLOW_STALE_ENDPOINTS,
            &[rt.flow.detector.type_name()],
            stale,
        );
    }
}

/// Requests and tokens in flight pool-wide from the per-endpoint ledger, which counts every
/// routed request, with or without flow control; with a subset hint, on the pool's
/// endpoints within it.
fn ledger_in_flight(rt: &Runtime, now_ms: u64, subset: Option<&[String]>) -> (u64, u64) {
    let mut ledger = inflight::read(&HostStore).unwrap_or_default();
    ledger.drop_stale(i64::try_from(now_ms).unwrap_or(i64::MAX));
    if subset.is_none() {
        return ledger.total();
    }
    let loads = ledger.loads();
    let mut within: hashbrown::HashSet<u64> = hashbrown::HashSet::new();
    let mut add = |endpoints: &[Endpoint]| {
        for e in endpoints {
            if subset_allows(subset, &e.address) {
                within.insert(endpoint_key(&e.address));
            }
        }
    };
    add(&rt.pool.endpoints);
    vm::with(|vm| add(&vm.view.discovered));
    within
        .iter()
        .filter_map(|k| loads.get(*k))
        .fold((0, 0), |(r, t), l| (r + l.requests, t + l.tokens))
}

fn queue_labels<'a>(
    rt: &'a Runtime,
    fairness_id: &'a str,
    priority: &'a str,
    route: &'a RouteInput,
) -> [&'a str; 5] {
    [
        fairness_id,
        priority,
        &rt.pool.name,
        &route.model,
        &route.target,
    ]
}

/// Raises (`sign` 1) or lowers (-1) the queue-size and queue-bytes gauges by one request,
/// through the series resolved when it arrived (the same series both ways), or by labels
/// when those went stale (idle series were dropped meanwhile).
fn queue_gauges(w: &Waiting, labels: &[&str], sign: i64) {
    let bytes = sign.saturating_mul(i64::try_from(w.bytes).unwrap_or(i64::MAX));
    let kept = w.queue_series.is_some_and(|[size, b]| {
        stats::apply(&[
            (size, &metrics::FLOW_QUEUE_SIZE, stats::Update::Add(sign)),
            (b, &metrics::FLOW_QUEUE_BYTES, stats::Update::Add(bytes)),
        ])
    });
    if !kept {
        stats::add(&metrics::FLOW_QUEUE_SIZE, labels, sign);
        stats::add(&metrics::FLOW_QUEUE_BYTES, labels, bytes);
    }
}

/// Records a request's final outcome in the queue metrics.
fn finalize(rt: &Runtime, w: &Waiting, outcome: Outcome, parked: bool, now_us: u64) {
    let mut priority = itoa::Buffer::new();
    let priority = priority.format(w.priority);
    if parked {
        let labels = queue_labels(rt, &w.fairness_id, priority, &w.route);
        queue_gauges(w, &labels, -1);
    }
    stats::record(
        &metrics::FLOW_QUEUE_DURATION,
        &[
            &w.fairness_id,
            priority,
            outcome.label(),
            &rt.pool.name,
            &w.route.model,
            &w.route.target,
        ],
        now_us.saturating_sub(w.enqueue_us),
    );
    stats::add(
        &metrics::FLOW_REQUESTS,
        &[outcome.label(), priority, &rt.pool.name],
        1,
    );
}

/// Admits a request whose body has arrived (its stream is the current one).
pub fn admit(ctx: u32, req: &RequestMeta<'_>) -> Admit {
    let tokens = concurrency::estimate_tokens(req.bytes);
    let Some(rt) = vm::runtime() else {
        return Admit::Go {
            dispatched_ms: 0,
            flow_controlled: false,
            tokens,
        };
    };
    if !rt.flow.enabled {
        // Flow control's own in-flight record is not kept with the gate off: the ledger's.
        let saturation = || {
            let now_ms = host::clock_us() / 1000;
            // Legacy admission reads the request's subset hint, as the reference's does.
            let subset = req.route.subset.as_deref();
            let view = pool_view(&rt, subset);
            pool_saturation(
                &rt,
                &view.loads,
                view.available,
                ledger_in_flight(&rt, now_ms, subset),
                now_ms,
            )
        };
        return match legacy::admit(req.priority, saturation) {
            Ok(()) => Admit::Go {
                dispatched_ms: 0,
                flow_controlled: false,
                tokens,
            },
            Err(e) => Admit::Reject(e),
        };
    }
    let now_us = host::clock_us();
    let now_ms = now_us / 1000;
    let loads = endpoint_loads(&rt);
    let control = &rt.flow.control;
    let band = control.band(req.priority);
    let key = band.ordering.key(&OrderInputs {
        enqueue_ms: now_ms,
        received_ms: req.received_us / 1000,
        ttl_ms: control.default_ttl_ms,
        slo_ttft_ms: req.slo_ttft_ms,
    });
    let head = Head {
        primary: key.primary,
        secondary: key.secondary,
        bytes: req.bytes,
        tokens,
    };
    let me = vm::id();
    let mut priority = itoa::Buffer::new();
    let priority = priority.format(req.priority);
    let labels = queue_labels(&rt, req.fairness_id, priority, req.route);
    let queue_series = stats::resolve(&metrics::FLOW_QUEUE_SIZE, &labels)
        .zip(stats::resolve(&metrics::FLOW_QUEUE_BYTES, &labels))
        .map(|(size, bytes)| [size, bytes]);
    let waiting = Waiting {
        model: req.model.to_string(),
        fairness_id: req.fairness_id.to_string(),
        priority: req.priority,
        bytes: req.bytes,
        tokens,
        enqueue_us: now_us,
        route: req.route.clone(),
        queue_series,
    };
    let decided = vm::with(|vm| {
        // Parked first, so the heads published with it include it.
        vm.parked.park(ParkedRequest {
            ctx,
            flow: (req.priority, req.fairness_id.to_string()),
            key,
            head,
            enqueue_ms: now_ms,
            data: waiting.clone(),
        });
        let parked = &vm.parked;
        let result = update(&HostStore, STATE_KEY, |s: &mut FlowState| {
            s.admit(
                me,
                FlowRef {
                    priority: req.priority,
                    fairness_id: req.fairness_id,
                },
                head,
                control,
                &band,
                now_ms,
                &|s| saturation(&rt, &loads, s, now_ms),
                &|skip| parked.heads(req.priority, req.fairness_id, skip, HEADS_PER_QUEUE),
            )
        });
        if !matches!(result, Ok(Admission::Queued)) {
            vm.parked.remove(ctx);
        }
        result
    });
    // The admission's own duration; a queued request's outcome is not known yet (the
    // reference's `NotYetFinalized`).
    let enqueued = |outcome: &str| {
        stats::record(
            &metrics::FLOW_ENQUEUE_DURATION,
            &[req.fairness_id, priority, outcome],
            host::clock_us().saturating_sub(now_us),
        );
    };
    let outcome_label = |o: Outcome| enqueued(o.label());
    match decided {
        Some(Ok(Admission::Dispatch)) => {
            outcome_label(Outcome::Dispatched);
            finalize(&rt, &waiting, Outcome::Dispatched, false, now_us);
            Admit::Go {
                dispatched_ms: now_ms,
                flow_controlled: true,
                tokens,
            }
        }
        Some(Ok(Admission::Queued)) => {
            enqueued("NotYetFinalized");
            queue_gauges(&waiting, &labels, 1);
            Admit::Parked
        }
        Some(Ok(Admission::Rejected(limit))) => {
            let outcome = Outcome::RejectedCapacity(limit);
            outcome_label(outcome);
            finalize(&rt, &waiting, outcome, false, now_us);
            match outcome.error(control.budgets()) {
                Some(e) => Admit::Reject(e),
                None => Admit::Go {
                    dispatched_ms: 0,
                    flow_controlled: false,
                    tokens,
                },
            }
        }
        Some(Err(e)) => {
            // The shared state is unusable: serve rather than hold requests forever.
            log::error!("flow control state unavailable ({e:?}); admitting without it");
            Admit::Go {
                dispatched_ms: 0,
                flow_controlled: false,
                tokens,
            }
        }
        None => Admit::Go {
            dispatched_ms: 0,
            flow_controlled: false,
            tokens,
        },
    }
}

/// A request routed upstream finished: free its slot and dispatch what waits.
/// `current` is the context making the call (restored after waking others).
pub fn finished(running: &Running, current: u32) {
    if !running.flow_controlled {
        return;
    }
    let Some(rt) = vm::runtime() else {
        return;
    };
    let me = vm::id();
    let now_ms = host::clock_ms().unsigned_abs();
    let loads = endpoint_loads(&rt);
    let grants = update(&HostStore, STATE_KEY, |s: &mut FlowState| {
        s.finish(me, running.tokens, now_ms);
        if running.dispatched_ms > 0 {
            s.forget_dispatch(running.dispatched_ms);
        }
        if s.queued(None) > 0 {
            dispatch_cycle(&rt, &loads, s, now_ms)
        } else {
            Vec::new()
        }
    });
    match grants {
        Ok(g) => deliver(&g, current),
        Err(e) => log::warn!("flow control: finishing a request failed: {e:?}"),
    }
}

fn dispatch_cycle(rt: &Runtime, loads: &PoolView, s: &mut FlowState, now_ms: u64) -> Vec<Grant> {
    let started = host::clock_us();
    let grants = s.dispatch(&rt.flow.control, now_ms, MAX_WAKES_PER_CALLBACK, &|s| {
        saturation(rt, loads, s, now_ms)
    });
    stats::record(
        &metrics::FLOW_DISPATCH_CYCLE_DURATION,
        &[],
        host::clock_us().saturating_sub(started),
    );
    grants
}

/// Hands grants to their VMs: this VM's are taken at once, others get a message.
fn deliver(grants: &[Grant], current: u32) {
    let me = vm::id();
    let mut nudged: Vec<u64> = Vec::new();
    for g in grants {
        if g.vm != me && !nudged.contains(&g.vm) {
            nudged.push(g.vm);
            nudge(g.vm);
        }
    }
    if grants.iter().any(|g| g.vm == me) {
        take_and_wake(current);
    }
}

/// Tells VM `target` it has grants (it also finds them on its next tick).
fn nudge(target: u64) {
    let name = format!("{INBOX_PREFIX}{target}");
    let queue = vm::with(|vm| (vm.peers.get(&target).copied(), vm.plugin_vm_id.clone()));
    let Some((cached, plugin_vm_id)) = queue else {
        return;
    };
    let id = match cached {
        Some(id) => Some(id),
        None => match host::resolve_queue(&plugin_vm_id, &name) {
            Ok(Some(id)) => {
                vm::with(|vm| vm.peers.insert(target, id));
                Some(id)
            }
            Ok(None) => None,
            Err(status) => {
                log::warn!("cannot resolve inbox of VM {target}: status {status}");
                None
            }
        },
    };
    if let Some(id) = id {
        if let Err(status) = host::enqueue(id, b"g") {
            log::warn!("cannot message VM {target}: status {status}");
            vm::with(|vm| vm.peers.remove(&target));
        }
    }
}

/// Takes this VM's pending grants (bounded) and resumes that many parked streams.
pub fn take_and_wake(current: u32) {
    let me = vm::id();
    let now_ms = host::clock_ms().unsigned_abs();
    let released = vm::with(|vm| {
        let parked = &vm.parked;
        let taken = update(&HostStore, STATE_KEY, |s: &mut FlowState| {
            let taken = s.take_grants(me, now_ms, MAX_WAKES_PER_CALLBACK, &|p, id, skip| {
                parked.heads(p, id, skip, HEADS_PER_QUEUE)
            });
            (taken, s.has_grants(me))
        });
        let (taken, more) = match taken {
            Ok(t) => t,
            Err(e) => {
                log::warn!("flow control: taking grants failed: {e:?}");
                return (Vec::new(), false, 0);
            }
        };
        let mut out = Vec::new();
        let mut missing = 0u64;
        for (priority, id, n) in taken {
            for _ in 0..n {
                match vm.parked.pop_best(priority, &id) {
                    Some(r) => out.push(r),
                    None => missing += 1,
                }
            }
        }
        (out, more, missing)
    });
    let Some((released, more, missing)) = released else {
        return;
    };
    for _ in 0..missing {
        // A grant found nothing to release (cannot happen while the invariant holds):
        // give its slot back rather than leak it.
        let _ = update(&HostStore, STATE_KEY, |s: &mut FlowState| {
            s.finish(me, 0, now_ms)
        });
    }
    for r in released {
        wake(r, current);
    }
    if more {
        nudge(me);
    }
}

/// Resumes one released stream: route it, or answer it if it cannot be routed.
fn wake(r: ParkedRequest<Waiting>, current: u32) {
    let Some(rt) = vm::runtime() else {
        return;
    };
    let me = vm::id();
    let now_us = host::clock_us();
    let w = r.data;
    let give_back = |tokens: u64| {
        let now_ms = now_us / 1000;
        let _ = update(&HostStore, STATE_KEY, |s: &mut FlowState| {
            s.finish(me, tokens, now_ms);
            // Granted moments ago, and it will not reach a server.
            s.forget_dispatch(now_ms);
        });
    };
    if vm::with(|vm| vm.draining).unwrap_or(false) {
        // The plugin is going away: a request released now is answered like the rest
        // of the parked ones (500), not sent upstream; its slot goes back to the pool.
        finalize(&rt, &w, Outcome::EvictedOther, true, now_us);
        give_back(w.tokens);
        if let Ok(_stream) = host::on_stream(r.ctx, current) {
            if let Some(e) = Outcome::EvictedOther.error(rt.flow.control.budgets()) {
                route::reply(&e, w.route.api, &w.model, &[]);
            }
        }
        return;
    }
    finalize(&rt, &w, Outcome::Dispatched, true, now_us);
    let Ok(_stream) = host::on_stream(r.ctx, current) else {
        // The stream is gone (its on_done has not run yet): free the slot.
        give_back(w.tokens);
        return;
    };
    match route::route(me, r.ctx, &rt, &w.route, None, w.tokens) {
        Ok(sent) => {
            if let Err(status) = host::resume_request() {
                log::error!("cannot resume a released request: status {status}");
            }
            vm::with(|vm| {
                vm.running.insert(
                    r.ctx,
                    Running {
                        dispatched_ms: now_us / 1000,
                        series: sent.series,
                        ..Running::new(sent.endpoint, &w.route, w.tokens, true, w.enqueue_us)
                    },
                )
            });
        }
        Err(e) => {
            give_back(w.tokens);
            route::reply(&e, w.route.api, &w.model, &[]);
        }
    }
}

/// A parked request's stream ended (client gone): remove it and free what it held.
/// Returns whether it was parked here.
pub fn cancelled(ctx: u32, current: u32) -> bool {
    // Nothing parked (always so with flow control off): nothing to look up.
    let Some(Some(r)) = vm::with(|vm| {
        if vm.parked.is_empty() {
            None
        } else {
            vm.parked.remove(ctx)
        }
    }) else {
        return false;
    };
    let Some(rt) = vm::runtime() else {
        return true;
    };
    let now_us = host::clock_us();
    finalize(&rt, &r.data, Outcome::EvictedContextCancelled, true, now_us);
    if let Some(Ok(Cancelled::GrantReturned)) = evict_from_state(&r) {
        // Its slot came back: give it to the next request.
        let now_ms = now_us / 1000;
        let loads = endpoint_loads(&rt);
        if let Ok(g) = update(&HostStore, STATE_KEY, |s: &mut FlowState| {
            dispatch_cycle(&rt, &loads, s, now_ms)
        }) {
            deliver(&g, current);
        }
    }
    true
}

fn evict_from_state(
    r: &ParkedRequest<Waiting>,
) -> Option<Result<Cancelled, crate::shared_store::StoreError>> {
    let me = vm::id();
    let now_ms = host::clock_ms().unsigned_abs();
    vm::with(|vm| {
        let parked = &vm.parked;
        let (priority, id) = (r.flow.0, r.flow.1.as_str());
        update(&HostStore, STATE_KEY, |s: &mut FlowState| {
            s.cancel(
                me,
                FlowRef {
                    priority,
                    fairness_id: id,
                },
                r.head,
                now_ms,
                &|skip| parked.heads(priority, id, skip, HEADS_PER_QUEUE),
            )
        })
    })
}

/// Answers parked requests with `outcome`'s error (TTL expiry, shutdown), at most
/// [`MAX_WAKES_PER_CALLBACK`]. Returns how many were answered.
fn evict(ctxs: Vec<u32>, outcome: Outcome, current: u32) -> usize {
    let Some(rt) = vm::runtime() else {
        return 0;
    };
    let mut n = 0;
    for ctx in ctxs.into_iter().take(MAX_WAKES_PER_CALLBACK) {
        let Some(Some(r)) = vm::with(|vm| vm.parked.remove(ctx)) else {
            continue;
        };
        let now_us = host::clock_us();
        finalize(&rt, &r.data, outcome, true, now_us);
        if let Some(Ok(Cancelled::GrantReturned)) = evict_from_state(&r) {
            log::debug!("an evicted request's grant was returned");
        }
        if let Ok(_stream) = host::on_stream(ctx, current) {
            if let Some(e) = outcome.error(rt.flow.control.budgets()) {
                route::reply(&e, r.data.route.api, &r.data.model, &[]);
            }
        }
        n += 1;
    }
    n
}

/// Periodic work of every VM (the root's tick): TTL expiry, grants whose message was
/// lost, a dispatch cycle (saturation may have dropped), and liveness.
pub fn on_tick(root: u32) {
    let Some(rt) = vm::runtime() else {
        return;
    };
    if !rt.flow.enabled {
        return;
    }
    let now_ms = host::clock_ms().unsigned_abs();
    let loads = endpoint_loads(&rt);
    let budgets = rt.flow.control.budgets();
    let (expired, regime) = vm::with(|vm| {
        vm.regime.observe(loads.available == 0, now_ms);
        let expired = ttl::cutoff(budgets, vm.regime, now_ms)
            .map(|c| vm.parked.expired(c, MAX_WAKES_PER_CALLBACK))
            .unwrap_or_default();
        (expired, vm.regime)
    })
    .unwrap_or_default();
    let outcome = if regime.empty {
        Outcome::EvictedNoEndpoints
    } else {
        Outcome::EvictedTtl
    };
    evict(expired, outcome, root);
    let me = vm::id();
    let grants = update(&HostStore, STATE_KEY, |s: &mut FlowState| {
        s.heartbeat(me, now_ms);
        if s.queued(None) > 0 {
            dispatch_cycle(&rt, &loads, s, now_ms)
        } else {
            Vec::new()
        }
    });
    match grants {
        Ok(g) => deliver(&g, root),
        Err(e) => log::warn!("flow control tick failed: {e:?}"),
    }
    take_and_wake(root);
}

/// The inbox queue has messages: drain it and take this VM's grants.
pub fn on_inbox(root: u32) {
    let Some(queue) = vm::with(|vm| vm.inbox).flatten() else {
        return;
    };
    for _ in 0..1024 {
        match host::dequeue(queue) {
            Ok(Some(_)) => continue,
            Ok(None) => break,
            Err(status) => {
                log::warn!("inbox dequeue failed: status {status}");
                break;
            }
        }
    }
    take_and_wake(root);
}

/// Prepares flow control for this VM at configure time: its inbox and the shared state.
pub fn configure() {
    let me = vm::id();
    match host::register_queue(&format!("{INBOX_PREFIX}{me}")) {
        Ok(id) => {
            vm::with(|vm| vm.inbox = Some(id));
        }
        Err(status) => log::warn!("cannot register the inbox queue: status {status}"),
    }
    if let Err(e) = ensure(&HostStore, STATE_KEY) {
        log::warn!("cannot create the flow control state: {e:?}");
    }
}

/// The plugin is going away: answer parked requests with 500 (a batch per call).
/// Returns whether nothing is left parked.
pub fn shutdown(root: u32) -> bool {
    vm::with(|vm| vm.draining = true);
    let some = vm::with(|vm| vm.parked.some(MAX_WAKES_PER_CALLBACK)).unwrap_or_default();
    evict(some, Outcome::EvictedOther, root);
    vm::with(|vm| vm.parked.is_empty()).unwrap_or(true)
}
