//! Sending a batch request into the gateway as sheddable traffic: the configured
//! objective in `x-gateway-inference-objective` (one of negative priority in the
//! gateway's `pool.objectives`, so flow control sheds it first), the message's own
//! headers, then the fairness id (llm-d-async: metadata `userid`) in the fairness header
//! (stamped last, as llm-d-async does, so the tenant cannot be overridden by a header).

use crate::message::{Job, Outcome};
use std::time::Duration;

pub struct Gateway {
    pub client: reqwest::Client,
    /// `http://host:port` of the gateway listener.
    pub base: String,
    pub objective: Option<String>,
    pub fairness_header: String,
    pub timeout: Duration,
}

/// What one attempt gave.
#[derive(Debug)]
pub enum Sent {
    /// A final answer (any status but 429 and 503).
    Done(Outcome),
    /// 429: the gateway is overloaded; `Retry-After` if it said.
    Backpressure(Option<Duration>),
    /// 503 or no answer (connection refused, timeout): worth another attempt; the 503
    /// is the result if the attempts run out.
    Transient(String, Option<Outcome>),
}

impl Gateway {
    pub async fn send(&self, job: &Job) -> Sent {
        let url = format!("{}{}", self.base.trim_end_matches('/'), job.path);
        let mut req = self
            .client
            .post(&url)
            .timeout(self.timeout)
            .header("content-type", "application/json");
        if let Some(o) = &self.objective {
            req = req.header("x-gateway-inference-objective", o);
        }
        for (k, v) in &job.headers {
            req = req.header(k, v);
        }
        if let Some(f) = &job.fairness_id {
            req = req.header(&self.fairness_header, f);
        }
        let resp = match req.body(job.body.clone()).send().await {
            Ok(r) => r,
            Err(e) => return Sent::Transient(format!("POST {url}: {e}"), None),
        };
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = match resp.text().await {
            Ok(b) => b,
            Err(e) => return Sent::Transient(format!("POST {url}: reading the body: {e}"), None),
        };
        match status {
            429 => Sent::Backpressure(retry_after),
            503 => Sent::Transient(
                format!("POST {url}: 503"),
                Some(Outcome::Http { status, body }),
            ),
            _ => Sent::Done(Outcome::Http { status, body }),
        }
    }
}
