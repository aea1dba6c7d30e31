//! Error responses: what a client sees when the gateway answers itself.
//!
//! The body has the shape OpenAI clients parse:
//! `{"error":{"message":"...","type":"...","param":null,"code":400}}`, or on Anthropic's
//! Messages paths the shape Anthropic clients parse:
//! `{"type":"error","error":{"type":"invalid_request_error","message":"..."}}`.

use serde_json::json;

/// An error the filter answers with a local reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status code.
    pub status: u16,
    /// OpenAI error type, e.g. `invalid_request_error`.
    pub kind: &'static str,
    /// A sentence the user can act on.
    pub message: String,
    /// The request field at fault, when there is one.
    pub param: Option<&'static str>,
    /// Why flow control dropped the request (`x-llm-d-request-dropped-reason`), when it
    /// did; such replies also carry `Retry-After`.
    pub dropped: Option<&'static str>,
}

impl ApiError {
    /// 400: the request is malformed.
    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self {
            status: 400,
            kind: "invalid_request_error",
            message: message.into(),
            param,
            dropped: None,
        }
    }

    /// 404: nothing here serves the request.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: 404,
            kind: "not_found_error",
            message: message.into(),
            param: None,
            dropped: None,
        }
    }

    /// 413: the request body is larger than the configured limit.
    pub fn body_too_large(size: usize, limit: usize) -> Self {
        Self {
            status: 413,
            kind: "invalid_request_error",
            message: format!(
                "request body is {size} bytes, over this gateway's limit of {limit} bytes \
                 (pool.maxRequestBodyBytes)"
            ),
            param: None,
            dropped: None,
        }
    }

    /// 503: no endpoint can serve the request.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            status: 503,
            kind: "service_unavailable",
            message: message.into(),
            param: None,
            dropped: None,
        }
    }

    /// 429: the pool has endpoints, but the scheduler's filters removed every one for this
    /// request (the reference answers ResourceExhausted, "failed to find target endpoint").
    pub fn no_target(message: impl Into<String>) -> Self {
        Self {
            status: 429,
            kind: "rate_limit_error",
            message: format!("failed to find target endpoint: {}", message.into()),
            param: None,
            dropped: None,
        }
    }

    /// 500: the gateway itself failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: 500,
            kind: "internal_error",
            message: message.into(),
            param: None,
            dropped: None,
        }
    }

    /// The JSON body of the local reply.
    /// The same error, marked as a flow-control drop for `reason` (one of the router's
    /// `x-llm-d-request-dropped-reason` values).
    pub fn dropped(mut self, reason: &'static str) -> Self {
        self.dropped = Some(reason);
        self
    }

    /// Seconds a client should wait before retrying (`Retry-After`): set on flow
    /// control's 429 and 503, whose condition (a full queue, a saturated pool) clears on
    /// the scale of the pool's request times.
    pub fn retry_after_s(&self) -> Option<u32> {
        (self.dropped.is_some() && matches!(self.status, 429 | 503)).then_some(1)
    }

    /// The body in Anthropic's shape, with the error type Anthropic uses for the status
    /// (`type_of`, from the Messages parser).
    pub fn anthropic_body(&self, type_of: fn(u16) -> &'static str) -> String {
        json!({
            "type": "error",
            "error": {
                "type": type_of(self.status),
                "message": self.message,
            }
        })
        .to_string()
    }

    pub fn body(&self) -> String {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status,
            }
        })
        .to_string()
    }
}

/// `s` cut to at most `max` bytes at a character boundary (a client's string in a message).
pub fn cut(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn body_is_openai_shaped_json() {
        let e = ApiError::bad_request("missing field `model`", Some("model"));
        let v: serde_json::Value = serde_json::from_str(&e.body()).unwrap();
        assert_eq!(v["error"]["code"], 400);
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(v["error"]["message"], "missing field `model`");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_anthropic_body_has_anthropics_shape() {
        let e = ApiError::bad_request("missing field `model`", Some("model"));
        let v: serde_json::Value =
            serde_json::from_str(&e.anthropic_body(|_| "invalid_request_error")).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["message"], "missing field `model`");
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("abc", 10), "abc");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn too_large_names_the_limit_and_the_setting() {
        let e = ApiError::body_too_large(2000, 1000);
        assert_eq!(e.status, 413);
        assert!(e.message.contains("1000"));
        assert!(e.message.contains("maxRequestBodyBytes"));
    }
}
