//! Model servers in virtual time: the [`Upstream`] trait the world drives, and a simple
//! built-in server ([`SimpleUpstream`]) with a time-to-first-token, an inter-token
//! latency, a concurrency limit and a failing mode.
//!
//! The trait is event-driven so that any engine stepping in virtual time fits: the world
//! hands requests in ([`Upstream::start`]), asks when the server next has something to
//! say ([`Upstream::next_wake`]), and collects what is due ([`Upstream::poll`]).

use super::clock::{Nanos, MS};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

/// A request as it reaches the server.
#[derive(Debug, Clone)]
pub struct UpstreamRequest {
    /// `:method`.
    pub method: String,
    /// `:path`.
    pub path: String,
    /// All headers (lower-case names).
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl UpstreamRequest {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Something the server sends for request `id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Emit {
    /// Response head.
    Head {
        /// Request id.
        id: u64,
        /// HTTP status.
        status: u16,
        /// Headers (without `:status`).
        headers: Vec<(String, String)>,
    },
    /// A body chunk.
    Data {
        /// Request id.
        id: u64,
        /// The bytes.
        bytes: Vec<u8>,
    },
    /// End of the response.
    End {
        /// Request id.
        id: u64,
    },
}

/// A server condition set mid-run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Condition {
    /// Normal.
    Healthy,
    /// Every latency multiplied by this factor (for work scheduled from now on).
    Slowed(f64),
    /// Every new request answered with this status at once.
    Failing(u16),
}

/// A model server in virtual time.
pub trait Upstream {
    /// Request `id` reached the server at `now`.
    fn start(&mut self, now: Nanos, id: u64, req: &UpstreamRequest);
    /// Envoy reset request `id` (the client went away); emit nothing more for it.
    fn cancel(&mut self, now: Nanos, id: u64);
    /// The earliest virtual time at which [`Upstream::poll`] has something to emit.
    fn next_wake(&self) -> Option<Nanos>;
    /// Appends everything due at or before `now`, in order.
    fn poll(&mut self, now: Nanos, out: &mut Vec<Emit>);
    /// The Prometheus text of `GET /metrics` at `now`.
    fn metrics(&mut self, now: Nanos) -> String;
    /// Changes the server's condition (slowed, failing, healthy).
    fn set_condition(&mut self, _now: Nanos, _condition: Condition) {}
    /// The KV-cache events published since the last call (vLLM's `--kv-events-config`),
    /// for the world's relay ([`crate::world::kv_relay`]); `None` for a server that does
    /// not publish.
    fn take_kv_events(&mut self) -> Option<KvPublished> {
        None
    }
}

/// KV-cache events a server published ([`Upstream::take_kv_events`]).
#[derive(Debug, Clone, Default)]
pub struct KvPublished {
    /// The served model name (the relay's key root when an event names no LoRA).
    pub model: String,
    /// Tokens per block.
    pub block_size: usize,
    /// One batch per engine step that changed the cache, with the virtual time it left
    /// the server (the step's end), in order.
    pub batches: Vec<(Nanos, Vec<vllm_sim::engine::kv_cache::KvEvent>)>,
}

/// Settings of a [`SimpleUpstream`].
#[derive(Debug, Clone)]
pub struct SimpleConfig {
    /// Its `ip:port` (sent back as `x-sim-server`, as `vllm-sim` does).
    pub address: String,
    /// Model name for metrics.
    pub model: String,
    /// Time to first token.
    pub ttft: Nanos,
    /// Inter-token latency.
    pub itl: Nanos,
    /// Tokens when the request has no `max_tokens`.
    pub default_tokens: u32,
    /// Requests running at once; more wait in FIFO order.
    pub max_running: usize,
}

#[derive(Debug)]
struct Running {
    stream: bool,
    tokens: u32,
    sent: u32,
    head_sent: bool,
    done: bool,
    fail: Option<u16>,
}

/// A simple model server: after admission (at most `max_running` at once, FIFO), the
/// first token comes after `ttft`, then one token every `itl`. Streaming requests get
/// server-sent events, others one JSON body at the end.
pub struct SimpleUpstream {
    cfg: SimpleConfig,
    factor: f64,
    failing: Option<u16>,
    running: BTreeMap<u64, Running>,
    waiting: VecDeque<(u64, bool, u32)>,
    wakes: BinaryHeap<Reverse<(Nanos, u64, u64)>>,
    seq: u64,
    /// Requests completed.
    pub completed: u64,
}

impl SimpleUpstream {
    /// A server at `address` with 20 ms TTFT, 5 ms ITL, 16 tokens, 256 running.
    pub fn new(address: &str) -> SimpleUpstream {
        SimpleUpstream::with(SimpleConfig {
            address: address.to_string(),
            model: "sim-model".to_string(),
            ttft: 20 * MS,
            itl: 5 * MS,
            default_tokens: 16,
            max_running: 256,
        })
    }

    /// A server with these settings.
    pub fn with(cfg: SimpleConfig) -> SimpleUpstream {
        SimpleUpstream {
            cfg,
            factor: 1.0,
            failing: None,
            running: BTreeMap::new(),
            waiting: VecDeque::new(),
            wakes: BinaryHeap::new(),
            seq: 0,
            completed: 0,
        }
    }

    /// Sets the time to first token.
    pub fn ttft(mut self, t: Nanos) -> Self {
        self.cfg.ttft = t;
        self
    }

    /// Sets the inter-token latency.
    pub fn itl(mut self, t: Nanos) -> Self {
        self.cfg.itl = t;
        self
    }

    /// Sets the default token count.
    pub fn tokens(mut self, n: u32) -> Self {
        self.cfg.default_tokens = n;
        self
    }

    /// Sets the concurrency limit.
    pub fn max_running(mut self, n: usize) -> Self {
        self.cfg.max_running = n.max(1);
        self
    }

    /// Starts in the failing mode (every request answered with `status`).
    pub fn failing(mut self, status: u16) -> Self {
        self.failing = Some(status);
        self
    }

    fn scaled(&self, t: Nanos) -> Nanos {
        (t as f64 * self.factor) as Nanos
    }

    fn wake(&mut self, at: Nanos, id: u64) {
        self.seq += 1;
        self.wakes.push(Reverse((at, self.seq, id)));
    }

    fn admit(&mut self, now: Nanos) {
        while self.running.len() < self.cfg.max_running {
            let Some((id, stream, tokens)) = self.waiting.pop_front() else {
                break;
            };
            self.running.insert(
                id,
                Running {
                    stream,
                    tokens: tokens.max(1),
                    sent: 0,
                    head_sent: false,
                    done: false,
                    fail: None,
                },
            );
            let first = if stream {
                now
            } else {
                now + self.scaled(self.cfg.ttft)
            };
            self.wake(first, id);
        }
    }

    fn chunk(&self, id: u64, text: &str) -> Vec<u8> {
        format!(
            "data: {{\"id\":\"cmpl-{id}\",\"object\":\"text_completion\",\"model\":\"{}\",\"choices\":[{{\"index\":0,\"text\":\"{text}\",\"finish_reason\":null}}]}}\n\n",
            self.cfg.model
        )
        .into_bytes()
    }
}

fn parse(req: &UpstreamRequest, default_tokens: u32) -> (bool, u32) {
    let v: serde_json::Value = serde_json::from_slice(&req.body).unwrap_or_default();
    let stream = v
        .get("stream")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    let tokens = v
        .get("max_tokens")
        .or_else(|| v.get("max_completion_tokens"))
        .and_then(serde_json::Value::as_u64)
        .map_or(default_tokens, |n| n.min(1 << 20) as u32);
    (stream, tokens)
}

impl Upstream for SimpleUpstream {
    fn start(&mut self, now: Nanos, id: u64, req: &UpstreamRequest) {
        if let Some(status) = self.failing {
            self.running.insert(
                id,
                Running {
                    stream: false,
                    tokens: 0,
                    sent: 0,
                    head_sent: false,
                    done: false,
                    fail: Some(status),
                },
            );
            self.wake(now + MS, id);
            return;
        }
        let (stream, tokens) = parse(req, self.cfg.default_tokens);
        self.waiting.push_back((id, stream, tokens));
        self.admit(now);
    }

    fn cancel(&mut self, now: Nanos, id: u64) {
        self.waiting.retain(|(w, ..)| *w != id);
        if self.running.remove(&id).is_some() {
            self.admit(now);
        }
    }

    fn next_wake(&self) -> Option<Nanos> {
        self.wakes.peek().map(|Reverse((t, ..))| *t)
    }

    fn poll(&mut self, now: Nanos, out: &mut Vec<Emit>) {
        while let Some(Reverse((t, _, id))) = self.wakes.peek().copied() {
            if t > now {
                break;
            }
            self.wakes.pop();
            let Some(r) = self.running.get_mut(&id) else {
                continue;
            };
            let headers = |ct: &str, addr: &str| {
                vec![
                    ("content-type".to_string(), ct.to_string()),
                    ("x-sim-server".to_string(), addr.to_string()),
                ]
            };
            if let Some(status) = r.fail {
                out.push(Emit::Head {
                    id,
                    status,
                    headers: headers("application/json", &self.cfg.address),
                });
                out.push(Emit::Data {
                    id,
                    bytes: format!(
                        "{{\"error\":{{\"message\":\"simulated failure\",\"code\":{status}}}}}"
                    )
                    .into_bytes(),
                });
                out.push(Emit::End { id });
                r.done = true;
            } else if r.stream {
                if !r.head_sent {
                    r.head_sent = true;
                    out.push(Emit::Head {
                        id,
                        status: 200,
                        headers: headers("text/event-stream", &self.cfg.address),
                    });
                    let at = t + self.scaled(self.cfg.ttft);
                    self.wake(at, id);
                    continue;
                }
                r.sent += 1;
                let last = r.sent >= r.tokens;
                let bytes = self.chunk(id, "tok");
                let r = self.running.get_mut(&id).expect("running");
                out.push(Emit::Data { id, bytes });
                if last {
                    out.push(Emit::Data {
                        id,
                        bytes: b"data: [DONE]\n\n".to_vec(),
                    });
                    out.push(Emit::End { id });
                    r.done = true;
                } else {
                    let at = t + self.scaled(self.cfg.itl);
                    self.wake(at, id);
                    continue;
                }
            } else {
                // The first token is out at `t`; the rest follow every ITL, then one body.
                if r.sent == 0 && r.tokens > 1 {
                    r.sent = r.tokens;
                    let rest = u64::from(r.tokens - 1);
                    let at = t + self.scaled(self.cfg.itl) * rest;
                    self.wake(at, id);
                    continue;
                }
                out.push(Emit::Head {
                    id,
                    status: 200,
                    headers: headers("application/json", &self.cfg.address),
                });
                let text = "tok ".repeat(r.tokens as usize);
                out.push(Emit::Data {
                    id,
                    bytes: format!(
                        "{{\"id\":\"cmpl-{id}\",\"object\":\"text_completion\",\"model\":\"{}\",\"choices\":[{{\"index\":0,\"text\":\"{}\",\"finish_reason\":\"length\"}}],\"usage\":{{\"completion_tokens\":{}}}}}",
                        self.cfg.model,
                        text.trim_end(),
                        r.tokens
                    )
                    .into_bytes(),
                });
                out.push(Emit::End { id });
                r.done = true;
            }
            if self.running.get(&id).is_some_and(|r| r.done) {
                self.running.remove(&id);
                self.completed += 1;
                self.admit(t);
            }
        }
    }

    fn metrics(&mut self, _now: Nanos) -> String {
        let m = &self.cfg.model;
        format!(
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name=\"{m}\"}} {}\n\
             # TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{model_name=\"{m}\"}} {}\n\
             # TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{model_name=\"{m}\"}} {}\n",
            self.running.len(),
            self.waiting.len(),
            self.running.len() as f64 / self.cfg.max_running as f64
        )
    }

    fn set_condition(&mut self, _now: Nanos, condition: Condition) {
        match condition {
            Condition::Healthy => {
                self.factor = 1.0;
                self.failing = None;
            }
            Condition::Slowed(f) => self.factor = f.max(0.0),
            Condition::Failing(s) => self.failing = Some(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(body: &str) -> UpstreamRequest {
        UpstreamRequest {
            method: "POST".into(),
            path: "/v1/completions".into(),
            headers: vec![],
            body: body.as_bytes().to_vec(),
        }
    }

    fn drain(u: &mut SimpleUpstream) -> Vec<(Nanos, Emit)> {
        let mut all = Vec::new();
        while let Some(t) = u.next_wake() {
            let mut out = Vec::new();
            u.poll(t, &mut out);
            all.extend(out.into_iter().map(|e| (t, e)));
        }
        all
    }

    #[test]
    fn a_stream_gets_head_now_first_token_after_ttft_then_one_per_itl() {
        let mut u = SimpleUpstream::new("10.0.0.1:8000")
            .ttft(20 * MS)
            .itl(5 * MS);
        u.start(0, 1, &req(r#"{"stream":true,"max_tokens":3}"#));
        let ev = drain(&mut u);
        let times: Vec<Nanos> = ev
            .iter()
            .filter(|(_, e)| matches!(e, Emit::Data { .. }))
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(times, vec![20 * MS, 25 * MS, 30 * MS, 30 * MS]);
        assert!(matches!(ev[0], (0, Emit::Head { status: 200, .. })));
        assert!(matches!(ev.last(), Some((_, Emit::End { id: 1 }))));
    }

    #[test]
    fn beyond_the_concurrency_limit_requests_wait_their_turn() {
        let mut u = SimpleUpstream::new("a:1")
            .ttft(10 * MS)
            .itl(MS)
            .max_running(1);
        u.start(0, 1, &req(r#"{"max_tokens":1}"#));
        u.start(0, 2, &req(r#"{"max_tokens":1}"#));
        let ends: Vec<(Nanos, u64)> = drain(&mut u)
            .into_iter()
            .filter_map(|(t, e)| match e {
                Emit::End { id } => Some((t, id)),
                _ => None,
            })
            .collect();
        assert_eq!(ends, vec![(10 * MS, 1), (20 * MS, 2)]);
    }

    #[test]
    fn a_cancelled_request_emits_nothing_more() {
        let mut u = SimpleUpstream::new("a:1");
        u.start(0, 1, &req(r#"{"stream":true,"max_tokens":50}"#));
        let mut out = Vec::new();
        u.poll(0, &mut out);
        u.cancel(MS, 1);
        assert!(drain(&mut u).is_empty());
    }
}
