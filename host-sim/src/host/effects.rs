//! What a host call asks for but Envoy does later.
//!
//! `proxy_continue_stream`, `proxy_send_local_response` and `proxy_close_stream` are
//! "after VM call actions" in Envoy: queued during the callback and run, in order, when
//! the callback returns (each one may call back into the VM, whose own actions then run
//! when that nested call returns). Queue notifications and HTTP callouts leave the VM as
//! [`Outgoing`] messages the world schedules.

/// Which direction of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamDir {
    /// The request (decoding).
    Request,
    /// The response (encoding).
    Response,
}

/// A deferred action, on the effective context at the time of the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Resume filter iteration.
    Continue {
        /// HTTP context id.
        ctx: u32,
        /// Direction.
        dir: StreamDir,
    },
    /// Answer the stream locally.
    LocalReply {
        /// HTTP context id.
        ctx: u32,
        /// HTTP status.
        status: u16,
        /// Response code details.
        details: String,
        /// Body.
        body: Vec<u8>,
        /// Extra headers.
        headers: Vec<(String, String)>,
    },
    /// Reset the stream.
    Close {
        /// HTTP context id.
        ctx: u32,
    },
}

/// A message leaving the VM for the world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outgoing {
    /// A message was enqueued on this queue: notify its owner.
    QueueReady {
        /// Thread slot of the owner.
        slot: usize,
        /// Owner's root context.
        root: u32,
        /// Queue token.
        token: u32,
    },
    /// An HTTP callout was dispatched.
    HttpCall {
        /// Token returned to the filter (its root receives the response).
        token: u32,
        /// Cluster name.
        cluster: String,
        /// Request headers.
        headers: Vec<(String, String)>,
        /// Request body.
        body: Vec<u8>,
        /// Timeout in milliseconds.
        timeout_ms: u32,
    },
}
