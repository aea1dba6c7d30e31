//! What the queues hold and what the dispatcher sends: a [`Job`] (one batch request,
//! whatever queue it came from) and its [`Outcome`], plus the wire formats:
//!
//! * llm-d-async's request (`{id, created, deadline, payload, metadata, headers,
//!   endpoint}`, alone or inside its `{internal, request_kind, data}` envelope) and
//!   result (`{id, status_code, payload, error_code, error_message}`);
//! * the OpenAI Batch input line (`{custom_id, method, url, body}`) and output line
//!   (`{id, custom_id, response: {status_code, request_id, body}, error}`).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Error codes of results that carry no HTTP response (llm-d-async's).
pub const DEADLINE_EXCEEDED: &str = "DEADLINE_EXCEEDED";
pub const INFERENCE_ERROR: &str = "INFERENCE_ERROR";
pub const INVALID_REQUEST: &str = "INVALID_REQUEST";

/// One batch request, ready to dispatch.
#[derive(Debug, Clone)]
pub struct Job {
    /// The queue's handle for it (the Redis member, or the input line number).
    pub key: String,
    /// The request's id (llm-d-async `id`, OpenAI `custom_id`).
    pub id: String,
    /// Unix milliseconds after which it must not be dispatched.
    pub deadline_ms: Option<u64>,
    /// Path on the gateway (`/v1/completions`, `/v1/chat/completions`).
    pub path: String,
    /// The JSON body.
    pub body: Vec<u8>,
    /// Headers to send (the message's own).
    pub headers: Vec<(String, String)>,
    /// The flow (tenant) in the gateway's fairness; llm-d-async: metadata `userid`.
    pub fairness_id: Option<String>,
    /// Dispatch attempts so far (retries after 429 or a transport error).
    pub attempts: u32,
    /// Why the message cannot be dispatched (answered with INVALID_REQUEST).
    pub invalid: Option<String>,
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The gateway answered (any status but a retried 429/503).
    Http { status: u16, body: String },
    /// No HTTP answer to report: an error code and message.
    Failed { code: String, message: String },
}

impl Outcome {
    pub fn failed(code: &str, message: impl Into<String>) -> Outcome {
        Outcome::Failed {
            code: code.to_string(),
            message: message.into(),
        }
    }
}

/// llm-d-async's `RequestMessage` (with the Redis kind's queue names).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AsyncRequest {
    pub id: String,
    #[serde(default)]
    pub created: i64,
    /// Unix seconds.
    pub deadline: i64,
    #[serde(default)]
    pub payload: Value,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub endpoint: String,
    #[serde(default)]
    pub request_queue_name: String,
    #[serde(default)]
    pub result_queue_name: String,
}

/// A Redis queue member decoded: the request and the routing llm-d-async keeps beside it.
#[derive(Debug, Clone)]
pub struct Member {
    pub request: AsyncRequest,
    /// `internal.request_token` (llm-d-async's producer sets one per enqueue).
    pub token: String,
    /// `internal.result_queue_name`, else the request's own.
    pub result_queue: String,
}

impl Member {
    /// Decodes an envelope `{internal, request_kind, data}` or a bare request.
    pub fn decode(raw: &str) -> Result<Member, String> {
        let v: Value = serde_json::from_str(raw).map_err(|e| format!("not JSON: {e}"))?;
        let (internal, data) = if v.get("request_kind").is_some() {
            (v["internal"].clone(), v["data"].clone())
        } else {
            (Value::Null, v)
        };
        let request: AsyncRequest =
            serde_json::from_value(data).map_err(|e| format!("not a request: {e}"))?;
        let s = |k: &str| internal[k].as_str().unwrap_or_default().to_string();
        let result_queue = match s("result_queue_name") {
            q if !q.is_empty() => q,
            _ => request.result_queue_name.clone(),
        };
        Ok(Member {
            token: s("request_token"),
            result_queue,
            request,
        })
    }
}

/// llm-d-async's `ResultMessage` for `id` and `outcome`.
pub fn async_result(id: &str, outcome: &Outcome) -> Value {
    match outcome {
        Outcome::Http { status, body } => json!({
            "id": id,
            "status_code": status,
            "payload": body,
        }),
        Outcome::Failed { code, message } => json!({
            "id": id,
            "payload": json!({"error": message}).to_string(),
            "error_code": code,
            "error_message": message,
        }),
    }
}

/// One line of an OpenAI Batch input file.
#[derive(Debug, Clone, Deserialize)]
pub struct BatchLine {
    pub custom_id: String,
    #[serde(default = "post")]
    pub method: String,
    pub url: String,
    pub body: Value,
}

fn post() -> String {
    "POST".to_string()
}

/// One line of an OpenAI Batch output file.
pub fn batch_output(seq: u64, custom_id: &str, outcome: &Outcome) -> Value {
    match outcome {
        Outcome::Http { status, body } => {
            let body: Value =
                serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.clone()));
            json!({
                "id": format!("batch_req_{seq}"),
                "custom_id": custom_id,
                "response": {"status_code": status, "request_id": format!("req_{seq}"), "body": body},
                "error": null,
            })
        }
        Outcome::Failed { code, message } => json!({
            "id": format!("batch_req_{seq}"),
            "custom_id": custom_id,
            "response": null,
            "error": {"code": code, "message": message},
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_envelope_llm_d_async_writes() {
        let raw = r#"{"internal":{"request_token":"t1","result_queue_name":"res-a"},"request_kind":"redis",
            "data":{"id":"r1","created":1,"deadline":2000000000,"payload":{"model":"m","prompt":"p"},
            "metadata":{"userid":"alice"},"endpoint":"/v1/chat/completions"}}"#;
        let m = Member::decode(raw).unwrap();
        assert_eq!(m.request.id, "r1");
        assert_eq!(m.token, "t1");
        assert_eq!(m.result_queue, "res-a");
        assert_eq!(m.request.metadata["userid"], "alice");
        assert_eq!(m.request.endpoint, "/v1/chat/completions");
    }

    #[test]
    fn decodes_a_bare_request_and_rejects_one_without_deadline() {
        let m = Member::decode(r#"{"id":"r2","deadline":5,"payload":{}}"#).unwrap();
        assert_eq!(m.request.deadline, 5);
        assert!(Member::decode(r#"{"id":"r3","payload":{}}"#).is_err());
    }

    #[test]
    fn results_follow_llm_d_async_wire_semantics() {
        let ok = async_result(
            "a",
            &Outcome::Http {
                status: 200,
                body: "{}".into(),
            },
        );
        assert_eq!(ok, json!({"id": "a", "status_code": 200, "payload": "{}"}));
        let late = async_result("b", &Outcome::failed(DEADLINE_EXCEEDED, "deadline passed"));
        assert_eq!(late["error_code"], "DEADLINE_EXCEEDED");
        assert!(late.get("status_code").is_none()); // 0: no HTTP response
    }
}
