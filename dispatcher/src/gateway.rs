//! Sending a batch request into the gateway as sheddable traffic: the configured
//! objective in `x-gateway-inference-objective` (one of negative priority in the
//! gateway's `pool.objectives`, so flow control sheds it first), the message's own
//! headers, then the fairness id (llm-d-async: metadata `userid`) in the fairness header
//! (stamped last, as llm-d-async does, so the tenant cannot be overridden by a header).
//! With `--request-priority N` the body also gets vLLM's `priority` field (lower is
//! served earlier by a server started with `--scheduling-policy priority`), unless the
//! message's body sets its own.

use crate::message::{Job, Outcome};
use std::time::Duration;

pub struct Gateway {
    pub client: reqwest::Client,
    /// `http://host:port` of the gateway listener.
    pub base: String,
    pub objective: Option<String>,
    pub fairness_header: String,
    pub timeout: Duration,
    /// vLLM's body `priority` for requests whose body has none (`--request-priority`).
    pub request_priority: Option<i64>,
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
        let body = match self.request_priority {
            Some(p) => with_priority(&job.body, p),
            None => job.body.clone(),
        };
        let resp = match req.body(body).send().await {
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

/// `body` with vLLM's `priority` set to `priority` if it is a JSON object without one;
/// otherwise `body` as it is (the message's own priority wins, and a body that is not
/// an object is the server's to refuse).
pub fn with_priority(body: &[u8], priority: i64) -> Vec<u8> {
    let Ok(serde_json::Value::Object(mut doc)) = serde_json::from_slice(body) else {
        return body.to_vec();
    };
    if doc.contains_key("priority") {
        return body.to_vec();
    }
    doc.insert("priority".into(), priority.into());
    serde_json::to_vec(&doc).unwrap_or_else(|_| body.to_vec())
}

#[cfg(test)]
mod tests {
    use super::with_priority;
    use serde_json::{json, Value};

    fn parsed(b: &[u8]) -> Value {
        serde_json::from_slice(b).unwrap()
    }

    #[test]
    fn request_priority_is_added_to_the_body_unless_it_has_one() {
        let body = json!({"model": "m", "prompt": "p", "max_tokens": 3}).to_string();
        assert_eq!(
            parsed(&with_priority(body.as_bytes(), 10)),
            json!({"model": "m", "prompt": "p", "max_tokens": 3, "priority": 10})
        );
        let own = json!({"prompt": "p", "priority": -1}).to_string();
        assert_eq!(with_priority(own.as_bytes(), 10), own.as_bytes());
        assert_eq!(with_priority(b"[1,2]", 10), b"[1,2]");
        assert_eq!(with_priority(b"not json", 10), b"not json");
    }
}
