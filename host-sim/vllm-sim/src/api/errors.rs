//! OpenAI-style error bodies: `{"error":{"message","type","param","code"}}`,
//! with the type derived from the status as llm-d-inference-sim and vLLM do.

use crate::engine::SubmitError;
use serde_json::json;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub param: Option<String>,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
        }
    }

    pub fn with_param(mut self, param: &str) -> Self {
        self.param = Some(param.to_string());
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }

    pub fn model_not_found(model: &str) -> Self {
        Self::new(404, format!("The model `{model}` does not exist.")).with_param("model")
    }

    pub fn not_ready() -> Self {
        Self::new(503, "The server is overloaded or not ready yet.")
    }

    /// The error `type` for a status code.
    pub fn error_type(status: u16) -> &'static str {
        match status {
            400 => "BadRequestError",
            401 => "AuthenticationError",
            403 => "PermissionDeniedError",
            404 => "NotFoundError",
            422 => "UnprocessableEntityError",
            429 => "RateLimitError",
            s if s >= 500 => "InternalServerError",
            _ => "APIConnectionError",
        }
    }

    pub fn to_json(&self) -> String {
        json!({
            "error": {
                "message": self.message,
                "type": Self::error_type(self.status),
                "param": self.param,
                "code": self.status,
            }
        })
        .to_string()
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        let param = match e {
            SubmitError::UnknownLora(_) => Some("model".to_string()),
            _ => None,
        };
        ApiError {
            status: e.status(),
            message: e.to_string(),
            param,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_body_has_openai_shape() {
        let v: serde_json::Value =
            serde_json::from_str(&ApiError::model_not_found("x").to_json()).unwrap();
        assert_eq!(v["error"]["type"], "NotFoundError");
        assert_eq!(v["error"]["code"], 404);
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(v["error"]["message"], "The model `x` does not exist.");
        let v: serde_json::Value =
            serde_json::from_str(&ApiError::from(SubmitError::QueueFull).to_json()).unwrap();
        assert_eq!(v["error"]["type"], "RateLimitError");
        assert_eq!(v["error"]["code"], 429);
        assert!(v["error"]["param"].is_null());
        assert_eq!(ApiError::error_type(503), "InternalServerError");
        assert_eq!(ApiError::error_type(409), "APIConnectionError");
    }
}
