//! Response bodies: a plain byte body, or a server-sent-event stream fed by
//! the engine's events. Chunks already produced are written together; a
//! chunk is never held back waiting for the next one.

use super::errors::ApiError;
use super::openai::ChunkWriter;
use crate::engine::{EventKind, Usage};
use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc::UnboundedReceiver;

/// An engine event for choice `choice` of a response.
#[derive(Clone, Debug, PartialEq)]
pub struct Routed {
    pub choice: usize,
    pub kind: EventKind,
}

/// The body of every response.
pub enum ResponseBody {
    Full(Option<Bytes>),
    Sse(Box<SseStream>),
}

impl ResponseBody {
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        ResponseBody::Full(Some(bytes.into()))
    }

    pub fn empty() -> Self {
        ResponseBody::Full(None)
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            ResponseBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            ResponseBody::Sse(stream) => stream
                .poll_chunks(cx)
                .map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Full(bytes) => bytes.is_none(),
            ResponseBody::Sse(stream) => stream.encoder.is_done(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ResponseBody::Full(None) => SizeHint::with_exact(0),
            ResponseBody::Sse(_) => SizeHint::default(),
        }
    }
}

/// Turns a streaming request's engine events into SSE frames, without I/O: the
/// completions/chat chunks ([`SseEncoder`]) or the Responses API's events
/// ([`super::responses::ResponsesEncoder`]).
pub trait StreamEncoder: Send {
    /// Frames written before any engine event (none by default).
    fn start(&mut self, _out: &mut String) {}

    /// Appends the frames of one engine event (and the closing frames after the last).
    fn event(&mut self, out: &mut String, routed: Routed);

    /// Appends the frames that end a stream whose request the engine dropped.
    fn aborted(&mut self, out: &mut String);

    /// Whether the stream is over.
    fn is_done(&self) -> bool;
}

/// The SSE stream of one streaming request (one or more choices): the frames of a
/// [`StreamEncoder`], written as soon as the engine's events arrive.
pub struct SseStream {
    rx: UnboundedReceiver<Routed>,
    encoder: Box<dyn StreamEncoder>,
    started: bool,
}

impl SseStream {
    /// The stream of a completions or chat request.
    pub fn new(
        rx: UnboundedReceiver<Routed>,
        writer: ChunkWriter,
        chat: bool,
        include_usage: bool,
        continuous_usage: bool,
        prompt_tokens: &[usize],
    ) -> Self {
        Self::with_encoder(
            rx,
            Box::new(SseEncoder::new(
                writer,
                chat,
                include_usage,
                continuous_usage,
                prompt_tokens,
            )),
        )
    }

    /// The stream of any encoder.
    pub fn with_encoder(rx: UnboundedReceiver<Routed>, encoder: Box<dyn StreamEncoder>) -> Self {
        SseStream {
            rx,
            encoder,
            started: false,
        }
    }

    fn poll_chunks(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        if self.encoder.is_done() {
            return Poll::Ready(None);
        }
        let mut out = String::new();
        if !self.started {
            self.started = true;
            self.encoder.start(&mut out);
        }
        while out.len() < 64 * 1024 {
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(routed)) => {
                    self.encoder.event(&mut out, routed);
                    if self.encoder.is_done() {
                        break;
                    }
                }
                Poll::Ready(None) => {
                    // The engine dropped the request (server shutting down).
                    self.encoder.aborted(&mut out);
                    break;
                }
                Poll::Pending => break,
            }
        }
        if out.is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(Some(Bytes::from(out)))
        }
    }
}

/// The SSE frames of one streaming response, from the engine's events, without I/O:
/// the bytes the server's [`SseStream`] writes (a discrete-event simulator uses it to
/// answer exactly as the server does).
#[derive(Clone, Debug)]
pub struct SseEncoder {
    writer: ChunkWriter,
    chat: bool,
    include_usage: bool,
    continuous_usage: bool,
    /// Per choice: prompt tokens, tokens so far, role chunk sent, finished.
    choices: Vec<ChoiceState>,
    unfinished: usize,
    usage: Usage,
    done: bool,
}

#[derive(Clone, Copy, Debug, Default)]
struct ChoiceState {
    prompt_tokens: usize,
    tokens: usize,
    role_sent: bool,
}

impl SseEncoder {
    /// An encoder for a response with one choice per entry of `prompt_tokens`.
    pub fn new(
        writer: ChunkWriter,
        chat: bool,
        include_usage: bool,
        continuous_usage: bool,
        prompt_tokens: &[usize],
    ) -> Self {
        SseEncoder {
            writer,
            chat,
            include_usage,
            continuous_usage,
            choices: prompt_tokens
                .iter()
                .map(|&p| ChoiceState {
                    prompt_tokens: p,
                    ..Default::default()
                })
                .collect(),
            unfinished: prompt_tokens.len(),
            usage: Usage::default(),
            done: false,
        }
    }

    /// Whether the stream is over (`data: [DONE]` written).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Appends the frames of one engine event; after the last choice finished, also
    /// the usage chunk (with `include_usage`) and `data: [DONE]`.
    pub fn event(&mut self, out: &mut String, routed: Routed) {
        if self.done {
            return;
        }
        self.write_event(out, routed);
        if self.unfinished == 0 {
            if self.include_usage {
                self.writer.usage(out, &self.usage);
            }
            self.writer.done(out);
            self.done = true;
        }
    }

    /// Appends the error frame and `data: [DONE]` for a request the engine dropped.
    pub fn aborted(&mut self, out: &mut String) {
        if self.done {
            return;
        }
        self.writer
            .error(out, &ApiError::new(500, "request aborted"));
        self.writer.done(out);
        self.done = true;
    }

    fn write_event(&mut self, out: &mut String, routed: Routed) {
        let Some(state) = self.choices.get_mut(routed.choice) else {
            return;
        };
        let index = routed.choice;
        if self.chat && !state.role_sent {
            state.role_sent = true;
            self.writer.role(out, index);
        }
        match routed.kind {
            EventKind::Token { text, .. } => {
                state.tokens += 1;
                let running = Usage {
                    prompt_tokens: state.prompt_tokens,
                    completion_tokens: state.tokens,
                    cached_tokens: 0,
                };
                let usage = self.continuous_usage.then_some(&running);
                self.writer.token(out, index, text, usage);
            }
            EventKind::Finished(f) => {
                self.unfinished = self.unfinished.saturating_sub(1);
                self.usage.prompt_tokens += f.usage.prompt_tokens;
                self.usage.completion_tokens += f.usage.completion_tokens;
                self.usage.cached_tokens += f.usage.cached_tokens;
                let usage = self.continuous_usage.then_some(&f.usage);
                self.writer.finish(out, index, f.reason, usage);
            }
        }
    }
}

impl StreamEncoder for SseEncoder {
    fn event(&mut self, out: &mut String, routed: Routed) {
        SseEncoder::event(self, out, routed);
    }

    fn aborted(&mut self, out: &mut String) {
        SseEncoder::aborted(self, out);
    }

    fn is_done(&self) -> bool {
        self.done
    }
}
