//! Per-request outcomes, as the tests query them.

use super::clock::Nanos;

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Final {
    /// Not finished yet.
    Pending,
    /// A complete response reached the client.
    Response,
    /// The stream was reset (the client saw no complete response).
    Reset,
    /// The client gave up (disconnected) before the response completed.
    Disconnected,
}

/// What happened to one request.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Index in the order requests were added.
    pub id: usize,
    /// The label of its spec.
    pub label: String,
    /// How it ended.
    pub fin: Final,
    /// HTTP status the client got (`None` for reset/disconnected before the head).
    pub status: Option<u16>,
    /// Response headers (lower-case names; `:status` excluded).
    pub headers: Vec<(String, String)>,
    /// Response body as received.
    pub body: Vec<u8>,
    /// The worker whose Envoy thread handled it.
    pub worker: Option<usize>,
    /// The gateway replica (Envoy process) its connection landed on (0 with one).
    pub replica: usize,
    /// The endpoint the router sent it to.
    pub endpoint: Option<String>,
    /// Sent by the client.
    pub sent_at: Nanos,
    /// First paused by the filter (entered a queue), if ever.
    pub enqueued_at: Option<Nanos>,
    /// Sent upstream by the router.
    pub dispatched_at: Option<Nanos>,
    /// First response body byte at the client.
    pub first_token_at: Option<Nanos>,
    /// Last response byte at the client.
    pub last_token_at: Option<Nanos>,
    /// When each non-empty response body piece reached the client (a streamed response
    /// sends one per engine step that produced a token), for inter-token latency.
    pub data_at: Vec<Nanos>,
    /// Final outcome time.
    pub finished_at: Option<Nanos>,
}

impl Outcome {
    /// A response header.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (`Null` if it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_default()
    }
}
