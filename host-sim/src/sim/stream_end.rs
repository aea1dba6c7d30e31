//! The end of a stream: its final outcome, Envoy's deferred deletion (`on_log`,
//! `on_done`, `on_delete` after the current event), resets, client disconnects and the
//! stream idle timeout.

use super::events::Ev;
use super::stream::{Answer, Hold, Phase, ResponseHold};
use super::Sim;
use crate::host::vm::Callback;
use crate::world::clock::Nanos;
use crate::world::invariants::Violation;
use crate::world::outcomes::Final;

impl Sim {
    /// Records the request's final outcome; a second one is a violation.
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
        if s.finished() {
            return;
        }
        s.phase = Phase::Finished;
        s.paused = false;
        self.cancel_upstream(sid);
        self.requests.finished.push(sid);
    }

    /// After an event: the filter contexts of finished streams end (`on_log`, `on_done`,
    /// `on_delete`), except those whose VM is suspended in a callback (they end once it is
    /// back).
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

    /// Ends the filter's context of a finished stream: `on_log`, `on_done`, `on_delete`.
    pub(super) fn complete(&mut self, sid: usize) {
        let s = &self.requests.streams[sid];
        if s.completed() {
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
        self.requests.streams[sid].phase = Phase::Completed;
    }

    /// Resets the stream: the upstream request is cancelled and the client sees the reset
    /// (`fin`).
    pub(super) fn reset_stream(&mut self, sid: usize, fin: Final) {
        if self.requests.streams[sid].finished() {
            return;
        }
        self.cancel_upstream(sid);
        let t = self.client_time(sid);
        self.finalize(sid, fin, t);
        self.finish_stream(sid);
    }

    /// The client disconnects: a stream Envoy holds is reset; a request Envoy has not seen
    /// yet just ends.
    pub(super) fn on_disconnect(&mut self, rid: usize) {
        if self.requests.outcomes[rid].fin != Final::Pending {
            return;
        }
        if !self.requests.streams[rid].started() {
            // Gone before Envoy saw the request.
            self.finalize(rid, Final::Disconnected, self.now);
            return;
        }
        self.reset_stream(rid, Final::Disconnected);
    }

    /// Arms Envoy's stream idle timer.
    pub(super) fn arm_idle(&mut self, rid: usize) {
        if self.cfg.stream_idle_timeout > 0 {
            self.push(
                self.now + self.cfg.stream_idle_timeout,
                Ev::IdleCheck { rid },
            );
        }
    }

    /// Envoy's stream idle timer: re-armed while the stream is active; at the timeout the
    /// stream ends (408 before the response head, else a reset), and a stream the filter
    /// still held counts as leaked.
    pub(super) fn on_idle_check(&mut self, rid: usize) {
        let s = &self.requests.streams[rid];
        if s.finished() {
            return;
        }
        let due = s.last_activity + self.cfg.stream_idle_timeout;
        if self.now < due {
            self.push(due, Ev::IdleCheck { rid });
            return;
        }
        if s.hold != Hold::None || s.paused || s.response_hold != ResponseHold::None {
            // Envoy would have held it until the idle timeout: the filter leaked it.
            self.checks.leaked.push(rid);
        }
        if s.answer == Answer::HeadSent {
            self.reset_stream(rid, Final::Reset);
        } else {
            self.local_reply(rid, 408, b"stream timeout".to_vec(), Vec::new(), true);
        }
    }
}
