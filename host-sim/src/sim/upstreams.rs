//! Requests at the model servers: arrival, what the servers emit, cancellation, servers
//! going away, and the scenario's mid-run changes.

use super::config::Control;
use super::events::Ev;
use super::stream::Answer;
use super::Sim;
use crate::host::vm::CalloutResponse;
use crate::world::balancers::Balancer;
use crate::world::clock::Nanos;
use crate::world::outcomes::Final;
use crate::world::upstream::{Emit, Upstream, UpstreamRequest};
use std::collections::{BTreeMap, HashMap};

/// One model server.
pub(super) struct Endpoint {
    /// Its `ip:port`.
    pub(super) addr: String,
    /// The server.
    pub(super) upstream: Box<dyn Upstream>,
    /// Whether it accepts connections (false after [`Control::RemoveEndpoint`]).
    pub(super) up: bool,
    /// Generation of its wake-ups: an [`Ev::UpstreamWake`] of an older one is stale.
    pub(super) gen: u64,
    /// When its next wake-up is scheduled, if one is.
    pub(super) wake_at: Option<Nanos>,
}

/// Who sent a request upstream.
pub(super) enum UpRef {
    /// The router, for this stream.
    Stream(usize),
    /// A VM's callout.
    Callout {
        /// The VM.
        vm: usize,
        /// The callout's token.
        token: u32,
    },
}

/// A request sent to a model server.
pub(super) struct UpReq {
    /// Who sent it.
    pub(super) owner: UpRef,
    /// The endpoint (index).
    pub(super) ep: usize,
    /// The request, until it reaches the server.
    pub(super) req: Option<UpstreamRequest>,
    /// When its last response piece reaches Envoy (one connection delivers in order).
    pub(super) last_delivery: Nanos,
    /// A callout's response, collected until its end.
    pub(super) callout: CalloutResponse,
}

impl UpReq {
    /// `req` from `owner` to endpoint `ep`, on its way.
    pub(super) fn new(owner: UpRef, ep: usize, req: UpstreamRequest) -> UpReq {
        UpReq {
            owner,
            ep,
            req: Some(req),
            last_delivery: 0,
            callout: CalloutResponse::default(),
        }
    }
}

/// The model servers and the requests at them.
#[derive(Default)]
pub(super) struct Upstreams {
    /// Every endpoint ever added, by index.
    pub(super) endpoints: Vec<Endpoint>,
    /// Endpoint indices by `ip:port`.
    pub(super) by_addr: HashMap<String, usize>,
    /// Requests sent and not finished, by upstream id.
    pub(super) active: HashMap<u64, UpReq>,
    /// The next upstream id.
    pub(super) next_uid: u64,
    /// Requests of streams in flight per endpoint address (sent, response not over).
    pub(super) in_flight: BTreeMap<String, u64>,
    /// Reused buffer for what a server emits when polled.
    pub(super) emit_buf: Vec<Emit>,
    /// A stand-in balancer that routes instead of the filter ([`Sim::set_balancer`]).
    pub(super) balancer: Option<Box<dyn Balancer>>,
    /// The KV-event relay the servers publish to ([`Sim::add_kv_relay`]).
    pub(super) kv_relay: Option<crate::world::kv_relay::WorldRelay>,
}

impl Sim {
    /// An upstream request reaches its server (refused if the server went away meanwhile).
    pub(super) fn on_upstream_arrive(&mut self, uid: u64) {
        let Some(u) = self.upstreams.active.get_mut(&uid) else {
            return; // cancelled on the way
        };
        let ep = u.ep;
        let Some(req) = u.req.take() else { return };
        if !self.upstreams.endpoints[ep].up {
            self.upstream_failed(uid);
            return;
        }
        self.upstreams.endpoints[ep]
            .upstream
            .start(self.now, uid, &req);
        self.rearm_upstream(ep);
    }

    /// Schedules the endpoint's next wake-up if it is earlier than the scheduled one.
    pub(super) fn rearm_upstream(&mut self, ep: usize) {
        let next = self.upstreams.endpoints[ep].upstream.next_wake();
        let e = &mut self.upstreams.endpoints[ep];
        if let Some(t) = next {
            if e.wake_at.is_none_or(|w| t < w) {
                e.gen += 1;
                e.wake_at = Some(t);
                let gen = e.gen;
                self.push(t, Ev::UpstreamWake { ep, gen });
            }
        }
    }

    /// Endpoint `ep`'s scheduled wake-up: polls it unless the wake-up is stale.
    pub(super) fn on_upstream_wake(&mut self, ep: usize, gen: u64) {
        if self.upstreams.endpoints[ep].gen == gen {
            self.upstreams.endpoints[ep].wake_at = None;
            self.poll_upstream(ep);
        }
    }

    /// Collects what the endpoint emits now and schedules its delivery to Envoy.
    pub(super) fn poll_upstream(&mut self, ep: usize) {
        let mut out = std::mem::take(&mut self.upstreams.emit_buf);
        out.clear();
        self.upstreams.endpoints[ep]
            .upstream
            .poll(self.now, &mut out);
        for emit in out.drain(..) {
            let uid = match &emit {
                Emit::Head { id, .. } | Emit::Data { id, .. } | Emit::End { id } => *id,
            };
            let lat = self.cfg.network.upstream.draw(&mut self.rng);
            let Some(u) = self.upstreams.active.get_mut(&uid) else {
                continue;
            };
            // One upstream connection delivers in order.
            let at = (self.now + lat).max(u.last_delivery + 1);
            u.last_delivery = at;
            self.push(at, Ev::Deliver { uid, emit });
        }
        self.upstreams.emit_buf = out;
        self.rearm_upstream(ep);
    }

    /// A piece of a response reaches Envoy: to the stream's response path, or collected for
    /// a callout.
    pub(super) fn on_deliver(&mut self, uid: u64, emit: Emit) {
        let Some(u) = self.upstreams.active.get_mut(&uid) else {
            return;
        };
        match u.owner {
            UpRef::Callout { vm, token } => match emit {
                Emit::Head {
                    status, headers, ..
                } => {
                    u.callout.headers = vec![(":status".into(), status.to_string())];
                    u.callout.headers.extend(headers);
                }
                Emit::Data { bytes, .. } => u.callout.body.extend(bytes),
                Emit::End { .. } => {
                    let resp = std::mem::take(&mut u.callout);
                    self.upstreams.active.remove(&uid);
                    self.callout_done(vm, token, resp);
                }
            },
            UpRef::Stream(sid) => match emit {
                Emit::Head {
                    status, headers, ..
                } => self.on_response_head(sid, status, headers),
                Emit::Data { bytes, .. } => self.on_response_data(sid, bytes),
                Emit::End { .. } => {
                    self.upstream_done(uid);
                    self.on_response_end(sid);
                }
            },
        }
    }

    /// An upstream request is finished (or abandoned): no longer in flight.
    pub(super) fn upstream_done(&mut self, uid: u64) {
        let Some(u) = self.upstreams.active.remove(&uid) else {
            return;
        };
        if let UpRef::Stream(sid) = u.owner {
            if let Some(ep) = &self.requests.streams[sid].endpoint {
                if let Some(n) = self.upstreams.in_flight.get_mut(ep) {
                    *n = n.saturating_sub(1);
                }
            }
        }
    }

    /// Resets the upstream side of a stream (client gone, local reply, ...).
    pub(super) fn cancel_upstream(&mut self, sid: usize) {
        let Some(uid) = self.requests.streams[sid].uid else {
            return;
        };
        if let Some(u) = self.upstreams.active.get(&uid) {
            let ep = u.ep;
            self.upstreams.endpoints[ep].upstream.cancel(self.now, uid);
            self.upstream_done(uid);
            self.rearm_upstream(ep);
        }
    }

    /// The server went away under a request.
    pub(super) fn upstream_failed(&mut self, uid: u64) {
        let Some(u) = self.upstreams.active.get(&uid) else {
            return;
        };
        match u.owner {
            UpRef::Callout { vm, token } => {
                self.upstreams.active.remove(&uid);
                let resp = CalloutResponse {
                    headers: vec![(":status".into(), "503".into())],
                    body: b"upstream connect error or disconnect/reset before headers. reset reason: connection termination".to_vec(),
                };
                self.callout_done(vm, token, resp);
            }
            UpRef::Stream(sid) => {
                self.upstream_done(uid);
                if self.requests.streams[sid].answer == Answer::HeadSent {
                    self.reset_stream(sid, Final::Reset);
                } else {
                    let body = b"upstream connect error or disconnect/reset before headers. reset reason: connection termination".to_vec();
                    self.local_reply(sid, 503, body, Vec::new(), true);
                }
            }
        }
    }

    /// Applies one of the scenario's scheduled changes.
    pub(super) fn control(&mut self, c: Control) {
        match c {
            Control::AddEndpoint(addr, up) => {
                if let Some(&i) = self.upstreams.by_addr.get(&addr) {
                    self.upstreams.endpoints[i].upstream = up;
                    self.upstreams.endpoints[i].up = true;
                    if let Some(relay) = self.upstreams.kv_relay.as_mut() {
                        relay.restarted(&addr);
                    }
                } else {
                    self.add_endpoint(&addr, up);
                }
            }
            Control::RemoveEndpoint(addr) => {
                let Some(&ep) = self.upstreams.by_addr.get(&addr) else {
                    return;
                };
                self.upstreams.endpoints[ep].up = false;
                self.upstreams.endpoints[ep].gen += 1;
                self.upstreams.endpoints[ep].wake_at = None;
                let mut uids: Vec<u64> = self
                    .upstreams
                    .active
                    .iter()
                    .filter(|(_, u)| u.ep == ep)
                    .map(|(k, _)| *k)
                    .collect();
                uids.sort_unstable();
                for uid in uids {
                    self.upstream_failed(uid);
                }
            }
            Control::SetCondition(addr, cond) => {
                if let Some(&ep) = self.upstreams.by_addr.get(&addr) {
                    self.upstreams.endpoints[ep]
                        .upstream
                        .set_condition(self.now, cond);
                    self.rearm_upstream(ep);
                }
            }
            Control::AddFault(f) => self.add_fault(f),
            Control::RemovePlugin => self.remove_plugin(),
        }
    }
}
