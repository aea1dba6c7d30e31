//! Requests at the model servers: arrival, what the servers emit, cancellation, servers
//! going away, and the scenario's mid-run changes.

#[allow(clippy::wildcard_imports)]
use super::*;

impl Sim {
    pub(super) fn on_upstream_arrive(&mut self, uid: u64) {
        let Some(u) = self.upreqs.get_mut(&uid) else {
            return; // cancelled on the way
        };
        let ep = u.ep;
        let Some(req) = u.req.take() else { return };
        if !self.endpoints[ep].up {
            self.upstream_failed(uid);
            return;
        }
        self.endpoints[ep].upstream.start(self.now, uid, &req);
        self.rearm_upstream(ep);
    }

    pub(super) fn rearm_upstream(&mut self, ep: usize) {
        let next = self.endpoints[ep].upstream.next_wake();
        let e = &mut self.endpoints[ep];
        if let Some(t) = next {
            if e.wake_at.is_none_or(|w| t < w) {
                e.gen += 1;
                e.wake_at = Some(t);
                let gen = e.gen;
                self.push(t, Ev::UpstreamWake { ep, gen });
            }
        }
    }

    pub(super) fn poll_upstream(&mut self, ep: usize) {
        let mut out = std::mem::take(&mut self.emit_buf);
        out.clear();
        self.endpoints[ep].upstream.poll(self.now, &mut out);
        for emit in out.drain(..) {
            let uid = match &emit {
                Emit::Head { id, .. } | Emit::Data { id, .. } | Emit::End { id } => *id,
            };
            let lat = self.cfg.network.upstream.draw(&mut self.rng);
            let Some(u) = self.upreqs.get_mut(&uid) else {
                continue;
            };
            // One upstream connection delivers in order.
            let at = (self.now + lat).max(u.last_delivery + 1);
            u.last_delivery = at;
            self.push(at, Ev::Deliver { uid, emit });
        }
        self.emit_buf = out;
        self.rearm_upstream(ep);
    }

    pub(super) fn on_deliver(&mut self, uid: u64, emit: Emit) {
        let Some(u) = self.upreqs.get_mut(&uid) else {
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
                    self.upreqs.remove(&uid);
                    self.callout_done(vm, token, resp);
                }
            },
            UpRef::Stream(sid) => match emit {
                Emit::Head {
                    status, headers, ..
                } => self.on_response_head(sid, status, headers),
                Emit::Data { bytes, .. } => self.on_response_data(sid, bytes),
                Emit::End { .. } => {
                    u.done = true;
                    self.upstream_done(uid);
                    self.on_response_end(sid);
                }
            },
        }
    }

    /// An upstream request is finished (or abandoned): no longer in flight.
    pub(super) fn upstream_done(&mut self, uid: u64) {
        let Some(u) = self.upreqs.remove(&uid) else {
            return;
        };
        if let UpRef::Stream(sid) = u.owner {
            if let Some(ep) = &self.streams[sid].endpoint {
                if let Some(n) = self.in_flight.get_mut(ep) {
                    *n = n.saturating_sub(1);
                }
            }
            self.streams[sid].upstream_ended = true;
        }
    }

    /// Resets the upstream side of a stream (client gone, local reply, ...).
    pub(super) fn cancel_upstream(&mut self, sid: usize) {
        let Some(uid) = self.streams[sid].uid else {
            return;
        };
        if let Some(u) = self.upreqs.get(&uid) {
            let ep = u.ep;
            self.endpoints[ep].upstream.cancel(self.now, uid);
            self.upstream_done(uid);
            self.rearm_upstream(ep);
        }
    }

    /// The server went away under a request.
    pub(super) fn upstream_failed(&mut self, uid: u64) {
        let Some(u) = self.upreqs.get(&uid) else {
            return;
        };
        match u.owner {
            UpRef::Callout { vm, token } => {
                self.upreqs.remove(&uid);
                let resp = CalloutResponse {
                    headers: vec![(":status".into(), "503".into())],
                    body: b"upstream connect error or disconnect/reset before headers. reset reason: connection termination".to_vec(),
                };
                self.callout_done(vm, token, resp);
            }
            UpRef::Stream(sid) => {
                self.upstream_done(uid);
                if self.streams[sid].head_sent {
                    self.reset_stream(sid, Final::Reset);
                } else {
                    let body = b"upstream connect error or disconnect/reset before headers. reset reason: connection termination".to_vec();
                    self.local_reply(sid, 503, body, Vec::new(), true);
                }
            }
        }
    }

    pub(super) fn control(&mut self, c: Control) {
        match c {
            Control::AddEndpoint(addr, up) => {
                if let Some(&i) = self.ep_index.get(&addr) {
                    self.endpoints[i].upstream = up;
                    self.endpoints[i].up = true;
                } else {
                    self.add_endpoint(&addr, up);
                }
            }
            Control::RemoveEndpoint(addr) => {
                let Some(&ep) = self.ep_index.get(&addr) else {
                    return;
                };
                self.endpoints[ep].up = false;
                self.endpoints[ep].gen += 1;
                self.endpoints[ep].wake_at = None;
                let mut uids: Vec<u64> = self
                    .upreqs
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
                if let Some(&ep) = self.ep_index.get(&addr) {
                    self.endpoints[ep].upstream.set_condition(self.now, cond);
                    self.rearm_upstream(ep);
                }
            }
            Control::AddFault(f) => self.add_fault(f),
            Control::RemovePlugin => self.remove_plugin(),
        }
    }
}
