//! The request path of a stream: headers and body into the filter's request callbacks,
//! what Envoy does with their return values, the filter continuing, and the router
//! (ORIGINAL_DST on the route header, or a stand-in balancer) sending it upstream.

use super::events::Ev;
use super::stream::{Hold, Phase, RequestProgress};
use super::upstreams::{UpRef, UpReq};
use super::{FailurePolicy, Sim};
use crate::host::vm::{Callback, HttpData};
use crate::world::balancers::{Candidate, Pick};
use crate::world::clock::US;
use crate::world::outcomes::Final;
use crate::world::upstream::UpstreamRequest;
use crate::{replica_slot, slot_of_worker};
use anyhow::Result;

impl Sim {
    /// The request's headers reach Envoy on its worker: the filter chain is chosen (the
    /// worker's VM, or none per the failure policy; bypassed without the plugin or with a
    /// stand-in balancer), the HTTP context created, and `on_request_headers` called.
    pub(super) fn on_headers(&mut self, rid: usize) -> Result<()> {
        if self.requests.outcomes[rid].fin != Final::Pending {
            return Ok(()); // the client already gave up
        }
        let (replica, worker) = {
            let s = &self.requests.streams[rid];
            (s.replica, s.worker)
        };
        self.requests.outcomes[rid].worker = Some(worker);
        let slot = replica_slot(replica, self.cfg.workers, slot_of_worker(worker));
        let mut vm = self.vms.by_slot[slot];
        let mut filter = true;
        if let Some(v) = vm {
            if let Some((failed_at, _)) = self.vms[v].failed {
                match self.cfg.failure_policy {
                    FailurePolicy::FailOpen => filter = false,
                    FailurePolicy::FailClosed => vm = None,
                    FailurePolicy::FailReload => {
                        if self.now >= failed_at + self.cfg.reload_backoff {
                            let n = self.new_vm(slot)?;
                            self.record.reloads += 1;
                            vm = Some(n);
                        } else {
                            vm = None;
                        }
                    }
                }
            }
        }
        // The plugin was removed (`Control::RemovePlugin`): the listener's new filter
        // chain no longer has the Wasm filter, so the request goes to the router as is.
        // A stand-in balancer (`Sim::set_balancer`) also routes without the filter.
        if self.vms.removed_at.is_some() || self.upstreams.balancer.is_some() {
            filter = false;
        }
        let spec = &self.requests.specs[rid];
        let mut headers = vec![
            (":authority".to_string(), "gateway.local".to_string()),
            (":path".to_string(), spec.path.clone()),
            (":method".to_string(), spec.method.clone()),
            (":scheme".to_string(), "http".to_string()),
        ];
        for (k, v) in &spec.headers {
            headers.push((k.to_ascii_lowercase(), v.clone()));
        }
        if !spec.body.is_empty() {
            headers.push(("content-length".into(), spec.body.len().to_string()));
        }
        headers.push(("x-forwarded-proto".into(), "http".into()));
        // As Envoy's connection manager: an id when the client sent none (an internal
        // request keeps its own).
        if self.cfg.generate_request_id && !headers.iter().any(|(k, _)| k == "x-request-id") {
            headers.push((
                "x-request-id".into(),
                format!("{:016x}-{rid}", self.rng.next_u64()),
            ));
        }
        let body_len = spec.body.len();
        let eos = body_len == 0;
        let st = &mut self.requests.streams[rid];
        st.worker = worker;
        st.phase = Phase::Open;
        st.body_len = body_len;
        st.last_activity = self.now;
        let Some(vm) = vm else {
            // A worker without a usable VM: Envoy's wasm filter answers 503 itself.
            st.vm = 0;
            self.local_reply(rid, 503, Vec::new(), Vec::new(), false);
            return Ok(());
        };
        st.vm = vm;
        st.filter = filter;
        self.schedule_body(rid);
        self.arm_idle(rid);
        if !filter {
            self.pass_headers(rid, headers);
            if eos {
                self.pass_eos(rid);
            }
            return Ok(());
        }
        let ctx = {
            let h = self.vms[vm].store.data_mut();
            let ctx = h.alloc_ctx();
            let source = format!(
                "10.1.{}.{}:{}",
                (rid >> 8) & 255,
                rid & 255,
                40000 + rid % 20000
            );
            h.streams.insert(
                ctx,
                HttpData {
                    sid: rid,
                    req_headers: headers,
                    req_headers_writable: true,
                    source_address: source,
                    ..HttpData::default()
                },
            );
            ctx
        };
        self.requests.streams[rid].ctx = ctx;
        let root = self.vms[vm].store.data().root_id;
        self.call(vm, Callback::ContextCreate(ctx, root));
        if self.vms[vm].failed.is_some() {
            if !self.requests.streams[rid].finished() {
                self.fail_stream(rid);
            }
            return Ok(());
        }
        let n = Self::http(&mut self.vms, &self.requests.streams[rid])
            .map_or(0, |h| h.req_headers.len());
        let r = self.stream_call(rid, |c| Callback::RequestHeaders(c, n as u32, eos));
        let Some(action) = r else { return Ok(()) };
        self.after_request_action(rid, action, eos, true);
        Ok(())
    }

    /// Schedules the request body's pieces (`body_chunk` each, ~1 GB/s) and its end.
    pub(super) fn schedule_body(&mut self, rid: usize) {
        let len = self.requests.streams[rid].body_len;
        if len == 0 {
            return;
        }
        let chunk = self.cfg.body_chunk.max(1);
        let mut at = self.now;
        let mut sent = 0;
        while sent < len {
            let n = chunk.min(len - sent);
            at += US + (n as u64) / 1000; // ~1 GB/s on loopback
            self.push(at, Ev::Body { rid, len: n });
            sent += n;
        }
        self.push(at + US, Ev::BodyEnd { rid });
    }

    /// What Envoy does with the filter's return value for a request callback.
    pub(super) fn after_request_action(
        &mut self,
        sid: usize,
        action: i32,
        eos: bool,
        headers_cb: bool,
    ) {
        if self.requests.streams[sid].finished() {
            return;
        }
        if action == 0 {
            // Continue: everything the filter held goes on.
            self.requests.streams[sid].hold = Hold::None;
            self.set_paused(sid, false);
            if self.requests.streams[sid].request == RequestProgress::InFilter {
                let headers = Self::http(&mut self.vms, &self.requests.streams[sid])
                    .map(|h| h.req_headers.clone())
                    .unwrap_or_default();
                self.pass_headers(sid, headers);
            }
            if let Some(h) = Self::http(&mut self.vms, &self.requests.streams[sid]) {
                h.req_body.clear();
            }
            if eos && !self.requests.streams[sid].finished() {
                self.pass_eos(sid);
            }
        } else {
            self.requests.streams[sid].hold =
                if headers_cb && !self.cfg.allow_on_headers_stop_iteration {
                    // StopAllIterationAndWatermark: no body callbacks until continued.
                    Hold::StopAll
                } else {
                    Hold::Stop
                };
            if eos {
                // Held with the whole request in hand: the request waits in the filter.
                self.set_paused(sid, true);
            }
            if !eos {
                let size = Self::http(&mut self.vms, &self.requests.streams[sid])
                    .map_or(0, |h| h.req_body.len());
                if size > self.cfg.buffer_limit {
                    self.local_reply(sid, 413, b"Payload Too Large".to_vec(), Vec::new(), true);
                }
            }
        }
    }

    /// Marks the request as waiting in the filter or not; the first wait is the outcome's
    /// `enqueued_at`.
    pub(super) fn set_paused(&mut self, sid: usize, paused: bool) {
        let s = &mut self.requests.streams[sid];
        if paused && !s.paused && self.requests.outcomes[sid].enqueued_at.is_none() {
            self.requests.outcomes[sid].enqueued_at = Some(self.now);
        }
        s.paused = paused;
    }

    /// A piece of the request body reaches Envoy: buffered for the filter (cumulative),
    /// then `on_request_body(.., false)` unless the filter stopped all iteration (then only
    /// the buffer limit is checked).
    pub(super) fn on_body(&mut self, rid: usize, len: usize) {
        let s = &self.requests.streams[rid];
        if !s.started() || s.finished() {
            return;
        }
        let start = s.delivered;
        let data = self.requests.specs[rid].body[start..start + len].to_vec();
        self.requests.streams[rid].last_activity = self.now;
        self.requests.streams[rid].delivered += len;
        if !self.requests.streams[rid].filter {
            return; // no filter: straight to the router
        }
        if let Some(h) = Self::http(&mut self.vms, &self.requests.streams[rid]) {
            h.req_body.extend_from_slice(&data);
        }
        if self.requests.streams[rid].hold == Hold::StopAll {
            let size = Self::http(&mut self.vms, &self.requests.streams[rid])
                .map_or(0, |h| h.req_body.len());
            if size > self.cfg.buffer_limit {
                self.local_reply(rid, 413, b"Payload Too Large".to_vec(), Vec::new(), true);
            }
            return;
        }
        let size =
            Self::http(&mut self.vms, &self.requests.streams[rid]).map_or(0, |h| h.req_body.len());
        let Some(action) = self.stream_call(rid, |c| Callback::RequestBody(c, size as u32, false))
        else {
            return;
        };
        self.after_request_action(rid, action, false, false);
    }

    /// The end of the request body reaches Envoy: `on_request_body(.., true)`, unless the
    /// filter stopped all iteration.
    pub(super) fn on_body_end(&mut self, rid: usize) {
        let s = &mut self.requests.streams[rid];
        if !s.started() || s.finished() {
            return;
        }
        s.body_complete = true;
        s.last_activity = self.now;
        if !s.filter {
            self.pass_eos(rid);
            return;
        }
        if s.hold == Hold::StopAll {
            return;
        }
        let size =
            Self::http(&mut self.vms, &self.requests.streams[rid]).map_or(0, |h| h.req_body.len());
        let Some(action) = self.stream_call(rid, |c| Callback::RequestBody(c, size as u32, true))
        else {
            return;
        };
        self.after_request_action(rid, action, true, false);
    }

    /// The filter continues the request (`proxy_continue_stream`): what it held goes on to
    /// the router.
    pub(super) fn continue_request(&mut self, sid: usize) {
        let s = &mut self.requests.streams[sid];
        if s.finished() || s.hold == Hold::None {
            return;
        }
        s.hold = Hold::None;
        self.set_paused(sid, false);
        if self.requests.streams[sid].request == RequestProgress::InFilter {
            let headers = Self::http(&mut self.vms, &self.requests.streams[sid])
                .map(|h| h.req_headers.clone())
                .unwrap_or_default();
            self.pass_headers(sid, headers);
        }
        if self.requests.streams[sid].finished() {
            return;
        }
        if let Some(h) = Self::http(&mut self.vms, &self.requests.streams[sid]) {
            h.req_body.clear();
        }
        let s = &self.requests.streams[sid];
        if s.body_len == 0 || s.body_complete {
            self.pass_eos(sid);
        }
    }

    /// The request headers leave the filter: the router picks the upstream.
    pub(super) fn pass_headers(&mut self, sid: usize, headers: Vec<(String, String)>) {
        self.requests.streams[sid].request = RequestProgress::HeadersPassed;
        if let Some(h) = Self::http(&mut self.vms, &self.requests.streams[sid]) {
            h.req_headers_writable = false;
        }
        let dst = if self.upstreams.balancer.is_some() {
            self.balance(sid)
        } else {
            headers
                .iter()
                .find(|(k, _)| *k == self.cfg.route_header)
                .map(|(_, v)| v.clone())
        }
        .filter(|v| v.parse::<std::net::SocketAddr>().is_ok());
        match dst {
            Some(d) => {
                self.requests.streams[sid].endpoint = Some(d.clone());
                self.requests.outcomes[sid].endpoint = Some(d);
            }
            None => {
                self.local_reply(sid, 503, b"no healthy upstream".to_vec(), Vec::new(), true);
            }
        }
    }

    /// The stand-in balancer's choice among the endpoints that are up.
    fn balance(&mut self, sid: usize) -> Option<String> {
        let candidates: Vec<Candidate> = self
            .upstreams
            .endpoints
            .iter()
            .filter(|e| e.up)
            .map(|e| Candidate {
                addr: e.addr.clone(),
                in_flight: self.upstreams.in_flight.get(&e.addr).copied().unwrap_or(0),
            })
            .collect();
        let spec = &self.requests.specs[sid];
        let pick = Pick {
            now: self.now,
            worker: self.requests.streams[sid].replica * self.cfg.workers
                + self.requests.streams[sid].worker,
            path: &spec.path,
            body: &spec.body,
            candidates: &candidates,
        };
        self.upstreams.balancer.as_mut()?.pick(&pick)
    }

    /// The end of the request leaves the filter: the router sends it upstream.
    pub(super) fn pass_eos(&mut self, sid: usize) {
        let s = &mut self.requests.streams[sid];
        if s.request == RequestProgress::EndPassed || s.finished() {
            return;
        }
        s.request = RequestProgress::EndPassed;
        self.set_paused(sid, false);
        let Some(ep_addr) = self.requests.streams[sid].endpoint.clone() else {
            return;
        };
        self.requests.outcomes[sid].dispatched_at = Some(self.now);
        let lat = self.cfg.network.upstream.draw(&mut self.rng);
        let ep = self
            .upstreams
            .by_addr
            .get(&ep_addr)
            .copied()
            .filter(|&e| self.upstreams.endpoints[e].up);
        let Some(ep) = ep else {
            self.push(self.now + 2 * lat, Ev::ConnectFail { rid: sid });
            return;
        };
        let headers = Self::http(&mut self.vms, &self.requests.streams[sid])
            .map(|h| h.req_headers.clone())
            .unwrap_or_else(|| {
                vec![
                    (":path".into(), self.requests.specs[sid].path.clone()),
                    (":method".into(), self.requests.specs[sid].method.clone()),
                ]
            });
        if let Some(h) = Self::http(&mut self.vms, &self.requests.streams[sid]) {
            h.upstream_address = Some(ep_addr.clone());
        }
        let get = |n: &str| {
            headers
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let req = UpstreamRequest {
            method: get(":method"),
            path: get(":path"),
            body: self.requests.specs[sid].body.clone(),
            headers,
        };
        let uid = self.upstreams.next_uid;
        self.upstreams.next_uid += 1;
        self.requests.streams[sid].uid = Some(uid);
        *self.upstreams.in_flight.entry(ep_addr).or_default() += 1;
        self.upstreams
            .active
            .insert(uid, UpReq::new(UpRef::Stream(sid), ep, req));
        self.push(self.now + lat, Ev::UpstreamArrive { uid });
    }
}
