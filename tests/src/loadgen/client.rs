//! The HTTP/1.1 client: hyper 1 connections with TCP_NODELAY, a keep-alive pool per
//! target (or a new connection per request), and per-request timing of the response
//! head, the first token and every body read that carried tokens.

use super::sse::{Scanner, Usage};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::Request;
use hyper_util::rt::TokioIo;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

type Sender = SendRequest<Full<Bytes>>;

/// Connections to a set of `host:port` targets.
pub struct Client {
    addrs: Vec<String>,
    pools: Vec<Mutex<Vec<Sender>>>,
    keep_alive: bool,
    connect_timeout: Duration,
}

/// What happened to one request.
#[derive(Debug, Default)]
pub struct Outcome {
    /// HTTP status, when a response head arrived.
    pub status: Option<u16>,
    /// Why there is no complete response (connect, protocol, ...).
    pub error: Option<String>,
    /// The `x-sim-server` response header (which model server answered).
    pub server: Option<String>,
    /// When the response head arrived.
    pub head_at: Option<Instant>,
    /// Each body read that carried tokens: when, and how many tokens.
    pub token_reads: Vec<(Instant, u32)>,
    /// When the body was complete.
    pub end_at: Option<Instant>,
    /// Usage as the server reported it.
    pub usage: Option<Usage>,
    /// Tokens counted in the stream (streamed requests).
    pub streamed_tokens: u64,
    /// Body bytes.
    pub body_bytes: u64,
    /// A new connection was opened for this request.
    pub new_connection: bool,
    /// The client closed the connection after the first token (asked for).
    pub cancelled: bool,
}

/// A GET's status and body.
pub struct Fetched {
    pub status: u16,
    pub body: Bytes,
}

fn host_port(target: &str) -> String {
    target
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string()
}

impl Client {
    /// `targets` are `host:port` (an `http://` prefix is accepted).
    pub fn new(targets: &[String], keep_alive: bool) -> Client {
        Client {
            addrs: targets.iter().map(|t| host_port(t)).collect(),
            pools: targets.iter().map(|_| Mutex::new(Vec::new())).collect(),
            keep_alive,
            connect_timeout: Duration::from_secs(5),
        }
    }

    pub fn targets(&self) -> &[String] {
        &self.addrs
    }

    async fn connect(&self, addr: &str) -> Result<Sender, String> {
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| "connect timeout".to_string())?
            .map_err(|e| format!("connect: {e}"))?;
        stream
            .set_nodelay(true)
            .map_err(|e| format!("nodelay: {e}"))?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    /// An idle pooled connection, or a new one (`true` when new).
    async fn sender(&self, target: usize) -> Result<(Sender, bool), String> {
        if self.keep_alive {
            loop {
                let pooled = self.pools[target].lock().ok().and_then(|mut p| p.pop());
                match pooled {
                    Some(s) if !s.is_closed() && s.is_ready() => return Ok((s, false)),
                    Some(_) => continue,
                    None => break,
                }
            }
        }
        Ok((self.connect(&self.addrs[target]).await?, true))
    }

    fn give_back(&self, target: usize, sender: Sender) {
        if self.keep_alive && !sender.is_closed() {
            if let Ok(mut p) = self.pools[target].lock() {
                p.push(sender);
            }
        }
    }

    /// POSTs a JSON body to `path` on target `target` and reads the whole response
    /// (or, with `cancel`, a streamed one up to its first token, then closes the
    /// connection), timing it. Never panics; failures are in [`Outcome::error`].
    pub async fn post(
        &self,
        target: usize,
        path: &str,
        headers: &[(String, String)],
        body: Bytes,
        stream: bool,
        cancel: bool,
    ) -> Outcome {
        let mut out = Outcome::default();
        if let Err(e) = self
            .post_inner(target, path, headers, body, stream, cancel, &mut out)
            .await
        {
            out.error = Some(e);
        }
        out
    }

    #[allow(clippy::too_many_arguments)]
    async fn post_inner(
        &self,
        target: usize,
        path: &str,
        headers: &[(String, String)],
        body: Bytes,
        stream: bool,
        cancel: bool,
        out: &mut Outcome,
    ) -> Result<(), String> {
        let (mut sender, new) = self.sender(target).await?;
        out.new_connection = new;
        let mut req = Request::post(path)
            .header("host", self.addrs[target].as_str())
            .header("content-type", "application/json");
        if !self.keep_alive {
            req = req.header("connection", "close");
        }
        for (k, v) in headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| format!("request: {e}"))?;
        sender.ready().await.map_err(|e| format!("ready: {e}"))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("send: {e}"))?;
        out.head_at = Some(Instant::now());
        out.status = Some(resp.status().as_u16());
        out.server = resp
            .headers()
            .get("x-sim-server")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let sse = stream
            && resp
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.contains("text/event-stream"));
        let mut body = resp.into_body();
        let mut scanner = Scanner::default();
        let mut whole = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("body: {e}"))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let now = Instant::now();
            out.body_bytes += data.len() as u64;
            if sse {
                let scan = scanner.feed(&data);
                if scan.tokens > 0 {
                    out.token_reads.push((now, scan.tokens));
                    if cancel {
                        // Dropping the body and the sender closes the connection.
                        out.cancelled = true;
                        out.end_at = Some(now);
                        out.streamed_tokens = scanner.tokens;
                        return Ok(());
                    }
                }
            } else {
                whole.extend_from_slice(&data);
            }
        }
        out.end_at = Some(Instant::now());
        if sse {
            out.usage = scanner.usage;
            out.streamed_tokens = scanner.tokens;
        } else if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&whole) {
            out.usage = Usage::from_json(&v);
        }
        self.give_back(target, sender);
        Ok(())
    }

    /// GETs `path` from `addr` (`host:port`) on a new connection.
    pub async fn get(&self, addr: &str, path: &str) -> Result<Fetched, String> {
        let addr = host_port(addr);
        let mut sender = self.connect(&addr).await?;
        let req = Request::get(path)
            .header("host", addr.as_str())
            .header("connection", "close")
            .body(Full::new(Bytes::new()))
            .map_err(|e| format!("request: {e}"))?;
        sender.ready().await.map_err(|e| format!("ready: {e}"))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("send: {e}"))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        Ok(Fetched { status, body })
    }
}
