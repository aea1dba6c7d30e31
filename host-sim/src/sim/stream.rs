//! One request's stream through Envoy: its state ([`Stream`]: a phase per concern plus
//! a few independent flags), and calling the filter for it. The request path is in
//! `request_path`, the response path and local replies in `response_path`, the end of
//! a stream in `stream_end`.

use super::vms::Vms;
use super::Sim;
use crate::host::vm::{Callback, HttpData};
use crate::world::client::Connections;
use crate::world::clock::Nanos;
use crate::world::outcomes::Outcome;
use crate::world::workload::RequestSpec;

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

/// Where a stream is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Phase {
    /// Envoy has not seen the request's headers yet.
    #[default]
    Waiting,
    /// Envoy holds the stream: the request and response are on their way.
    Open,
    /// Over for the client (answered, reset or gone); the filter's `on_log`, `on_done`
    /// and `on_delete` are still to run, after the current event.
    Finished,
    /// Over, and the filter's context is gone.
    Completed,
}

/// How far the request has gone past the filter, to the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum RequestProgress {
    /// The headers are still in the filter chain.
    #[default]
    InFilter,
    /// The headers went on: the router picked the upstream.
    HeadersPassed,
    /// The whole request went on: it was sent upstream (or the connection failed).
    EndPassed,
}

/// The filter's hold on the request (what its last request callback returned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Hold {
    /// Iteration goes on.
    #[default]
    None,
    /// `StopIteration`: the request waits in the filter; body pieces still reach its
    /// callbacks (buffered, cumulative).
    Stop,
    /// `StopAllIteration` (headers callback without `allow_on_headers_stop_iteration`):
    /// no body callbacks until the filter continues.
    StopAll,
}

/// The filter's hold on the response (what its last response callback returned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum ResponseHold {
    /// Iteration goes on: what the upstream sends goes on to the client.
    #[default]
    None,
    /// Stopped: the response waits in the filter.
    Stop,
    /// Stopped, and the upstream response is over: continuing also ends it.
    StopWithEnd,
}

/// How far the client has been answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Answer {
    /// Nothing yet.
    #[default]
    Nothing,
    /// A local reply is on its way through the filter's response callbacks (another
    /// one now resets the stream).
    LocalReply,
    /// The response head is at the client (a local reply now resets the stream).
    HeadSent,
}

/// Envoy's stream for one request.
#[derive(Default)]
pub(super) struct Stream {
    /// The gateway replica (Envoy process) the request's connection landed on.
    pub(super) replica: usize,
    /// The worker (of that replica) the request's connection landed on.
    pub(super) worker: usize,
    /// The VM whose filter handles it (set when Envoy sees the headers).
    pub(super) vm: usize,
    /// Its HTTP context id in that VM (0: none).
    pub(super) ctx: u32,
    /// Where it is in its life.
    pub(super) phase: Phase,
    /// Whether the filter sees it: false when the filter is bypassed (stand-in
    /// balancer, plugin removed, `FAIL_OPEN`) or its VM failed.
    pub(super) filter: bool,
    /// How far the request has gone past the filter.
    pub(super) request: RequestProgress,
    /// The filter's hold on the request.
    pub(super) hold: Hold,
    /// Held with the whole request in hand: the request waits (is queued) in the filter.
    /// Sets the outcome's `enqueued_at` the first time.
    pub(super) paused: bool,
    /// The filter's hold on the response.
    pub(super) response_hold: ResponseHold,
    /// What the client has been sent.
    pub(super) answer: Answer,
    /// The request body's size.
    pub(super) body_len: usize,
    /// Request body bytes that reached Envoy so far.
    pub(super) delivered: usize,
    /// The end of the request body reached Envoy.
    pub(super) body_complete: bool,
    /// The upstream the router picked (`ip:port`).
    pub(super) endpoint: Option<String>,
    /// Its upstream request, once sent.
    pub(super) uid: Option<u64>,
    /// When the last piece sent to the client reaches it (the client connection delivers
    /// in order).
    pub(super) last_client: Nanos,
    /// The last activity on the stream, for Envoy's stream idle timeout.
    pub(super) last_activity: Nanos,
}

impl Stream {
    /// Envoy has seen the request.
    pub(super) fn started(&self) -> bool {
        self.phase != Phase::Waiting
    }

    /// The stream is over for the client.
    pub(super) fn finished(&self) -> bool {
        matches!(self.phase, Phase::Finished | Phase::Completed)
    }

    /// The filter's context is gone too.
    pub(super) fn completed(&self) -> bool {
        self.phase == Phase::Completed
    }

    /// Envoy still holds it (started, not completed).
    pub(super) fn held(&self) -> bool {
        matches!(self.phase, Phase::Open | Phase::Finished)
    }
}

impl Sim {
    /// The filter's view of stream `s` (its HTTP context in its VM), while it exists.
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
        if !s.filter || s.finished() {
            return None;
        }
        let (vm, ctx) = (s.vm, s.ctx);
        if self.vms[vm].failed.is_some() {
            self.fail_stream(sid);
            return None;
        }
        self.requests.streams[sid].last_activity = self.now;
        let r = self.call(vm, cb(ctx));
        if r.is_none() && !self.requests.streams[sid].finished() {
            self.fail_stream(sid);
        }
        r
    }
}
