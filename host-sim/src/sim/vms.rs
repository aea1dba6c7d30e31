//! The VMs of the simulated process: creating them, calling into them (with
//! preemption), the deferred actions they ask for, crashes, queue messages and callouts.

use super::events::{Ev, Target};
use super::upstreams::{UpRef, UpReq};
use super::{demangle_backtrace, Crash, RootShutdown, Sim};
use crate::host::effects::{Effect, Outgoing, StreamDir};
use crate::host::lock;
use crate::host::vm::{Callback, CalloutResponse, Vm};
use crate::world::clock::{Nanos, MS};
use crate::world::outcomes::Final;
use crate::world::upstream::UpstreamRequest;
use crate::SLOT_BASE;
use anyhow::{bail, Result};
use std::collections::HashSet;
use std::sync::atomic::Ordering;

/// A VM's tick timer. A tick event carries the generation it was armed in; a change of
/// period, a crash or the root's deletion starts a new generation, so older tick events
/// are stale.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Ticks {
    /// The root's tick period (0 = none).
    pub(super) period_ms: u32,
    /// The current generation.
    pub(super) gen: u64,
}

/// The VMs of the process, by index (a reloaded VM is a new one), with their per-VM
/// state.
pub(super) struct Vms {
    /// Every VM created; `None` while it runs a (possibly suspended) callback.
    pub(super) all: Vec<Option<Vm>>,
    /// Per VM: its thread slot (0 base, 1 main thread, 2.. workers).
    pub(super) slot: Vec<usize>,
    /// Per VM: its tick timer.
    pub(super) ticks: Vec<Ticks>,
    /// Per VM: its root's shutdown, once [`Control::RemovePlugin`](super::Control) ran.
    pub(super) shutdowns: Vec<Option<RootShutdown>>,
    /// Per thread slot: the VM serving it now.
    pub(super) by_slot: Vec<Option<usize>>,
    /// VMs inside a callback now, outermost first: one suspended in a host call, and
    /// those whose events run meanwhile.
    pub(super) busy: Vec<usize>,
    /// Callouts sent and not answered yet: (VM, token).
    pub(super) callouts: HashSet<(usize, u32)>,
    /// When the plugin was removed ([`Control::RemovePlugin`](super::Control)).
    pub(super) removed_at: Option<Nanos>,
}

impl Vms {
    /// No VM yet, `slots` thread slots.
    pub(super) fn new(slots: usize) -> Vms {
        Vms {
            all: Vec::new(),
            slot: Vec::new(),
            ticks: Vec::new(),
            shutdowns: Vec::new(),
            by_slot: vec![None; slots],
            busy: Vec::new(),
            callouts: HashSet::new(),
            removed_at: None,
        }
    }
}

impl std::ops::Index<usize> for Vms {
    type Output = Vm;
    fn index(&self, i: usize) -> &Vm {
        self.all[i]
            .as_ref()
            .unwrap_or_else(|| panic!("VM {i} is suspended in a callback"))
    }
}

impl std::ops::IndexMut<usize> for Vms {
    fn index_mut(&mut self, i: usize) -> &mut Vm {
        self.all[i]
            .as_mut()
            .unwrap_or_else(|| panic!("VM {i} is suspended in a callback"))
    }
}

impl Sim {
    /// Runs one callback, letting other VMs' due events run while it is suspended.
    pub(super) fn invoke(&mut self, vm: usize, cb: Callback) -> wasmtime::Result<i32> {
        let Some(mut v) = self.vms.all[vm].take() else {
            return Err(wasmtime::Error::msg(format!(
                "VM {vm} re-entered while suspended"
            )));
        };
        // The base VM configures alone (Envoy loads the configuration on the main thread
        // before any thread-local VM exists): it is never suspended for others to run.
        let base = self
            .vms
            .slot
            .get(vm)
            .is_some_and(|s| s % (self.cfg.workers + 2) == SLOT_BASE);
        v.store.data_mut().preempt.enabled =
            !base && self.vms.busy.is_empty() && self.cfg.preempt_probability > 0.0;
        self.vms.busy.push(vm);
        let mut fut = Box::pin(v.invoke(cb));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let (v, r) = loop {
            match std::future::Future::poll(fut.as_mut(), &mut cx) {
                std::task::Poll::Ready(x) => break x,
                std::task::Poll::Pending => {
                    self.record.yields += 1;
                    self.record.hash.u64(0x5EED_1E1D ^ vm as u64);
                    self.run_concurrent();
                }
            }
        };
        self.vms.busy.pop();
        self.vms.all[vm] = Some(v);
        r
    }

    /// While a callback is suspended: run the next event due within the window that
    /// does not need a busy VM (as another Envoy thread would meanwhile).
    pub(super) fn run_concurrent(&mut self) {
        let until = self.now + self.cfg.preempt_window;
        let busy = self.vms.busy.clone();
        let (streams, upstream, by_slot, per) = (
            &self.requests.streams,
            &self.upstreams.active,
            &self.vms.by_slot,
            self.cfg.slots_per_replica(),
        );
        let next = self.events.queue.pop_matching(until, |ev| {
            match Target::of(ev, streams, upstream, by_slot, per) {
                Target::Free => true,
                Target::Vm(v) => !busy.contains(&v),
                Target::All => false,
            }
        });
        if let Some((t, ev)) = next {
            if let Err(e) = self.process(t, ev) {
                if self.events.deferred_error.is_none() {
                    self.events.deferred_error = Some(e);
                }
            }
        }
    }

    /// Creates the VM of thread `slot` (replacing the slot's VM, if any), its root
    /// context, and runs `on_vm_start` and `on_configure`; fails if the filter refuses its
    /// configuration. Returns the VM's index.
    pub(super) fn new_vm(&mut self, slot: usize) -> Result<usize> {
        let seed = self.rng.next_u64();
        let vm = self.process.new_vm(&self.cfg, slot, seed)?;
        let idx = self.vms.all.len();
        self.vms.all.push(Some(vm));
        self.vms.slot.push(slot);
        self.vms.ticks.push(Ticks::default());
        self.vms.shutdowns.push(None);
        self.vms.by_slot[slot] = Some(idx);
        let root = {
            let h = self.vms[idx].store.data_mut();
            let r = h.alloc_ctx();
            h.root_id = r;
            r
        };
        let (vm_len, cfg_len) = {
            let h = self.vms[idx].store.data();
            (h.vm_config.len() as u32, h.plugin_config.len() as u32)
        };
        self.call(idx, Callback::ContextCreate(root, 0));
        let started = self.call(idx, Callback::VmStart(root, vm_len));
        let configured = self.call(idx, Callback::Configure(root, cfg_len));
        if started == Some(0) || configured == Some(0) {
            let why = if started == Some(0) {
                "on_vm_start"
            } else {
                "on_configure"
            };
            let logs: Vec<String> = lock(&self.process.log)
                .iter()
                .filter(|l| l.slot == slot && l.level >= 3)
                .map(|l| l.message.clone())
                .collect();
            bail!(
                "the filter refused its configuration ({why} returned false) in slot {slot}; its log:\n{}",
                logs.join("\n")
            );
        }
        Ok(idx)
    }

    /// Calls into a VM and then runs the deferred actions. `None` when the VM is dead or
    /// trapped in this call.
    pub(super) fn call(&mut self, vm: usize, cb: Callback) -> Option<i32> {
        if self.vms[vm].failed.is_some() {
            return None;
        }
        self.record.vm_calls += 1;
        self.record
            .hash
            .u64(0xCA11 ^ ((vm as u64) << 8) ^ cb.code());
        self.record.hash.u64(u64::from(cb.context()));
        let ctx = cb.context();
        {
            let h = self.vms[vm].store.data_mut();
            h.now = self.now;
            h.current = ctx;
            h.effective = ctx;
        }
        let r = self.invoke(vm, cb);
        match r {
            Ok(ret) => {
                let (effects, outgoing, period) = {
                    let h = self.vms[vm].store.data_mut();
                    h.effective = h.current;
                    (
                        std::mem::take(&mut h.effects),
                        std::mem::take(&mut h.outgoing),
                        h.tick_period_ms,
                    )
                };
                self.after_call_tick(vm, period);
                for o in outgoing {
                    self.outgoing(vm, o);
                }
                // Envoy drains these nested: each local reply runs the filter's response
                // callbacks, and the next one is drained inside that call, so V8's stack
                // grows with every local reply of one callback.
                let mut replies = 0usize;
                for e in effects {
                    if matches!(e, Effect::LocalReply { .. }) {
                        replies += 1;
                        let limit = self.cfg.nested_local_reply_limit;
                        if limit > 0 && replies == limit + 1 && self.vms[vm].failed.is_none() {
                            self.stack_overflow(vm, replies);
                        }
                    }
                    self.apply_effect(vm, e);
                }
                if std::mem::take(&mut self.vms[vm].store.data_mut().done_signalled) {
                    if let Some(s) = self.vms.shutdowns[vm].as_mut() {
                        s.proxy_done_at = Some(self.now);
                    }
                    self.delete_root(vm);
                }
                Some(ret)
            }
            Err(e) => {
                self.crash(vm, cb, &e);
                None
            }
        }
    }

    /// Re-arms the VM's tick if the callback changed its period (a new generation).
    pub(super) fn after_call_tick(&mut self, vm: usize, period: u32) {
        // The base VM never ticks in Envoy.
        if self.vms.slot[vm] % self.cfg.slots_per_replica() == SLOT_BASE {
            return;
        }
        let ticks = self.vms.ticks[vm];
        if ticks.period_ms != period {
            let gen = ticks.gen + 1;
            self.vms.ticks[vm] = Ticks {
                period_ms: period,
                gen,
            };
            if period > 0 {
                self.push(self.now + u64::from(period) * MS, Ev::Tick { vm, gen });
            }
        }
    }

    /// V8 ran out of stack draining nested local replies: the VM dies (its remaining
    /// deferred replies are still sent, without the filter).
    pub(super) fn stack_overflow(&mut self, vm: usize, replies: usize) {
        let message = format!(
            "proxy_on_response_headers failed: Uncaught RangeError: Maximum call stack size \
             exceeded ({replies} local replies drained nested in one callback; Envoy's V8 \
             overflows at about 300)"
        );
        self.record.crashes.push(Crash {
            at: self.now,
            slot: self.vms.slot[vm],
            callback: "proxy_on_response_headers",
            message: message.clone(),
        });
        self.vms[vm].failed = Some((self.now, message));
        self.vms.ticks[vm].gen += 1;
    }

    /// A trap: the VM is dead (its pending actions dropped, ticks stopped), the crash
    /// recorded, and the stream whose callback trapped gets Envoy's 503.
    pub(super) fn crash(&mut self, vm: usize, cb: Callback, e: &wasmtime::Error) {
        let message = demangle_backtrace(&format!("{e:?}"));
        let slot = self.vms.slot[vm];
        self.record.crashes.push(Crash {
            at: self.now,
            slot,
            callback: cb.name(),
            message: message.clone(),
        });
        {
            let h = self.vms[vm].store.data_mut();
            h.effects.clear();
            h.outgoing.clear();
        }
        self.vms[vm].failed = Some((self.now, message));
        self.vms.ticks[vm].gen += 1;
        // The stream whose callback trapped gets Envoy's 503.
        let sid = self.vms[vm]
            .store
            .data()
            .streams
            .get(&cb.context())
            .map(|h| h.sid);
        if let Some(sid) = sid {
            self.fail_stream(sid);
        }
    }

    /// Envoy's `failStream`: a 503 local reply that no longer runs the dead filter.
    pub(super) fn fail_stream(&mut self, sid: usize) {
        self.requests.streams[sid].filter = false;
        self.local_reply(sid, 503, Vec::new(), Vec::new(), false);
    }

    /// Schedules what a callback sent out: a queue notification, or an HTTP callout
    /// (answered at once for `GET /metrics`, refused without a live destination, else sent
    /// to the endpoint).
    pub(super) fn outgoing(&mut self, vm: usize, o: Outgoing) {
        match o {
            Outgoing::QueueReady { slot, root, token } => {
                let lat = if slot % self.cfg.slots_per_replica() >= 2 {
                    self.cfg.network.queue_worker
                } else {
                    self.cfg.network.queue_main
                };
                let d = lat.draw(&mut self.rng);
                self.push(self.now + d, Ev::QueueReady { slot, root, token });
            }
            Outgoing::HttpCall {
                token,
                cluster,
                headers,
                body,
                timeout_ms,
            } => {
                self.vms.callouts.insert((vm, token));
                let dst_header = self
                    .process
                    .clusters
                    .iter()
                    .find(|c| c.name == cluster)
                    .map(|c| c.dst_header.clone())
                    .unwrap_or_default();
                let dst = headers
                    .iter()
                    .find(|(k, _)| *k == dst_header)
                    .map(|(_, v)| v.clone());
                if timeout_ms > 0 {
                    self.push(
                        self.now + u64::from(timeout_ms) * MS,
                        Ev::CalloutTimeout { vm, token },
                    );
                }
                let rtt = self.cfg.network.upstream.draw(&mut self.rng) * 2;
                if let Some(resp) = self.kv_relay_callout(&cluster, &headers) {
                    self.push(self.now + rtt, Ev::CalloutDone { vm, token, resp });
                    return;
                }
                let ep = dst
                    .as_ref()
                    .and_then(|d| self.upstreams.by_addr.get(d).copied());
                let Some(ep) = ep.filter(|&e| self.upstreams.endpoints[e].up) else {
                    let (status, body) = if dst.is_none() {
                        ("503", "no healthy upstream".to_string())
                    } else {
                        ("503", "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure".to_string())
                    };
                    let resp = CalloutResponse {
                        headers: vec![(":status".into(), status.into())],
                        body: body.into_bytes(),
                    };
                    self.push(self.now + rtt, Ev::CalloutDone { vm, token, resp });
                    return;
                };
                let get = |n: &str| {
                    headers
                        .iter()
                        .find(|(k, _)| k == n)
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default()
                };
                let path = get(":path");
                if get(":method") == "GET" && path.split('?').next() == Some("/metrics") {
                    let text = self.upstreams.endpoints[ep].upstream.metrics(self.now);
                    let resp = CalloutResponse {
                        headers: vec![
                            (":status".into(), "200".into()),
                            ("content-type".into(), "text/plain; version=0.0.4".into()),
                        ],
                        body: text.into_bytes(),
                    };
                    self.push(self.now + rtt, Ev::CalloutDone { vm, token, resp });
                    return;
                }
                let uid = self.upstreams.next_uid;
                self.upstreams.next_uid += 1;
                self.upstreams.active.insert(
                    uid,
                    UpReq::new(
                        UpRef::Callout { vm, token },
                        ep,
                        UpstreamRequest {
                            method: get(":method"),
                            path,
                            headers,
                            body,
                        },
                    ),
                );
                self.push(self.now + rtt / 2, Ev::UpstreamArrive { uid });
            }
        }
    }

    /// A callout timed out: Envoy resets its upstream request and answers 504.
    pub(super) fn callout_timeout(&mut self, vm: usize, token: u32) {
        let mut uids: Vec<u64> = self
            .upstreams
            .active
            .iter()
            .filter(|(_, u)| matches!(u.owner, UpRef::Callout { vm: v, token: t } if v == vm && t == token))
            .map(|(k, _)| *k)
            .collect();
        uids.sort_unstable();
        for uid in uids {
            if let Some(u) = self.upstreams.active.remove(&uid) {
                self.upstreams.endpoints[u.ep]
                    .upstream
                    .cancel(self.now, uid);
                self.rearm_upstream(u.ep);
            }
        }
        let resp = CalloutResponse {
            headers: vec![(":status".into(), "504".into())],
            body: b"upstream request timeout".to_vec(),
        };
        self.callout_done(vm, token, resp);
    }

    /// A callout's response reaches its VM's root (`on_http_call_response`), unless it was
    /// already answered, or the VM or its root is gone.
    pub(super) fn callout_done(&mut self, vm: usize, token: u32, resp: CalloutResponse) {
        if !self.vms.callouts.remove(&(vm, token)) {
            return; // already answered (or timed out)
        }
        let replica = self.vms.slot[vm] / self.cfg.slots_per_replica();
        let _ = self.process.callouts_in_flight[replica].fetch_update(
            Ordering::Relaxed,
            Ordering::Relaxed,
            |n| Some(n.saturating_sub(1)),
        );
        if self.vms[vm].failed.is_some() || self.root_deleted(vm) {
            return;
        }
        let root = self.vms[vm].store.data().root_id;
        let (nh, nb) = (resp.headers.len() as u32, resp.body.len() as u32);
        self.vms[vm].store.data_mut().callout = Some(resp);
        self.call(vm, Callback::HttpCallResponse(root, token, nh, nb, 0));
        if let Some(Some(v)) = self.vms.all.get_mut(vm) {
            v.store.data_mut().callout = None;
        }
    }

    /// Runs one deferred action of a callback on its stream.
    pub(super) fn apply_effect(&mut self, vm: usize, e: Effect) {
        let ctx = match &e {
            Effect::Continue { ctx, .. }
            | Effect::LocalReply { ctx, .. }
            | Effect::Close { ctx } => *ctx,
        };
        let Some(sid) = self.vms[vm].store.data().streams.get(&ctx).map(|h| h.sid) else {
            return;
        };
        match e {
            Effect::Continue {
                dir: StreamDir::Request,
                ..
            } => self.continue_request(sid),
            Effect::Continue {
                dir: StreamDir::Response,
                ..
            } => self.continue_response(sid),
            Effect::LocalReply {
                status,
                body,
                headers,
                ..
            } => self.local_reply(sid, status, body, headers, true),
            Effect::Close { .. } => self.reset_stream(sid, Final::Reset),
        }
    }

    /// [`Control::RemovePlugin`](super::Control::RemovePlugin): `proxy_on_done` on every live VM's root, in a seeded
    /// order (cpp-host's `startShutdown`). True → deleted at once; false → pending until
    /// the root calls `proxy_done`.
    pub(super) fn remove_plugin(&mut self) {
        if self.vms.removed_at.is_some() {
            return;
        }
        self.vms.removed_at = Some(self.now);
        let mut order: Vec<usize> = self
            .vms
            .by_slot
            .iter()
            .flatten()
            .copied()
            .filter(|&v| self.vms[v].failed.is_none())
            .collect();
        for i in (1..order.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
        for vm in order {
            self.vms.shutdowns[vm] = Some(RootShutdown {
                slot: self.vms.slot[vm],
                on_done_at: self.now,
                not_done: false,
                proxy_done_at: None,
                deleted_at: None,
            });
            let root = self.vms[vm].store.data().root_id;
            match self.call(vm, Callback::Done(root)) {
                Some(0) => {
                    if let Some(s) = self.vms.shutdowns[vm].as_mut() {
                        s.not_done = true;
                    }
                    self.vms[vm].store.data_mut().draining = true;
                }
                Some(_) => self.delete_root(vm),
                None => {} // trapped: a dead VM is not called again
            }
        }
    }

    /// `proxy_on_delete` on the root; its ticks, queue deliveries and callout responses
    /// stop (HTTP contexts of streams already in the filter live on).
    pub(super) fn delete_root(&mut self, vm: usize) {
        let Some(s) = self.vms.shutdowns[vm].as_mut() else {
            return;
        };
        if s.deleted_at.is_some() {
            return;
        }
        s.deleted_at = Some(self.now);
        self.vms[vm].store.data_mut().draining = false;
        self.vms.ticks[vm].gen += 1;
        let root = self.vms[vm].store.data().root_id;
        self.call(vm, Callback::Delete(root));
    }

    /// Whether the VM's root was deleted after the plugin's removal.
    pub(super) fn root_deleted(&self, vm: usize) -> bool {
        self.vms
            .shutdowns
            .get(vm)
            .and_then(Option::as_ref)
            .is_some_and(|s| s.deleted_at.is_some())
    }

    /// VMs whose root answered `on_done` with false and has not called `proxy_done`
    /// (a crashed VM is not waited for).
    pub(super) fn draining_vms(&self) -> Vec<usize> {
        (0..self.vms.shutdowns.len())
            .filter(|&v| {
                self.vms.shutdowns[v]
                    .as_ref()
                    .is_some_and(|s| s.not_done && s.deleted_at.is_none())
                    && self.vms.all[v].as_ref().is_none_or(|x| x.failed.is_none())
            })
            .collect()
    }
}
