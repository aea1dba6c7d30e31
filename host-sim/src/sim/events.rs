//! The events of the simulated process and the loop that handles them: what each event
//! is, which VM it needs (while another VM is suspended in a callback), and the
//! bookkeeping around each (clock, trace hash, deferred stream ends, invariants).

use super::config::Control;
use super::upstreams::{UpRef, UpReq};
use super::Sim;
use crate::host::vm::{Callback, CalloutResponse};
use crate::world::clock::{Nanos, MS};
use crate::world::events::EventQueue;
use crate::world::upstream::Emit;
use crate::{slot_of_worker, SLOT_BASE, SLOT_MAIN};
use anyhow::{bail, Result};
use std::collections::HashMap;

/// One event of the simulated process.
pub(super) enum Ev {
    /// A thread-local VM is created on thread `slot` (or the base VM, slot 0).
    VmStart { slot: usize },
    /// VM `vm`'s root ticks, if the tick is of the current generation.
    Tick { vm: usize, gen: u64 },
    /// `on_queue_ready` for the queue `token` registered by `root` on thread `slot`.
    QueueReady { slot: usize, root: u32, token: u32 },
    /// Request `rid`'s headers reach Envoy.
    Headers { rid: usize },
    /// `len` more bytes of request `rid`'s body reach Envoy.
    Body { rid: usize, len: usize },
    /// The end of request `rid`'s body reaches Envoy.
    BodyEnd { rid: usize },
    /// Request `rid`'s client disconnects.
    Disconnect { rid: usize },
    /// Upstream request `uid` reaches its server.
    UpstreamArrive { uid: u64 },
    /// Endpoint `ep` has something due, if the wake-up is of its current generation.
    UpstreamWake { ep: usize, gen: u64 },
    /// A piece of upstream request `uid`'s response reaches Envoy.
    Deliver { uid: u64, emit: Emit },
    /// The router's connection for request `rid` was refused.
    ConnectFail { rid: usize },
    /// VM `vm`'s callout `token` is answered.
    CalloutDone {
        vm: usize,
        token: u32,
        resp: CalloutResponse,
    },
    /// VM `vm`'s callout `token` times out.
    CalloutTimeout { vm: usize, token: u32 },
    /// Envoy's stream idle timer for request `rid`.
    IdleCheck { rid: usize },
    /// The scenario's scheduled change number `idx`.
    Control { idx: usize },
}

impl Ev {
    /// The event as two numbers, for the trace hash.
    fn code(&self) -> (u64, u64) {
        match self {
            Ev::VmStart { slot } => (1, *slot as u64),
            Ev::Tick { vm, .. } => (2, *vm as u64),
            Ev::QueueReady { slot, token, .. } => (3, (*slot as u64) << 32 | u64::from(*token)),
            Ev::Headers { rid } => (4, *rid as u64),
            Ev::Body { rid, len } => (5, (*rid as u64) << 32 | *len as u64),
            Ev::BodyEnd { rid } => (6, *rid as u64),
            Ev::Disconnect { rid } => (7, *rid as u64),
            Ev::UpstreamArrive { uid } => (8, *uid),
            Ev::UpstreamWake { ep, .. } => (9, *ep as u64),
            Ev::Deliver { uid, emit } => (
                10 + match emit {
                    Emit::Head { .. } => 0,
                    Emit::Data { .. } => 1,
                    Emit::End { .. } => 2,
                },
                *uid,
            ),
            Ev::ConnectFail { rid } => (13, *rid as u64),
            Ev::CalloutDone { vm, token, .. } => (14, (*vm as u64) << 32 | u64::from(*token)),
            Ev::CalloutTimeout { vm, token } => (15, (*vm as u64) << 32 | u64::from(*token)),
            Ev::IdleCheck { rid } => (16, *rid as u64),
            Ev::Control { idx } => (17, *idx as u64),
        }
    }

    /// The event in words, for the trace and violation reports.
    fn describe(&self) -> String {
        match self {
            Ev::VmStart { slot } => format!("vm-start slot={slot}"),
            Ev::Tick { vm, .. } => format!("tick vm={vm}"),
            Ev::QueueReady { slot, root, token } => {
                format!("queue-ready slot={slot} root={root} token={token}")
            }
            Ev::Headers { rid } => format!("request-headers rid={rid}"),
            Ev::Body { rid, len } => format!("request-body rid={rid} len={len}"),
            Ev::BodyEnd { rid } => format!("request-end rid={rid}"),
            Ev::Disconnect { rid } => format!("client-disconnect rid={rid}"),
            Ev::UpstreamArrive { uid } => format!("upstream-arrive uid={uid}"),
            Ev::UpstreamWake { ep, .. } => format!("upstream-wake ep={ep}"),
            Ev::Deliver { uid, emit } => match emit {
                Emit::Head { status, .. } => format!("response-head uid={uid} status={status}"),
                Emit::Data { bytes, .. } => format!("response-data uid={uid} len={}", bytes.len()),
                Emit::End { .. } => format!("response-end uid={uid}"),
            },
            Ev::ConnectFail { rid } => format!("connect-fail rid={rid}"),
            Ev::CalloutDone { vm, token, .. } => format!("callout-done vm={vm} token={token}"),
            Ev::CalloutTimeout { vm, token } => format!("callout-timeout vm={vm} token={token}"),
            Ev::IdleCheck { rid } => format!("idle-check rid={rid}"),
            Ev::Control { idx } => format!("control #{idx}"),
        }
    }

    /// Ticks and idle checks recur on their own; every other event is work that keeps a
    /// run going.
    fn is_work(&self) -> bool {
        !matches!(self, Ev::Tick { .. } | Ev::IdleCheck { .. })
    }
}

/// Pending events and what belongs to handling them.
#[derive(Default)]
pub(super) struct Events {
    /// Pending events by virtual time (ties broken by a seeded key).
    pub(super) queue: EventQueue<Ev>,
    /// Pending events that are work ([`Ev::is_work`]): [`Sim::run`] ends when none is left.
    pub(super) work_pending: usize,
    /// The scenario's scheduled changes, taken when their [`Ev::Control`] fires.
    pub(super) controls: Vec<Option<Control>>,
    /// The event being handled, described (when tracing or checking invariants).
    pub(super) current: String,
    /// An error from an event handled while a callback was suspended, reported when the
    /// outer event is done.
    pub(super) deferred_error: Option<anyhow::Error>,
}

/// The slot whose VM receives what is addressed to `slot`: a replica's base VM's thread
/// is its main thread.
fn main_if_base(slot: usize, per_replica: usize) -> usize {
    if slot % per_replica == SLOT_BASE {
        slot - SLOT_BASE + SLOT_MAIN
    } else {
        slot
    }
}

/// Which VM an event needs.
pub(super) enum Target {
    /// None: it can run while any VM is suspended.
    Free,
    /// This VM (busy while it is suspended in a callback).
    Vm(usize),
    /// Every VM ([`Control`] may call into all of them).
    All,
}

impl Target {
    /// Which VM `ev` needs, given the streams, upstream requests and the VM serving each
    /// thread slot.
    pub(super) fn of(
        ev: &Ev,
        streams: &[super::stream::Stream],
        upstream: &HashMap<u64, UpReq>,
        vm_of_slot: &[Option<usize>],
        per_replica: usize,
    ) -> Target {
        let of_slot = |slot: usize| {
            vm_of_slot
                .get(slot)
                .copied()
                .flatten()
                .map_or(Target::Free, Target::Vm)
        };
        let of_stream = |rid: usize| {
            let s = &streams[rid];
            if s.started() {
                Target::Vm(s.vm)
            } else {
                of_slot(s.replica * per_replica + slot_of_worker(s.worker))
            }
        };
        match ev {
            Ev::VmStart { .. } | Ev::UpstreamWake { .. } => Target::Free,
            Ev::Tick { vm, .. } | Ev::CalloutDone { vm, .. } | Ev::CalloutTimeout { vm, .. } => {
                Target::Vm(*vm)
            }
            Ev::QueueReady { slot, .. } => of_slot(main_if_base(*slot, per_replica)),
            Ev::Headers { rid }
            | Ev::Body { rid, .. }
            | Ev::BodyEnd { rid }
            | Ev::Disconnect { rid }
            | Ev::ConnectFail { rid }
            | Ev::IdleCheck { rid } => of_stream(*rid),
            Ev::UpstreamArrive { uid } | Ev::Deliver { uid, .. } => {
                match upstream.get(uid).map(|u| &u.owner) {
                    Some(UpRef::Stream(sid)) => of_stream(*sid),
                    Some(UpRef::Callout { vm, .. }) => Target::Vm(*vm),
                    None => Target::Free,
                }
            }
            Ev::Control { .. } => Target::All,
        }
    }
}

impl Sim {
    /// Schedules `ev` at `at` (not before now).
    pub(super) fn push(&mut self, at: Nanos, ev: Ev) {
        if ev.is_work() {
            self.events.work_pending += 1;
        }
        let tie = self.rng.next_u32();
        self.events.queue.push(at.max(self.now), tie, ev);
    }

    /// Handles events in order until the run is over (`until` = `None`: no work left,
    /// every request answered, no root draining) or past `until`, or a limit is hit.
    pub(super) fn run_loop(&mut self, until: Option<Nanos>) -> Result<()> {
        loop {
            if self.record.events >= self.cfg.max_events {
                bail!("stopped after {} events (max_events)", self.record.events);
            }
            if until.is_none()
                && self.events.work_pending == 0
                && self.all_final()
                && self.draining_vms().is_empty()
            {
                return Ok(());
            }
            let Some(t) = self.events.queue.peek_time() else {
                return Ok(());
            };
            if until.is_some_and(|u| t > u) {
                self.now = until.unwrap_or(t);
                return Ok(());
            }
            if t > self.cfg.max_time {
                return Ok(());
            }
            let Some((t, ev)) = self.events.queue.pop() else {
                return Ok(());
            };
            self.process(t, ev)?;
        }
    }

    /// Handles one event with its bookkeeping: clock, trace, deferred completions,
    /// invariants.
    pub(super) fn process(&mut self, t: Nanos, ev: Ev) -> Result<()> {
        if ev.is_work() {
            self.events.work_pending -= 1;
        }
        self.now = self.now.max(t);
        self.record.events += 1;
        let (code, id) = ev.code();
        self.record.hash.u64(t);
        self.record.hash.u64(code);
        self.record.hash.u64(id);
        if self.cfg.record_trace || self.cfg.check_invariants {
            self.events.current = ev.describe();
            if self.cfg.record_trace {
                let nested = if self.vms.busy.is_empty() {
                    ""
                } else {
                    " (inside a suspended callback)"
                };
                self.record
                    .trace
                    .push(format!("{t} {}{nested}", self.events.current));
            }
        }
        self.handle(ev)?;
        self.run_deferred();
        if let Some(e) = self.events.deferred_error.take() {
            return Err(e);
        }
        if self.cfg.check_invariants {
            self.check_invariants();
            if let Some(v) = self.checks.violations.first() {
                bail!("{v}");
            }
        }
        Ok(())
    }

    /// What one event does.
    fn handle(&mut self, ev: Ev) -> Result<()> {
        match ev {
            Ev::VmStart { slot } => {
                self.new_vm(slot)?;
            }
            Ev::Tick { vm, gen } => self.on_tick(vm, gen),
            Ev::QueueReady { slot, root, token } => self.on_queue_ready(slot, root, token),
            Ev::Headers { rid } => self.on_headers(rid)?,
            Ev::Body { rid, len } => self.on_body(rid, len),
            Ev::BodyEnd { rid } => self.on_body_end(rid),
            Ev::Disconnect { rid } => self.on_disconnect(rid),
            Ev::UpstreamArrive { uid } => self.on_upstream_arrive(uid),
            Ev::UpstreamWake { ep, gen } => self.on_upstream_wake(ep, gen),
            Ev::Deliver { uid, emit } => self.on_deliver(uid, emit),
            Ev::ConnectFail { rid } => {
                let body = "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure, transport failure reason: delayed connect error: Connection refused";
                self.local_reply(rid, 503, body.as_bytes().to_vec(), Vec::new(), true);
            }
            Ev::CalloutDone { vm, token, resp } => self.callout_done(vm, token, resp),
            Ev::CalloutTimeout { vm, token } => self.callout_timeout(vm, token),
            Ev::IdleCheck { rid } => self.on_idle_check(rid),
            Ev::Control { idx } => {
                if let Some(c) = self.events.controls[idx].take() {
                    self.control(c);
                }
            }
        }
        Ok(())
    }

    /// A root's tick: runs it and re-arms it, unless the tick is stale (the period
    /// changed, the VM died or its root was deleted).
    fn on_tick(&mut self, vm: usize, gen: u64) {
        let ticks = self.vms.ticks[vm];
        if ticks.gen == gen
            && ticks.period_ms > 0
            && self.vms[vm].failed.is_none()
            && !self.root_deleted(vm)
        {
            let root = self.vms[vm].store.data().root_id;
            self.call(vm, Callback::Tick(root));
            // Re-arm unless the callback changed the period (then it re-armed).
            if self.vms.ticks[vm].gen == gen && self.vms[vm].failed.is_none() {
                let at = self.now + u64::from(ticks.period_ms) * MS;
                self.push(at, Ev::Tick { vm, gen });
            }
        }
    }

    /// `on_queue_ready`, delivered to the slot's current thread-local VM (the base VM's
    /// thread is the main thread's) if its root is the one that registered the queue.
    fn on_queue_ready(&mut self, slot: usize, root: u32, token: u32) {
        let slot = main_if_base(slot, self.cfg.slots_per_replica());
        if let Some(vm) = self.vms.by_slot[slot] {
            let known = self.vms[vm].store.data().root_id == root;
            if known && !self.root_deleted(vm) {
                self.call(vm, Callback::QueueReady(root, token));
            }
        }
    }
}
