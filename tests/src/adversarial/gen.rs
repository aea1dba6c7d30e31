//! The hostile requests: a seeded generator of one request per draw, in classes.
//!
//! Every draw is a function of the seed and the draw's index only, so a batch is replayed
//! exactly from `(seed, batch)`. Client-chosen text that could be forged into a stat name
//! carries [`Gen::marker`], which the stat checks look for.

use super::PATHS;
use vllm_sim::rng::Rng;

/// The classes of hostile request, each a way a client can push on the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// A model name (and other routed strings) from 1 KiB up to the body limit, new each time.
    Sizes,
    /// Control characters, NUL, invalid surrogates, non-UTF-8 bytes and stat-line forgeries
    /// in every string the gateway reads from the body.
    Encodings,
    /// Duplicate, escaped and mistyped JSON keys; deep nesting; huge numbers; not JSON at all.
    JsonKeys,
    /// Every header the gateway reads, with hostile values (sizes, numbers, addresses).
    Headers,
    /// Every method on every routed path, and paths encoded or malformed.
    MethodsPaths,
    /// Bodies sent in pieces with pauses, some never finished.
    SlowBodies,
    /// Requests and streamed responses the client abandons part way.
    Aborts,
    /// `transfer-encoding: chunked` bodies with odd chunk sizes.
    Chunked,
    /// Hostile bodies and headers over HTTP/2 (prior knowledge), streams reset mid-response.
    Http2,
}

impl Class {
    /// Every class, in the order the batches rotate through them.
    pub const ALL: [Class; 9] = [
        Class::Sizes,
        Class::Encodings,
        Class::JsonKeys,
        Class::Headers,
        Class::MethodsPaths,
        Class::SlowBodies,
        Class::Aborts,
        Class::Chunked,
        Class::Http2,
    ];

    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Class::Sizes => "sizes",
            Class::Encodings => "encodings",
            Class::JsonKeys => "json-keys",
            Class::Headers => "headers",
            Class::MethodsPaths => "methods-paths",
            Class::SlowBodies => "slow-bodies",
            Class::Aborts => "aborts",
            Class::Chunked => "chunked",
            Class::Http2 => "http2",
        }
    }
}

/// How the request's bytes are delivered (HTTP/1.1 on its own connection, or HTTP/2).
#[derive(Clone, Debug, PartialEq)]
pub enum Delivery {
    /// All at once; the response read in full (up to a cap).
    Whole,
    /// The head, then the body in `pieces` parts `gap_ms` apart; `finish: false` stops
    /// after about half of them and closes the connection.
    Slow {
        pieces: usize,
        gap_ms: u64,
        finish: bool,
    },
    /// Only the first `bytes` of the request, then the connection is closed.
    CutRequest { bytes: usize },
    /// All of it; the connection closed after `bytes` of the response arrived.
    CutResponse { bytes: usize },
    /// HTTP/2 prior knowledge; `reset_after_head` drops the stream once the head arrives.
    H2 { reset_after_head: bool },
}

/// One hostile request.
#[derive(Clone, Debug)]
pub struct Hostile {
    pub class: Class,
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    /// Send the body chunked (HTTP/1.1) instead of with a content-length.
    pub chunked: Option<Vec<usize>>,
    pub delivery: Delivery,
}

impl Hostile {
    /// The request as HTTP/1.1 bytes (`connection: close`, so the response ends at EOF).
    pub fn http1(&self, host: &str) -> Vec<u8> {
        let mut out =
            format!("{} {} HTTP/1.1\r\nhost: {host}\r\n", self.method, self.path).into_bytes();
        for (k, v) in &self.headers {
            out.extend_from_slice(k.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"connection: close\r\n");
        match &self.chunked {
            Some(sizes) => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
                let mut rest = &self.body[..];
                for &n in sizes {
                    let n = n.min(rest.len());
                    if n == 0 {
                        break;
                    }
                    out.extend_from_slice(format!("{n:x}\r\n").as_bytes());
                    out.extend_from_slice(&rest[..n]);
                    out.extend_from_slice(b"\r\n");
                    rest = &rest[n..];
                }
                if !rest.is_empty() {
                    out.extend_from_slice(format!("{:x}\r\n", rest.len()).as_bytes());
                    out.extend_from_slice(rest);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\n\r\n");
            }
            None => {
                if !self.body.is_empty() || self.method == "POST" {
                    out.extend_from_slice(
                        format!("content-length: {}\r\n", self.body.len()).as_bytes(),
                    );
                }
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(&self.body);
            }
        }
        out
    }

    /// Length of the request head in [`Hostile::http1`]'s bytes.
    pub fn http1_head_len(&self, host: &str) -> usize {
        let bytes = self.http1(host);
        bytes
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(bytes.len(), |i| i + 4)
    }
}

/// The seeded generator.
pub struct Gen {
    rng: Rng,
    /// Text every forgery attempt carries (`zq` + 6 hex digits of the seed).
    pub marker: String,
    /// The body limit the gateway is configured with (bytes).
    pub body_limit: usize,
    /// The model the servers serve.
    pub model: String,
    /// Addresses the subset hint and destination spoofs name (the servers, the admin API).
    pub addresses: Vec<String>,
}

const JSON_PATHS: [&str; 3] = ["/v1/completions", "/v1/chat/completions", "/v1/responses"];

impl Gen {
    pub fn new(seed: u64, body_limit: usize, model: &str, addresses: Vec<String>) -> Gen {
        Gen {
            rng: Rng::new(seed ^ 0xad5e_5a11),
            marker: format!("zq{:06x}", seed & 0xff_ffff),
            body_limit,
            model: model.to_string(),
            addresses,
        }
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.rng.below(xs.len() as u64) as usize]
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.next_f64() < p
    }

    /// A size from `lo` to `hi`, uniform in its logarithm.
    fn log_size(&mut self, lo: usize, hi: usize) -> usize {
        let (lo, hi) = (lo.max(1) as f64, hi.max(lo + 1) as f64);
        (lo * (hi / lo).powf(self.rng.next_f64())) as usize
    }

    /// Printable text of `n` bytes, new each call (the marker, then random letters).
    fn text(&mut self, n: usize) -> String {
        let mut s = self.marker.clone();
        while s.len() < n {
            let c = b"abcdefghijklmnopqrstuvwxyz0123456789-_./:"[self.rng.below(41) as usize];
            s.push(c as char);
        }
        s.truncate(n.max(self.marker.len()));
        s
    }

    /// A JSON string literal (with quotes) of hostile content: escapes a parser must decode.
    fn hostile_json_string(&mut self) -> String {
        let m = self.marker.clone();
        let forged = [
            format!("{m}\\nwasm.epp.vm_reload: 999\\n"),
            format!("{m}\\n# TYPE forged_{m} counter\\nforged_{m} 1\\n"),
            format!("{m};.;model_name=.=forged_{m};.;"),
            format!("{m}\\u0000after-nul"),
            format!("{m}\\r\\n\\t\\u001b[31m\\u007f"),
            format!("{m}\\ud800lone-surrogate"),
            format!("{m}\\udfff\\ud800"),
            format!("{m}\\\"quoted\\\" and \\\\backslash"),
            format!("{m}\\\",\\\"choices\\\":[],\\\"injected\\\":\\\""),
            format!("{m}{}", "\\u00e9\\u4e2d\\ud83d\\ude00".repeat(4)),
            format!("{m} {{{{PLUGIN_CONFIG}}}} %s %n ${{jndi:x}}"),
            format!("{m}{}", "\\n".repeat(1000)),
        ];
        format!("\"{}\"", self.pick(&forged))
    }

    fn json_path(&mut self) -> String {
        self.pick(&JSON_PATHS).to_string()
    }

    /// A well-formed body for `path` with `model` as its model (a JSON literal).
    fn body_for(&self, path: &str, model_literal: &str, extra: &str) -> String {
        let sep = if extra.is_empty() { "" } else { "," };
        match path {
            "/v1/chat/completions" => format!(
                r#"{{"model":{model_literal},"messages":[{{"role":"user","content":"hi"}}],"max_tokens":2{sep}{extra}}}"#
            ),
            "/v1/responses" => format!(
                r#"{{"model":{model_literal},"input":"hi","max_output_tokens":2{sep}{extra}}}"#
            ),
            _ => format!(r#"{{"model":{model_literal},"prompt":"hi","max_tokens":2{sep}{extra}}}"#),
        }
    }

    fn json_post(&mut self, class: Class, path: String, body: Vec<u8>) -> Hostile {
        Hostile {
            class,
            method: "POST".into(),
            path,
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            body,
            chunked: None,
            delivery: Delivery::Whole,
        }
    }

    /// One hostile request of `class`.
    pub fn next(&mut self, class: Class) -> Hostile {
        match class {
            Class::Sizes => self.sizes(),
            Class::Encodings => self.encodings(),
            Class::JsonKeys => self.json_keys(),
            Class::Headers => self.headers(),
            Class::MethodsPaths => self.methods_paths(),
            Class::SlowBodies => self.slow_bodies(),
            Class::Aborts => self.aborts(),
            Class::Chunked => self.chunked(),
            Class::Http2 => self.http2(),
        }
    }

    fn sizes(&mut self) -> Hostile {
        let path = self.json_path();
        // Up to the body limit, less room for the rest of the body.
        let n = self.log_size(1024, self.body_limit.saturating_sub(512));
        let name = self.text(n);
        let body = match self.rng.below(4) {
            // The model name itself.
            0 | 1 => self.body_for(&path, &format!("\"{name}\""), ""),
            // A LoRA-style name, a model with a suffix, a long field the gateway reads.
            2 => {
                let salt = self.text(n.min(65536));
                self.body_for(
                    &path,
                    &format!("\"{}:{name}\"", self.model),
                    &format!(r#""cache_salt":"{salt}""#),
                )
            }
            // A huge prompt for a real model (prefix hashing over it).
            _ => {
                let prompt = self.text(n);
                format!(
                    r#"{{"model":"{}","prompt":"{prompt}","max_tokens":1}}"#,
                    self.model
                )
            }
        };
        self.json_post(Class::Sizes, path, body.into_bytes())
    }

    fn encodings(&mut self) -> Hostile {
        let path = self.json_path();
        let s = self.hostile_json_string();
        let body = match self.rng.below(4) {
            0 | 1 => self.body_for(&path, &s, ""),
            2 => self.body_for(
                &path,
                &format!("\"{}\"", self.model),
                &format!(r#""cache_salt":{s},"user":{s}"#),
            ),
            _ => {
                // Raw bytes a JSON parser must refuse: NUL, a bare newline, invalid UTF-8.
                let mut b = format!(r#"{{"model":"{}"#, self.marker).into_bytes();
                let bad: [&[u8]; 4] = [b"\x00\n", b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80"];
                let pick = self.pick(&bad).to_vec();
                b.extend_from_slice(&pick);
                b.extend_from_slice(br#"","prompt":"hi","max_tokens":2}"#);
                return self.json_post(Class::Encodings, path, b);
            }
        };
        self.json_post(Class::Encodings, path, body.into_bytes())
    }

    fn json_keys(&mut self) -> Hostile {
        let path = self.json_path();
        let m = self.model.clone();
        let mk = self.marker.clone();
        let depth = self.log_size(64, 100_000);
        let body: Vec<u8> = match self.rng.below(14) {
            0 => format!(r#"{{"model":"{mk}-first","prompt":"hi","model":"{m}","max_tokens":2}}"#)
                .into(),
            1 => format!(r#"{{"model":"{m}","prompt":"hi","model":"{mk}-second","max_tokens":2}}"#)
                .into(),
            2 => format!(r#"{{"mod\u0065l":"{mk}-escaped","model":"{m}","prompt":"hi"}}"#).into(),
            3 => format!(r#"{{"model\u0000":"{mk}","model":"{m}","prompt":"hi"}}"#).into(),
            4 => format!(r#"{{"model":["{m}"],"prompt":"hi"}}"#).into(),
            5 => format!(r#"{{"model":{{"name":"{m}"}},"prompt":"hi"}}"#).into(),
            6 => r#"{"model":null,"prompt":"hi","stream":"true","max_tokens":-1}"#.into(),
            7 => format!(
                r#"{{"model":"{m}","prompt":"hi","max_tokens":{}}}"#,
                self.pick(&[
                    "1e999",
                    "18446744073709551616",
                    "-0",
                    "1.5",
                    "\"2\"",
                    "NaN",
                    "0x10"
                ])
            )
            .into(),
            8 => format!(
                r#"{{"model":"{m}","prompt":"hi","stream":true,"stream":false,"max_tokens":2}}"#
            )
            .into(),
            9 => {
                let mut b = format!(r#"{{"model":"{m}","prompt":"#).into_bytes();
                b.extend(std::iter::repeat_n(b'[', depth));
                b.extend(std::iter::repeat_n(b']', depth));
                b.push(b'}');
                b
            }
            10 => {
                let not_json: [&[u8]; 7] = [
                    b"",
                    b"null",
                    b"[]",
                    b"\"model\"",
                    b"{",
                    b"\xef\xbb\xbf{}",
                    b"{}{}",
                ];
                self.pick(&not_json).to_vec()
            }
            11 => format!(r#"{{"model":"{m}","prompt":"hi","max_tokens":2}} trailing"#).into(),
            12 => {
                // Many keys: the scanner's top-level walk over an attacker-chosen key count.
                let n = self.log_size(100, 200_000);
                let mut s = format!(r#"{{"model":"{m}","prompt":"hi""#);
                for i in 0..n {
                    s.push_str(&format!(r#","k{i}":{i}"#));
                }
                s.push('}');
                s.into()
            }
            _ => {
                // A prompt as token ids, long.
                let n = self.log_size(10, 100_000);
                let ids: Vec<String> = (0..n).map(|i| (i % 50_000).to_string()).collect();
                format!(
                    r#"{{"model":"{m}","prompt":[{}],"max_tokens":1}}"#,
                    ids.join(",")
                )
                .into()
            }
        };
        self.json_post(Class::JsonKeys, path, body)
    }

    fn headers(&mut self) -> Hostile {
        let path = self.json_path();
        let mk = self.marker.clone();
        let body = self.body_for(&path, &format!("\"{}\"", self.model), "");
        let mut h = self.json_post(Class::Headers, path, body.into_bytes());
        let n = self.log_size(64, 16 * 1024);
        let long = self.text(n);
        let addr = self.pick(&self.addresses.clone()).clone();
        let many: Vec<String> = (0..self.log_size(2, 2000))
            .map(|i| {
                format!(
                    "10.{}.{}.{}:{}",
                    i / 65536 % 256,
                    i / 256 % 256,
                    i % 256,
                    8000 + i % 7
                )
            })
            .collect();
        let number = self
            .pick(&[
                "NaN",
                "-1",
                "1e400",
                "",
                "0x10",
                "18446744073709551617",
                "inf",
                "1.5e-300",
                "  7 ",
            ])
            .to_string();
        let (name, value): (&str, Vec<u8>) = match self.rng.below(16) {
            0 => ("x-gateway-inference-fairness-id", long.into_bytes()),
            1 => (
                "x-llm-d-inference-fairness-id",
                [mk.as_bytes(), b"\x01\x7f\xff"].concat(),
            ),
            2 => ("x-gateway-inference-objective", long.into_bytes()),
            3 => (
                "x-llm-d-inference-objective",
                format!("{mk};.;priority=.=999;.;").into_bytes(),
            ),
            4 => (
                *self.pick(&[
                    "x-slo-ttft-ms",
                    "x-llm-d-slo-ttft-ms",
                    "x-slo-tpot-ms",
                    "x-llm-d-slo-tpot-ms",
                ]),
                number.into_bytes(),
            ),
            5 => (
                *self.pick(&[
                    "x-prediction-based-scheduling",
                    "x-prediction-based-scheduling-off",
                ]),
                self.pick(&["true", "false", "1", ""]).as_bytes().to_vec(),
            ),
            6 => (
                "x-gateway-destination-endpoint-subset",
                many.join(",").into_bytes(),
            ),
            7 => (
                "x-gateway-destination-endpoint-subset",
                format!("{addr},[::1]:x,{mk}:99999,,").into_bytes(),
            ),
            8 => (
                *self.pick(&["x-gateway-model-name-rewrite", "x-llm-d-model-name-rewrite"]),
                format!("{mk}\",\"x\":\"{long}").into_bytes(),
            ),
            9 => ("x-session-token", long.into_bytes()),
            10 => ("x-request-id", long.into_bytes()),
            11 => (
                *self.pick(&[
                    "x-gateway-destination-endpoint",
                    "x-gateway-destination-endpoint-primary",
                    "x-prefiller-host-port",
                    "x-gateway-destination-endpoint-served",
                ]),
                addr.into_bytes(),
            ),
            12 => ("x-envoy-original-dst-host", addr.into_bytes()),
            13 => (
                "content-type",
                self.pick(&[
                    "text/plain",
                    "application/json; charset=latin1",
                    "multipart/form-data; boundary=x",
                    "",
                ])
                .as_bytes()
                .to_vec(),
            ),
            14 => {
                // The same header many times.
                for i in 0..self.rng.range(2, 40) {
                    h.headers.push((
                        "x-gateway-inference-fairness-id".into(),
                        format!("{mk}-{i}").into_bytes(),
                    ));
                }
                ("x-gateway-inference-objective", b"premium".to_vec())
            }
            _ => ("x-envoy-original-path", format!("/admin/{mk}").into_bytes()),
        };
        h.headers.push((name.into(), value));
        h
    }

    fn methods_paths(&mut self) -> Hostile {
        let mk = self.marker.clone();
        let base = self.pick(PATHS).to_string();
        let path = match self.rng.below(9) {
            0..=2 => base,
            3 => format!("{base}?model={mk}&stream=true"),
            4 => format!("{base}/"),
            5 => base.replace("/v1/", "/v1%2F"),
            6 => format!("/{mk}/..{base}"),
            7 => format!("//{}", base.trim_start_matches('/')),
            _ => {
                let n = self.log_size(16, 8000);
                format!("/v1/{}", self.text(n))
            }
        };
        let method = self
            .pick(&[
                "GET", "HEAD", "OPTIONS", "DELETE", "PUT", "PATCH", "POST", "CONNECT", "TRACE",
            ])
            .to_string();
        let mut h = Hostile {
            class: Class::MethodsPaths,
            method: method.clone(),
            path,
            headers: vec![],
            body: vec![],
            chunked: None,
            delivery: Delivery::Whole,
        };
        if method == "CONNECT" {
            h.path = self.pick(&self.addresses.clone()).clone();
        } else if method != "GET" && method != "HEAD" && self.chance(0.5) {
            h.headers
                .push(("content-type".into(), b"application/json".to_vec()));
            h.body = self
                .body_for(JSON_PATHS[0], &format!("\"{}\"", self.model), "")
                .into_bytes();
        }
        h
    }

    fn slow_bodies(&mut self) -> Hostile {
        let path = self.json_path();
        let body = self.body_for(&path, &format!("\"{}\"", self.model), r#""stream":true"#);
        let mut h = self.json_post(Class::SlowBodies, path, body.into_bytes());
        h.delivery = Delivery::Slow {
            pieces: self.rng.range(2, 12) as usize,
            gap_ms: self.rng.range(20, 250),
            finish: self.chance(0.6),
        };
        h
    }

    fn aborts(&mut self) -> Hostile {
        let path = self.json_path();
        let body = self.body_for(
            &path,
            &format!("\"{}\"", self.model),
            r#""stream":true,"max_tokens":200"#,
        );
        // The body's own max_tokens comes first in the object; the second one wins in most
        // parsers, which is what the gateway must cope with too.
        let mut h = self.json_post(Class::Aborts, path, body.into_bytes());
        let len = h.body.len();
        h.delivery = if self.chance(0.5) {
            Delivery::CutRequest {
                bytes: self.rng.range(1, 200 + len as u64) as usize,
            }
        } else {
            Delivery::CutResponse {
                bytes: self.rng.range(1, 2000) as usize,
            }
        };
        h
    }

    fn chunked(&mut self) -> Hostile {
        let path = self.json_path();
        let extra = if self.chance(0.5) {
            r#""stream":true"#
        } else {
            ""
        };
        let body = self.body_for(&path, &format!("\"{}\"", self.model), extra);
        let mut h = self.json_post(Class::Chunked, path, body.into_bytes());
        let sizes: Vec<usize> = (0..self.rng.range(1, 40))
            .map(|_| self.rng.range(1, 64) as usize)
            .collect();
        h.chunked = Some(sizes);
        h
    }

    fn http2(&mut self) -> Hostile {
        let inner = *self.pick(&[
            Class::Sizes,
            Class::Encodings,
            Class::JsonKeys,
            Class::Headers,
            Class::MethodsPaths,
        ]);
        let mut h = self.next(inner);
        // HTTP/2 has no CONNECT to a path-less authority in this client, nor a body on TRACE.
        if h.method == "CONNECT" || h.method == "TRACE" {
            h.method = "GET".into();
        }
        // HTTP/2 forbids connection-specific headers; values with bytes HTTP/2 refuses are
        // dropped by the client before sending (not a test of the gateway).
        h.headers
            .retain(|(_, v)| !v.iter().any(|&b| b == 0 || b == b'\r' || b == b'\n'));
        h.class = Class::Http2;
        h.delivery = Delivery::H2 {
            reset_after_head: self.chance(0.3),
        };
        h
    }
}
