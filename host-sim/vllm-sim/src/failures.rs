//! Failure injection, as in llm-d-inference-sim (`failures.go`): with
//! probability `rate_percent` %, a request gets one of the configured errors
//! instead of an answer. The `X-Return-Error: <status>` request header asks
//! for a given status deterministically.

use crate::api::errors::ApiError;
use crate::rng::Rng;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureType {
    RateLimit,
    InvalidApiKey,
    ContextLength,
    ServerError,
    InvalidRequest,
    ModelNotFound,
}

impl FailureType {
    pub const ALL: [FailureType; 6] = [
        FailureType::RateLimit,
        FailureType::InvalidApiKey,
        FailureType::ContextLength,
        FailureType::ServerError,
        FailureType::InvalidRequest,
        FailureType::ModelNotFound,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FailureType::RateLimit => "rate_limit",
            FailureType::InvalidApiKey => "invalid_api_key",
            FailureType::ContextLength => "context_length",
            FailureType::ServerError => "server_error",
            FailureType::InvalidRequest => "invalid_request",
            FailureType::ModelNotFound => "model_not_found",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == s.trim())
    }

    pub fn status(self) -> u16 {
        match self {
            FailureType::RateLimit => 429,
            FailureType::InvalidApiKey => 401,
            FailureType::ContextLength | FailureType::InvalidRequest => 400,
            FailureType::ServerError => 503,
            FailureType::ModelNotFound => 404,
        }
    }

    /// The error body llm-d-inference-sim returns for this failure.
    pub fn error(self, model: &str) -> ApiError {
        match self {
            FailureType::RateLimit => ApiError::new(429, format!("Rate limit reached for {model} in organization org-xxx on requests per min (RPM): Limit 3, Used 3, Requested 1.")),
            FailureType::InvalidApiKey => ApiError::new(401, "Incorrect API key provided."),
            FailureType::ContextLength => ApiError::new(400, "This model's maximum context length is 4096 tokens. However, your messages resulted in 4500 tokens.").with_param("messages"),
            FailureType::ServerError => ApiError::not_ready(),
            FailureType::InvalidRequest => ApiError::new(400, "Invalid request: missing required parameter 'model'.").with_param("model"),
            FailureType::ModelNotFound => ApiError::new(404, format!("The model '{model}-nonexistent' does not exist")).with_param("model"),
        }
    }
}

/// Parses a comma-separated list of failure types.
pub fn parse_types(list: &str) -> Result<Vec<FailureType>, String> {
    list.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| FailureType::parse(s).ok_or_else(|| format!("unknown failure type {s:?}")))
        .collect()
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct FailureConfig {
    /// Percent of requests that fail, 0..=100.
    pub rate_percent: f64,
    /// Types to draw from; empty means all.
    pub types: Vec<FailureType>,
}

impl FailureConfig {
    /// Draws whether this request fails, and how.
    pub fn pick(&self, rng: &mut Rng) -> Option<FailureType> {
        if self.rate_percent <= 0.0 || rng.next_f64() * 100.0 >= self.rate_percent {
            return None;
        }
        let types: &[FailureType] = if self.types.is_empty() {
            &FailureType::ALL
        } else {
            &self.types
        };
        Some(types[rng.range(0, types.len() as u64 - 1) as usize])
    }
}

/// The error for `X-Return-Error: <value>`.
pub fn error_for_header(value: &str, model: &str) -> ApiError {
    let Ok(status) = value.trim().parse::<u16>() else {
        return ApiError::bad_request(format!("Invalid X-Return-Error header value {value:?}"));
    };
    match FailureType::ALL.into_iter().find(|t| t.status() == status) {
        Some(t) => t.error(model),
        None if (100..600).contains(&status) => {
            ApiError::new(status, format!("Simulated error with status {status}"))
        }
        None => ApiError::bad_request(format!("Invalid X-Return-Error header value {value:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_zero_never_fails_and_hundred_always_fails_with_chosen_types() {
        let mut rng = Rng::new(1);
        let none = FailureConfig::default();
        assert!((0..1000).all(|_| none.pick(&mut rng).is_none()));
        let all = FailureConfig {
            rate_percent: 100.0,
            types: vec![FailureType::RateLimit, FailureType::ServerError],
        };
        for _ in 0..100 {
            let t = all.pick(&mut rng).unwrap();
            assert!(matches!(
                t,
                FailureType::RateLimit | FailureType::ServerError
            ));
        }
        let half = FailureConfig {
            rate_percent: 50.0,
            types: vec![],
        };
        let n = (0..2000).filter(|_| half.pick(&mut rng).is_some()).count();
        assert!((800..1200).contains(&n), "{n}");
    }

    #[test]
    fn header_gives_that_status() {
        assert_eq!(error_for_header("429", "m").status, 429);
        assert_eq!(error_for_header("503", "m").status, 503);
        assert_eq!(error_for_header("418", "m").status, 418);
        assert_eq!(error_for_header("abc", "m").status, 400);
        assert_eq!(parse_types("rate_limit, server_error").unwrap().len(), 2);
        assert!(parse_types("nope").is_err());
    }
}
