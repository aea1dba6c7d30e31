//! The response path of a stream: the upstream's response through the filter's
//! response callbacks, the filter continuing, local replies (the filter's, the router's
//! and Envoy's own), and what the client receives when.

use super::stream::{Answer, ResponseHold};
use super::Sim;
use crate::host::vm::Callback;
use crate::world::clock::Nanos;
use crate::world::outcomes::Final;

impl Sim {
    /// The upstream's response head reaches Envoy: `on_response_headers`.
    pub(super) fn on_response_head(
        &mut self,
        sid: usize,
        status: u16,
        headers: Vec<(String, String)>,
    ) {
        if self.requests.streams[sid].finished() {
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
        if self.requests.streams[sid].finished() {
            return;
        }
        if action == 0 {
            self.send_head_from_filter(sid);
        } else {
            self.requests.streams[sid].response_hold = ResponseHold::Stop;
        }
    }

    /// The response head as the filter left it goes to the client; the filter can no longer
    /// change it.
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

    /// A piece of the upstream's response body: `on_response_body(.., false)` with what is
    /// buffered so far.
    pub(super) fn on_response_data(&mut self, sid: usize, bytes: Vec<u8>) {
        if self.requests.streams[sid].finished() {
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
        if self.requests.streams[sid].finished() {
            return;
        }
        if action == 0 {
            self.requests.streams[sid].response_hold = ResponseHold::None;
            self.flush_response(sid);
        } else {
            self.requests.streams[sid].response_hold = ResponseHold::Stop;
        }
    }

    /// The end of the upstream's response: `on_response_body(.., true)`; the client gets
    /// the end once the filter lets the response go.
    pub(super) fn on_response_end(&mut self, sid: usize) {
        if self.requests.streams[sid].finished() {
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
        if self.requests.streams[sid].finished() {
            return;
        }
        if action == 0 {
            self.requests.streams[sid].response_hold = ResponseHold::None;
            self.flush_response(sid);
            self.client_end(sid);
        } else {
            self.requests.streams[sid].response_hold = ResponseHold::StopWithEnd;
        }
    }

    /// What the filter held of the response goes to the client (the head first, if not sent
    /// yet).
    pub(super) fn flush_response(&mut self, sid: usize) {
        if self.requests.streams[sid].answer != Answer::HeadSent {
            self.send_head_from_filter(sid);
        }
        let body = Self::http(&mut self.vms, &self.requests.streams[sid])
            .map(|h| std::mem::take(&mut h.resp_body))
            .unwrap_or_default();
        if !body.is_empty() {
            self.client_data(sid, &body);
        }
    }

    /// The filter continues the response (`proxy_continue_stream`): what it held goes to
    /// the client, and the end if the upstream is done.
    pub(super) fn continue_response(&mut self, sid: usize) {
        let s = &mut self.requests.streams[sid];
        if s.finished() || s.response_hold == ResponseHold::None {
            return;
        }
        let ended = s.response_hold == ResponseHold::StopWithEnd;
        s.response_hold = ResponseHold::None;
        self.flush_response(sid);
        if ended {
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
        if s.finished() {
            return;
        }
        if s.answer != Answer::Nothing {
            self.reset_stream(sid, Final::Reset);
            return;
        }
        self.requests.streams[sid].answer = Answer::LocalReply;
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
            && self.requests.streams[sid].started()
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
            if self.requests.streams[sid].finished() {
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
                if self.requests.streams[sid].finished() {
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

    /// When something sent to the client now reaches it (after the client hop, in order).
    pub(super) fn client_time(&mut self, sid: usize) -> Nanos {
        let lat = self.cfg.network.client.draw(&mut self.rng);
        let s = &mut self.requests.streams[sid];
        let t = (self.now + lat).max(s.last_client + 1);
        s.last_client = t;
        t
    }

    /// The client receives the response head.
    pub(super) fn client_head(&mut self, sid: usize, headers: Vec<(String, String)>) {
        self.client_time(sid);
        self.requests.streams[sid].answer = Answer::HeadSent;
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

    /// The client receives a piece of the body (kept up to 1 MiB).
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

    /// The client receives the end of the response: the stream is over.
    pub(super) fn client_end(&mut self, sid: usize) {
        let t = self.client_time(sid);
        self.requests.outcomes[sid].last_token_at = Some(t);
        self.finalize(sid, Final::Response, t);
        self.finish_stream(sid);
    }
}
