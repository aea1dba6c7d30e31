//! Workload generators: what the simulated clients send, and when.

use super::clock::{Nanos, Rng, SEC};
use serde_json::json;

/// Fairness header (GIE).
pub const FAIRNESS_HEADER: &str = "x-gateway-inference-fairness-id";
/// Objective header (GIE): maps to a priority.
pub const OBJECTIVE_HEADER: &str = "x-gateway-inference-objective";
/// SLO header: target time to first token, ms.
pub const SLO_TTFT_HEADER: &str = "x-slo-ttft-ms";
/// SLO header: target time per output token, ms.
pub const SLO_TPOT_HEADER: &str = "x-slo-tpot-ms";

/// One request a client sends.
#[derive(Debug, Clone)]
pub struct RequestSpec {
    /// When the client sends it.
    pub at: Nanos,
    /// `:method`.
    pub method: String,
    /// `:path`.
    pub path: String,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
    /// The client closes the connection this long after sending, if not answered by then.
    pub disconnect_after: Option<Nanos>,
    /// Requests with the same connection id share a connection (and so a worker).
    pub connection: Option<u64>,
    /// The gateway replica the client connects to directly (a pod address rather than
    /// the Service's); `None`: the Service picks one per connection.
    pub replica: Option<usize>,
    /// A label for the test's own bookkeeping (tenant, class, ...).
    pub label: String,
}

impl RequestSpec {
    /// `POST path` with a body, at time 0.
    pub fn post(path: &str, body: impl Into<Vec<u8>>) -> RequestSpec {
        RequestSpec {
            at: 0,
            method: "POST".into(),
            path: path.into(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.into(),
            disconnect_after: None,
            connection: None,
            replica: None,
            label: String::new(),
        }
    }

    /// `GET path`, at time 0.
    pub fn get(path: &str) -> RequestSpec {
        RequestSpec {
            method: "GET".into(),
            headers: vec![],
            body: vec![],
            ..RequestSpec::post(path, Vec::new())
        }
    }

    /// An OpenAI completion for `model`.
    pub fn completion(model: &str, prompt: &str, max_tokens: u32, stream: bool) -> RequestSpec {
        let body =
            json!({"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream});
        RequestSpec::post("/v1/completions", body.to_string())
    }

    /// Sent at `t`.
    pub fn at(mut self, t: Nanos) -> Self {
        self.at = t;
        self
    }

    /// With a header.
    pub fn header(mut self, k: &str, v: &str) -> Self {
        self.headers.push((k.to_ascii_lowercase(), v.to_string()));
        self
    }

    /// The client gives up `after` sending.
    pub fn disconnect_after(mut self, after: Nanos) -> Self {
        self.disconnect_after = Some(after);
        self
    }

    /// On connection `id`.
    pub fn on_connection(mut self, id: u64) -> Self {
        self.connection = Some(id);
        self
    }

    /// Sent to gateway replica `r` directly (see [`RequestSpec::replica`]).
    pub fn to_replica(mut self, r: usize) -> Self {
        self.replica = Some(r);
        self
    }

    /// With a label.
    pub fn label(mut self, l: &str) -> Self {
        self.label = l.to_string();
        self
    }
}

/// Poisson arrivals with tenants, objectives (priorities), shared prompt prefixes and
/// SLO headers.
#[derive(Debug, Clone)]
pub struct Poisson {
    /// Mean arrivals per second.
    pub rate_per_sec: f64,
    /// How many requests.
    pub count: usize,
    /// First arrival no earlier than this.
    pub start: Nanos,
    /// Model name.
    pub model: String,
    /// Tenants (fairness ids) and their weights; empty = no fairness header.
    pub tenants: Vec<(String, f64)>,
    /// Objectives and their weights; empty = no objective header.
    pub objectives: Vec<(String, f64)>,
    /// Number of shared prompt prefixes (0 = all prompts distinct).
    pub prefix_groups: usize,
    /// Words per shared prefix.
    pub prefix_words: usize,
    /// Distinct words after the prefix.
    pub suffix_words: usize,
    /// Fraction of streamed requests.
    pub stream_fraction: f64,
    /// `max_tokens` range, inclusive.
    pub max_tokens: (u32, u32),
    /// SLO headers (ttft ms, tpot ms) to attach, if any.
    pub slo: Option<(u32, u32)>,
    /// Fraction of clients that give up, and after how long.
    pub disconnects: Option<(f64, Nanos)>,
}

impl Poisson {
    /// `count` requests at `rate_per_sec` for `model`, nothing else.
    pub fn new(rate_per_sec: f64, count: usize, model: &str) -> Poisson {
        Poisson {
            rate_per_sec,
            count,
            start: 0,
            model: model.into(),
            tenants: vec![],
            objectives: vec![],
            prefix_groups: 0,
            prefix_words: 32,
            suffix_words: 8,
            stream_fraction: 0.5,
            max_tokens: (8, 32),
            slo: None,
            disconnects: None,
        }
    }

    /// The requests, deterministic for `rng`.
    pub fn generate(&self, rng: &mut Rng) -> Vec<RequestSpec> {
        let mean_gap = SEC as f64 / self.rate_per_sec.max(1e-9);
        let mut t = self.start as f64;
        let pick = |rng: &mut Rng, list: &[(String, f64)]| -> Option<String> {
            if list.is_empty() {
                return None;
            }
            let w: Vec<f64> = list.iter().map(|(_, w)| *w).collect();
            Some(list[rng.weighted(&w)].0.clone())
        };
        (0..self.count)
            .map(|i| {
                t += rng.exponential(mean_gap);
                let mut prompt = String::new();
                if self.prefix_groups > 0 {
                    let g = rng.below(self.prefix_groups as u64);
                    for w in 0..self.prefix_words {
                        prompt.push_str(&format!("p{g}w{w} "));
                    }
                }
                for w in 0..self.suffix_words {
                    prompt.push_str(&format!("r{i}w{w} "));
                }
                let (lo, hi) = self.max_tokens;
                let tokens = lo + rng.below(u64::from(hi.saturating_sub(lo)) + 1) as u32;
                let stream = rng.unit() < self.stream_fraction;
                let mut spec =
                    RequestSpec::completion(&self.model, prompt.trim_end(), tokens, stream)
                        .at(t as Nanos);
                let tenant = pick(rng, &self.tenants);
                if let Some(tenant) = &tenant {
                    spec = spec.header(FAIRNESS_HEADER, tenant).label(tenant);
                }
                if let Some(o) = pick(rng, &self.objectives) {
                    spec = spec.header(OBJECTIVE_HEADER, &o);
                }
                if let Some((ttft, tpot)) = self.slo {
                    spec = spec
                        .header(SLO_TTFT_HEADER, &ttft.to_string())
                        .header(SLO_TPOT_HEADER, &tpot.to_string());
                }
                if let Some((fraction, after)) = self.disconnects {
                    if rng.unit() < fraction {
                        spec = spec.disconnect_after(after);
                    }
                }
                spec
            })
            .collect()
    }
}
