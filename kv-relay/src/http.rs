//! The HTTP side: `GET /v1/kv/state[?epoch=E&since=V]` (the state, as deltas after
//! version `V` of run `E` when the log still holds them, else a snapshot),
//! `GET /metrics` (per-server counters, Prometheus text) and `GET /health`.

use crate::state::Relay;
use crate::subscriber::lock;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::fmt::Write;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;

/// Serves `relay` on `listener` forever.
pub async fn serve(listener: TcpListener, relay: Arc<Mutex<Relay>>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let relay = relay.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let relay = relay.clone();
                async move { Ok::<_, Infallible>(handle(&relay, &req)) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn respond(status: u16, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or_default();
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn handle(relay: &Mutex<Relay>, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/v1/kv/state") => match crate::state::client_version(req.uri().query()) {
            Ok(v) => respond(200, "application/json", lock(relay).view(v).to_string()),
            Err(e) => respond(
                400,
                "application/json",
                serde_json::json!({"error": {"message": e, "type": "invalid_request_error"}})
                    .to_string(),
            ),
        },
        (&Method::GET, "/metrics") => {
            respond(200, "text/plain; version=0.0.4", metrics(&lock(relay)))
        }
        (&Method::GET, "/health") => respond(200, "text/plain", String::new()),
        _ => respond(404, "text/plain", "not found\n".into()),
    }
}

/// A counter: name, help, and how to read it.
type Counter = (&'static str, &'static str, fn(&crate::state::Stats) -> u64);

fn metrics(r: &Relay) -> String {
    let mut out = String::new();
    let series: [Counter; 7] = [
        ("kv_relay_batches_total", "event batches applied", |s| {
            s.batches
        }),
        ("kv_relay_gaps_total", "sequence gaps seen", |s| s.gaps),
        (
            "kv_relay_replays_total",
            "replays completed (joins, gaps, probes)",
            |s| s.replays,
        ),
        ("kv_relay_resets_total", "publisher restarts seen", |s| {
            s.resets
        }),
        (
            "kv_relay_unkeyed_blocks_total",
            "stored blocks whose parent was unknown",
            |s| s.unkeyed,
        ),
        (
            "kv_relay_forgotten_blocks_total",
            "blocks dropped over the per-server bound",
            |s| s.forgotten,
        ),
        (
            "kv_relay_decode_errors_total",
            "messages that could not be decoded",
            |s| s.decode_errors,
        ),
    ];
    for (name, help, get) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for sv in &r.servers {
            let _ = writeln!(
                out,
                "{name}{{endpoint=\"{}\"}} {}",
                sv.endpoint,
                get(&sv.stats)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP kv_relay_blocks blocks held\n# TYPE kv_relay_blocks gauge"
    );
    for (i, sv) in r.servers.iter().enumerate() {
        let _ = writeln!(
            out,
            "kv_relay_blocks{{endpoint=\"{}\"}} {}",
            sv.endpoint,
            r.held(i)
        );
    }
    let _ = writeln!(
        out,
        "# HELP kv_relay_stale 1 when the server's stream stopped\n# TYPE kv_relay_stale gauge"
    );
    for sv in &r.servers {
        let _ = writeln!(
            out,
            "kv_relay_stale{{endpoint=\"{}\"}} {}",
            sv.endpoint,
            u8::from(sv.stale)
        );
    }
    out
}
