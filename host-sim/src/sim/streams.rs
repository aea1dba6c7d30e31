//! One stream through Envoy: the filter's request and response callbacks, pause and
//! continue, buffering, the router, local replies, the client's view, and the end of the
//! stream (`on_log`, `on_done`, `on_delete`).

use super::events::Ev;
use super::upstreams::{UpRef, UpReq};
use super::vms::Vms;
use super::{FailurePolicy, Sim};
use crate::host::vm::{Callback, HttpData};
use crate::slot_of_worker;
use crate::world::balancers::{Candidate, Pick};
use crate::world::client::Connections;
use crate::world::clock::{Nanos, US};
use crate::world::invariants::Violation;
use crate::world::outcomes::{Final, Outcome};
use crate::world::upstream::UpstreamRequest;
use crate::world::workload::RequestSpec;
use anyhow::Result;

/// The clients' requests, by id: what each client sends, Envoy's stream for it, and
/// what the client saw.
#[derive(Default)]
pub(super) struct Requests {
    /// What each client sends, and when.
    pub(super) specs: Vec<RequestSpec>,
    /// Envoy's stream for each.
    pub(super) streams: Vec<Stream>,
    /// What each client saw.
    pub(super) outcomes: Vec<Outcome>,
    /// Clients' connections and the worker each one landed on.
    pub(super) conns: Connections,
    /// Streams that finished during the current event: their filter contexts end
    /// (`on_log`, `on_done`, `on_delete`) after it, as Envoy's deferred deletion does.
    pub(super) finished: Vec<usize>,
}

#[derive(Default)]
pub(super) struct Stream {
    pub(super) worker: usize,
    pub(super) vm: usize,
    pub(super) ctx: u32,
    pub(super) filter: bool,
    pub(super) started: bool,
    pub(super) body_len: usize,
    pub(super) body_complete: bool,
    pub(super) stop_all: bool,
    pub(super) headers_passed: bool,
    pub(super) req_stopped: bool,
    pub(super) eos_passed: bool,
    pub(super) endpoint: Option<String>,
    pub(super) uid: Option<u64>,
    pub(super) head_sent: bool,
    pub(super) resp_stopped: bool,
    pub(super) resp_end_pending: bool,
    pub(super) upstream_ended: bool,
    pub(super) in_local_reply: bool,
    pub(super) finished: bool,
    pub(super) completed: bool,
    pub(super) last_client: Nanos,
    pub(super) last_activity: Nanos,
    pub(super) paused: bool,
    pub(super) delivered: usize,
}

impl Sim {
    pub(super) fn http<'a>(vms: &'a mut Vms, s: &Stream) -> Option<&'a mut HttpData> {
        vms.all
            .get_mut(s.vm)?
            .as_mut()?
            .store
            .data_mut()
            .streams
            .get_mut(&s.ctx)
    }

    /// Calls a stream callback; if the VM is dead, Envoy fails the stream (503).
    pub(super) fn stream_call(&mut self, sid: usize, cb: impl Fn(u32) -> Callback) -> Option<i32> {
        let s = &self.requests.streams[sid];
        if !s.filter || s.finished {
            return None;
        }
        let (vm, ctx) = (s.vm, s.ctx);
        if self.vms[vm].failed.is_some() {
            self.fail_stream(sid);
            return None;
        }
        self.requests.streams[sid].last_activity = self.now;
        let r = self.call(vm, cb(ctx));
        if r.is_none() && !self.requests.streams[sid].finished {
            self.fail_stream(sid);
        }
        r
    }

    pub(super) fn on_headers(&mut self, rid: usize) -> Result<()> {
        if self.requests.outcomes[rid].fin != Final::Pending {
            return Ok(()); // the client already gave up
        }
        let worker = self.requests.streams[rid].worker;
        self.requests.outcomes[rid].worker = Some(worker);
        let slot = slot_of_worker(worker);
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
        headers.push((
            "x-request-id".into(),
            format!("{:016x}-{rid}", self.rng.next_u64()),
        ));
        let body_len = spec.body.len();
        let eos = body_len == 0;
        let st = &mut self.requests.streams[rid];
        st.worker = worker;
        st.started = true;
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
            if !self.requests.streams[rid].finished {
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
        if self.requests.streams[sid].finished {
            return;
        }
        if action == 0 {
            // Continue: everything the filter held goes on.
            self.requests.streams[sid].req_stopped = false;
            self.set_paused(sid, false);
            if !self.requests.streams[sid].headers_passed {
                let headers = Self::http(&mut self.vms, &self.requests.streams[sid])
                    .map(|h| h.req_headers.clone())
                    .unwrap_or_default();
                self.pass_headers(sid, headers);
            }
            if let Some(h) = Self::http(&mut self.vms, &self.requests.streams[sid]) {
                h.req_body.clear();
            }
            if eos && !self.requests.streams[sid].finished {
                self.pass_eos(sid);
            }
        } else {
            self.requests.streams[sid].req_stopped = true;
            if headers_cb && !self.cfg.allow_on_headers_stop_iteration {
                // StopAllIterationAndWatermark: no body callbacks until continued.
                self.requests.streams[sid].stop_all = true;
            }
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

    pub(super) fn set_paused(&mut self, sid: usize, paused: bool) {
        let s = &mut self.requests.streams[sid];
        if paused && !s.paused && self.requests.outcomes[sid].enqueued_at.is_none() {
            self.requests.outcomes[sid].enqueued_at = Some(self.now);
        }
        s.paused = paused;
    }

    pub(super) fn on_body(&mut self, rid: usize, len: usize) {
        let s = &self.requests.streams[rid];
        if !s.started || s.finished {
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
        if self.requests.streams[rid].stop_all {
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

    pub(super) fn on_body_end(&mut self, rid: usize) {
        let s = &mut self.requests.streams[rid];
        if !s.started || s.finished {
            return;
        }
        s.body_complete = true;
        s.last_activity = self.now;
        if !s.filter {
            self.pass_eos(rid);
            return;
        }
        if s.stop_all {
            return;
        }
        if s.headers_passed && !s.req_stopped {
            // Iteration continues: the end of stream still goes through the filter.
        }
        let size =
            Self::http(&mut self.vms, &self.requests.streams[rid]).map_or(0, |h| h.req_body.len());
        let Some(action) = self.stream_call(rid, |c| Callback::RequestBody(c, size as u32, true))
        else {
            return;
        };
        self.after_request_action(rid, action, true, false);
    }

    pub(super) fn continue_request(&mut self, sid: usize) {
        let s = &mut self.requests.streams[sid];
        if s.finished || (!s.req_stopped && !s.stop_all) {
            return;
        }
        s.req_stopped = false;
        s.stop_all = false;
        self.set_paused(sid, false);
        if !self.requests.streams[sid].headers_passed {
            let headers = Self::http(&mut self.vms, &self.requests.streams[sid])
                .map(|h| h.req_headers.clone())
                .unwrap_or_default();
            self.pass_headers(sid, headers);
        }
        if self.requests.streams[sid].finished {
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
        self.requests.streams[sid].headers_passed = true;
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
            worker: self.requests.streams[sid].worker,
            path: &spec.path,
            body: &spec.body,
            candidates: &candidates,
        };
        self.upstreams.balancer.as_mut()?.pick(&pick)
    }

    /// The end of the request leaves the filter: the router sends it upstream.
    pub(super) fn pass_eos(&mut self, sid: usize) {
        let s = &mut self.requests.streams[sid];
        if s.eos_passed || s.finished {
            return;
        }
        s.eos_passed = true;
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

    pub(super) fn on_response_head(
        &mut self,
        sid: usize,
        status: u16,
        headers: Vec<(String, String)>,
    ) {
        if self.requests.streams[sid].finished {
            return;
        }
        let mut all = vec![(":status".to_string(), status.to_string())];
        all.extend(headers);
        if !self.requests.streams[sid].filter {
            self.client_head(sid, all);
            return;
        }
        if let Some(h) = Self::http(&mut self.vms, &self.requests.streams[sid]) {
            h.resp_headers = Some(all);
            h.resp_headers_writable = true;
            h.response_code = Some(status);
        }
        let n = Self::http(&mut self.vms, &self.requests.streams[sid])
            .and_then(|h| h.resp_headers.as_ref().map(Vec::len))
            .unwrap_or(0);
        let Some(action) = self.stream_call(sid, |c| Callback::ResponseHeaders(c, n as u32, false))
        else {
            return;
        };
        if self.requests.streams[sid].finished {
            return;
        }
        if action == 0 {
            self.send_head_from_filter(sid);
        } else {
            self.requests.streams[sid].resp_stopped = true;
        }
    }

    pub(super) fn send_head_from_filter(&mut self, sid: usize) {
        let headers = match Self::http(&mut self.vms, &self.requests.streams[sid]) {
            Some(h) => {
                h.resp_headers_writable = false;
                h.resp_headers.clone().unwrap_or_default()
            }
            None => Vec::new(),
        };
        self.client_head(sid, headers);
    }

    pub(super) fn on_response_data(&mut self, sid: usize, bytes: Vec<u8>) {
        if self.requests.streams[sid].finished {
            return;
        }
        self.requests.streams[sid].last_activity = self.now;
        if !self.requests.streams[sid].filter {
            self.client_data(sid, &bytes);
            return;
        }
        let size = match Self::http(&mut self.vms, &self.requests.streams[sid]) {
            Some(h) => {
                h.resp_body.extend_from_slice(&bytes);
                h.resp_body.len()
            }
            None => 0,
        };
        let Some(action) = self.stream_call(sid, |c| Callback::ResponseBody(c, size as u32, false))
        else {
            return;
        };
        if self.requests.streams[sid].finished {
            return;
        }
        if action == 0 {
            self.requests.streams[sid].resp_stopped = false;
            self.flush_response(sid);
        } else {
            self.requests.streams[sid].resp_stopped = true;
        }
    }

    pub(super) fn on_response_end(&mut self, sid: usize) {
        if self.requests.streams[sid].finished {
            return;
        }
        if !self.requests.streams[sid].filter {
            self.client_end(sid);
            return;
        }
        let size =
            Self::http(&mut self.vms, &self.requests.streams[sid]).map_or(0, |h| h.resp_body.len());
        let Some(action) = self.stream_call(sid, |c| Callback::ResponseBody(c, size as u32, true))
        else {
            return;
        };
        if self.requests.streams[sid].finished {
            return;
        }
        if action == 0 {
            self.requests.streams[sid].resp_stopped = false;
            self.flush_response(sid);
            self.client_end(sid);
        } else {
            self.requests.streams[sid].resp_stopped = true;
            self.requests.streams[sid].resp_end_pending = true;
        }
    }

    pub(super) fn flush_response(&mut self, sid: usize) {
        if !self.requests.streams[sid].head_sent {
            self.send_head_from_filter(sid);
        }
        let body = Self::http(&mut self.vms, &self.requests.streams[sid])
            .map(|h| std::mem::take(&mut h.resp_body))
            .unwrap_or_default();
        if !body.is_empty() {
            self.client_data(sid, &body);
        }
    }

    pub(super) fn continue_response(&mut self, sid: usize) {
        let s = &mut self.requests.streams[sid];
        if s.finished || !s.resp_stopped {
            return;
        }
        s.resp_stopped = false;
        self.flush_response(sid);
        if self.requests.streams[sid].resp_end_pending {
            self.client_end(sid);
        }
    }

    /// A local reply (from the filter, the router or Envoy itself). With `through_filter`,
    /// the filter's response callbacks see it, as in Envoy.
    pub(super) fn local_reply(
        &mut self,
        sid: usize,
        status: u16,
        body: Vec<u8>,
        extra: Vec<(String, String)>,
        through_filter: bool,
    ) {
        let s = &self.requests.streams[sid];
        if s.finished {
            return;
        }
        if s.head_sent || s.in_local_reply {
            self.reset_stream(sid, Final::Reset);
            return;
        }
        self.requests.streams[sid].in_local_reply = true;
        self.cancel_upstream(sid);
        let mut headers = vec![(":status".to_string(), status.to_string())];
        for (k, v) in extra {
            headers.push((k, v));
        }
        if !body.is_empty() {
            headers.push(("content-length".into(), body.len().to_string()));
            if !headers.iter().any(|(k, _)| k == "content-type") {
                headers.push(("content-type".into(), "text/plain".into()));
            }
        }
        let mut body = body;
        let run_filter = through_filter
            && self.requests.streams[sid].filter
            && self.requests.streams[sid].started
            && self.vms.all[self.requests.streams[sid].vm]
                .as_ref()
                .is_some_and(|v| v.failed.is_none());
        if run_filter {
            let eos = body.is_empty();
            let n = headers.len() as u32;
            if let Some(h) = Self::http(&mut self.vms, &self.requests.streams[sid]) {
                h.resp_headers = Some(headers.clone());
                h.resp_headers_writable = true;
                h.response_code = Some(status);
                h.resp_body.clear();
            }
            self.stream_call(sid, |c| Callback::ResponseHeaders(c, n, eos));
            if self.requests.streams[sid].finished {
                return;
            }
            if let Some(h) = Self::http(&mut self.vms, &self.requests.streams[sid]) {
                h.resp_headers_writable = false;
                if let Some(hh) = &h.resp_headers {
                    headers = hh.clone();
                }
            }
            if !eos {
                let len = body.len() as u32;
                if let Some(h) = Self::http(&mut self.vms, &self.requests.streams[sid]) {
                    h.resp_body = body.clone();
                }
                self.stream_call(sid, |c| Callback::ResponseBody(c, len, true));
                if self.requests.streams[sid].finished {
                    return;
                }
                if let Some(h) = Self::http(&mut self.vms, &self.requests.streams[sid]) {
                    body = std::mem::take(&mut h.resp_body);
                }
            }
        }
        self.client_head(sid, headers);
        if !body.is_empty() {
            self.client_data(sid, &body);
        }
        self.client_end(sid);
    }

    pub(super) fn client_time(&mut self, sid: usize) -> Nanos {
        let lat = self.cfg.network.client.draw(&mut self.rng);
        let s = &mut self.requests.streams[sid];
        let t = (self.now + lat).max(s.last_client + 1);
        s.last_client = t;
        t
    }

    pub(super) fn client_head(&mut self, sid: usize, headers: Vec<(String, String)>) {
        self.client_time(sid);
        self.requests.streams[sid].head_sent = true;
        let o = &mut self.requests.outcomes[sid];
        o.status = headers
            .iter()
            .find(|(k, _)| k == ":status")
            .and_then(|(_, v)| v.parse().ok());
        o.headers = headers
            .into_iter()
            .filter(|(k, _)| k != ":status")
            .collect();
    }

    pub(super) fn client_data(&mut self, sid: usize, bytes: &[u8]) {
        let t = self.client_time(sid);
        let o = &mut self.requests.outcomes[sid];
        if !bytes.is_empty() {
            o.first_token_at.get_or_insert(t);
            o.data_at.push(t);
        }
        if o.body.len() < 1 << 20 {
            o.body.extend_from_slice(bytes);
        }
    }

    pub(super) fn client_end(&mut self, sid: usize) {
        let t = self.client_time(sid);
        self.requests.outcomes[sid].last_token_at = Some(t);
        self.finalize(sid, Final::Response, t);
        self.finish_stream(sid);
    }

    pub(super) fn finalize(&mut self, sid: usize, fin: Final, at: Nanos) {
        let o = &mut self.requests.outcomes[sid];
        if o.fin != Final::Pending {
            self.checks.violations.push(Violation {
                invariant: "every request has exactly one final outcome".into(),
                at: self.now,
                after_event: self.events.current.clone(),
                message: format!("request {sid} ended as {:?} and again as {fin:?}", o.fin),
            });
            return;
        }
        o.fin = fin;
        o.finished_at = Some(at);
    }

    /// The stream is over in Envoy: the filter's `on_log`, `on_done` and `on_delete` run
    /// when the current event is done (Envoy's deferred deletion).
    pub(super) fn finish_stream(&mut self, sid: usize) {
        let s = &mut self.requests.streams[sid];
        if s.finished {
            return;
        }
        s.finished = true;
        s.paused = false;
        if s.uid.is_some() && !s.upstream_ended {
            self.cancel_upstream(sid);
        }
        self.requests.finished.push(sid);
    }

    pub(super) fn run_deferred(&mut self) {
        let mut held = Vec::new();
        while !self.requests.finished.is_empty() {
            let batch = std::mem::take(&mut self.requests.finished);
            for sid in batch {
                if self.vms.busy.contains(&self.requests.streams[sid].vm) {
                    held.push(sid); // its VM is suspended: complete it when it is back
                } else {
                    self.complete(sid);
                }
            }
        }
        self.requests.finished = held;
    }

    pub(super) fn complete(&mut self, sid: usize) {
        let s = &self.requests.streams[sid];
        if s.completed {
            return;
        }
        let (vm, ctx, filter) = (s.vm, s.ctx, s.filter && s.ctx != 0);
        if filter && self.vms[vm].failed.is_none() {
            self.call(vm, Callback::Log(ctx));
            if self.vms[vm].failed.is_none() {
                self.call(vm, Callback::Done(ctx));
            }
            if self.vms[vm].failed.is_none() {
                self.call(vm, Callback::Delete(ctx));
            }
        }
        self.vms[vm].store.data_mut().streams.remove(&ctx);
        self.requests.streams[sid].completed = true;
    }

    pub(super) fn reset_stream(&mut self, sid: usize, fin: Final) {
        if self.requests.streams[sid].finished {
            return;
        }
        self.cancel_upstream(sid);
        let t = self.client_time(sid);
        self.finalize(sid, fin, t);
        self.finish_stream(sid);
    }

    pub(super) fn on_disconnect(&mut self, rid: usize) {
        if self.requests.outcomes[rid].fin != Final::Pending {
            return;
        }
        if !self.requests.streams[rid].started {
            // Gone before Envoy saw the request.
            self.finalize(rid, Final::Disconnected, self.now);
            return;
        }
        self.reset_stream(rid, Final::Disconnected);
    }

    pub(super) fn arm_idle(&mut self, rid: usize) {
        if self.cfg.stream_idle_timeout > 0 {
            self.push(
                self.now + self.cfg.stream_idle_timeout,
                Ev::IdleCheck { rid },
            );
        }
    }

    pub(super) fn on_idle_check(&mut self, rid: usize) {
        let s = &self.requests.streams[rid];
        if s.finished {
            return;
        }
        let due = s.last_activity + self.cfg.stream_idle_timeout;
        if self.now < due {
            self.push(due, Ev::IdleCheck { rid });
            return;
        }
        if s.req_stopped || s.paused || s.resp_stopped {
            // Envoy would have held it until the idle timeout: the filter leaked it.
            self.checks.leaked.push(rid);
        }
        if s.head_sent {
            self.reset_stream(rid, Final::Reset);
        } else {
            self.local_reply(rid, 408, b"stream timeout".to_vec(), Vec::new(), true);
        }
    }
}
