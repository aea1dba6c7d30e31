//! A minimal HTTP/1.1 client over hyper for the server tests.
#![allow(dead_code)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use vllm_sim::server::{self, Server, ServerConfig};

/// Starts a server on 127.0.0.1, ephemeral port(s).
pub async fn start(mut config: ServerConfig) -> Server {
    config.port = 0;
    server::start(config).await.expect("server starts")
}

/// A zero-latency config.
pub fn zero_config() -> ServerConfig {
    let mut c = ServerConfig::default();
    c.engine.latency = vllm_sim::engine::latency::LatencyProfile::zero();
    c
}

pub struct Client {
    sender: SendRequest<Full<Bytes>>,
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> Client {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        Client { sender }
    }

    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> Response<Incoming> {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost");
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            req = req.header("content-type", "application/json");
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("request");
        self.sender.ready().await.expect("ready");
        tokio::time::timeout(Duration::from_secs(20), self.sender.send_request(req))
            .await
            .expect("response in time")
            .expect("response")
    }

    /// Sends and reads the whole body as text.
    pub async fn call(
        &mut self,
        method: &str,
        path: &str,
        body: &str,
    ) -> (u16, String, hyper::HeaderMap) {
        self.call_with(method, path, body, &[]).await
    }

    pub async fn call_with(
        &mut self,
        method: &str,
        path: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> (u16, String, hyper::HeaderMap) {
        let resp = self.send(method, path, body, headers).await;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = tokio::time::timeout(Duration::from_secs(20), resp.into_body().collect())
            .await
            .expect("body in time")
            .expect("body")
            .to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned(), headers)
    }

    pub async fn post_json(
        &mut self,
        path: &str,
        body: serde_json::Value,
    ) -> (u16, serde_json::Value) {
        let (status, text, _) = self.call("POST", path, &body.to_string()).await;
        let v = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        (status, v)
    }
}

/// SSE `data:` payloads of a streamed response with the time each arrived.
pub async fn read_sse(resp: Response<Incoming>) -> Vec<(Instant, String)> {
    let mut body = resp.into_body();
    let mut buf = String::new();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let frame = tokio::time::timeout(Duration::from_secs(20), body.frame())
            .await
            .expect("frame in time");
        let Some(frame) = frame else { break };
        let frame = frame.expect("frame");
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let now = Instant::now();
        buf.push_str(&String::from_utf8_lossy(&data));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            if let Some(payload) = event.trim_end().strip_prefix("data: ") {
                out.push((now, payload.to_string()));
            }
        }
    }
    out
}

/// Value of a Prometheus sample `name{labels}` (exact series text before the value).
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .and_then(|v| v.trim().parse().ok())
}
