//! Sending a hostile request as its [`Delivery`] says, and what came back.

use super::gen::{Delivery, Hostile};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The most of a response body read before the connection is closed.
const READ_CAP: usize = 256 * 1024;

/// What one hostile request got.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The response status, if a response head arrived.
    pub status: Option<u16>,
    /// From the last request byte sent to the response head (or to the close, or the
    /// give-up); `None` when the client itself cut the request short.
    pub answer: Option<Duration>,
    /// The connection failed before a response (refused, reset, closed without a head).
    pub closed: bool,
}

/// Sends `h` to `addr` (HTTP/1.1, its own connection), waiting at most `limit` for the head.
pub fn http1(addr: &str, h: &Hostile, limit: Duration) -> Outcome {
    let bytes = h.http1(addr);
    let fail = |answer| Outcome {
        status: None,
        answer,
        closed: true,
    };
    let Ok(mut s) = TcpStream::connect(addr) else {
        return fail(Some(Duration::ZERO));
    };
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let _ = s.set_write_timeout(Some(limit));
    let sent = match &h.delivery {
        Delivery::Slow {
            pieces,
            gap_ms,
            finish,
        } => {
            let head = h.http1_head_len(addr);
            if s.write_all(&bytes[..head]).is_err() {
                return fail(None);
            }
            let body = &bytes[head..];
            let pieces = (*pieces).max(1);
            let step = body.len().div_ceil(pieces).max(1);
            let stop = if *finish { body.len() } else { body.len() / 2 };
            let mut at = 0;
            while at < stop {
                std::thread::sleep(Duration::from_millis(*gap_ms));
                let end = (at + step).min(stop);
                if s.write_all(&body[at..end]).is_err() {
                    return fail(None);
                }
                at = end;
            }
            *finish
        }
        Delivery::CutRequest { bytes: n } => {
            let _ = s.write_all(&bytes[..(*n).min(bytes.len())]);
            *n >= bytes.len()
        }
        _ => {
            // A peer that refuses part way (a 413 before the end) is an answer, read below.
            let _ = s.write_all(&bytes);
            true
        }
    };
    if !sent {
        // Abandoned by the client: close now (the gateway must let it go).
        let _ = s.shutdown(std::net::Shutdown::Both);
        return Outcome {
            status: None,
            answer: None,
            closed: false,
        };
    }
    let start = Instant::now();
    let cut = match h.delivery {
        Delivery::CutResponse { bytes } => bytes,
        _ => READ_CAP,
    };
    let mut buf = Vec::new();
    let mut tmp = [0u8; 16384];
    let mut status = None;
    let mut answer = None;
    while start.elapsed() < limit + Duration::from_secs(2) {
        match s.read(&mut tmp) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&tmp[..n]);
                if status.is_none() {
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        answer = Some(start.elapsed());
                        status = std::str::from_utf8(&buf[..end])
                            .ok()
                            .and_then(|head| head.split(' ').nth(1))
                            .and_then(|c| c.parse().ok());
                    }
                }
                if buf.len() >= cut {
                    break;
                }
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                if status.is_some() && start.elapsed() > limit {
                    break; // a long body: the head is what counts
                }
            }
            Err(_) => break,
        }
    }
    let closed = status.is_none();
    Outcome {
        status,
        answer: answer.or_else(|| closed.then(|| start.elapsed())),
        closed,
    }
}

/// Sends `batch` over one HTTP/2 connection (prior knowledge), all streams at once.
pub fn http2(addr: &str, batch: &[&Hostile], limit: Duration) -> Vec<Outcome> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(http2_async(addr, batch, limit))
}

async fn http2_async(addr: &str, batch: &[&Hostile], limit: Duration) -> Vec<Outcome> {
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let closed = || Outcome {
        status: None,
        answer: Some(Duration::ZERO),
        closed: true,
    };
    let Ok(stream) = tokio::net::TcpStream::connect(addr).await else {
        return batch.iter().map(|_| closed()).collect();
    };
    let Ok((sender, conn)) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await
    else {
        return batch.iter().map(|_| closed()).collect();
    };
    tokio::spawn(conn);
    let mut tasks = Vec::new();
    for h in batch {
        let mut sender = sender.clone();
        let mut req = hyper::Request::builder()
            .method(h.method.as_str())
            .uri(format!("http://{addr}{}", h.path));
        for (k, v) in &h.headers {
            req = req.header(k.as_str(), v.as_slice());
        }
        let reset = matches!(
            h.delivery,
            Delivery::H2 {
                reset_after_head: true
            }
        );
        let req = req.body(Full::new(bytes::Bytes::from(h.body.clone())));
        tasks.push(tokio::spawn(async move {
            let Ok(req) = req else {
                // Not expressible in HTTP/2 (the client refuses it): nothing was sent.
                return Outcome {
                    status: None,
                    answer: None,
                    closed: false,
                };
            };
            let start = Instant::now();
            let resp = tokio::time::timeout(limit, sender.send_request(req)).await;
            match resp {
                Ok(Ok(resp)) => {
                    let answer = Some(start.elapsed());
                    let status = Some(resp.status().as_u16());
                    if !reset {
                        // Read the body up to the cap, within the limit; dropping it resets.
                        let mut body = resp.into_body();
                        let mut got = 0;
                        let _ = tokio::time::timeout(limit, async {
                            while let Some(Ok(frame)) = body.frame().await {
                                got += frame.data_ref().map_or(0, |d| d.len());
                                if got >= READ_CAP {
                                    break;
                                }
                            }
                        })
                        .await;
                    }
                    Outcome {
                        status,
                        answer,
                        closed: false,
                    }
                }
                Ok(Err(_)) => Outcome {
                    status: None,
                    answer: Some(start.elapsed()),
                    closed: true,
                },
                Err(_) => Outcome {
                    status: None,
                    answer: Some(start.elapsed()),
                    closed: true,
                },
            }
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap_or(Outcome {
            status: None,
            answer: None,
            closed: true,
        }));
    }
    out
}
