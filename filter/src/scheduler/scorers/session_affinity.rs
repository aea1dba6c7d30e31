//! `session-affinity-scorer` (router): the endpoint the request's session is pinned to
//! scores 1.0, the others 0 (none pinned, or it is not a candidate: all 0). Strategies
//! and parameters in [`crate::scheduler::session`]; with `encoded_endpoint_header` the
//! gateway writes the chosen endpoint's token back on every response.

use crate::config::ConfigError;
use crate::scheduler::session::Session;
use crate::scheduler::{Cycle, Scorer};
use serde_json::Value;

pub use crate::scheduler::session::{decode, token};

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "session-affinity-scorer";

/// The session-affinity scorer.
#[derive(Debug)]
pub struct SessionAffinity {
    /// Its strategy and header.
    pub session: Session,
}

impl Scorer for SessionAffinity {
    fn score(&self, cx: &Cycle<'_>, endpoints: &[usize]) -> Vec<f64> {
        let addresses = endpoints
            .iter()
            .map(|&i| cx.candidate(i).map_or("", |c| c.address.as_str()));
        let pinned = self.session.pinned(cx.request.session_token, addresses);
        (0..endpoints.len())
            .map(|k| if Some(k) == pinned { 1.0 } else { 0.0 })
            .collect()
    }
}

impl SessionAffinity {
    /// Builds the scorer from its `parameters` ([`Session::from_parameters`]).
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        Ok(Self {
            session: Session::from_parameters(v, path)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::*;
    use crate::scheduler::Request;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn the_sessions_endpoint_scores_one() {
        let c = candidates(&[(0, 0, 0.0); 3]);
        let s = SessionAffinity::from_parameters(&Value::Null, "p").unwrap();
        let t = token(&c[1].address);
        let request = Request {
            session_token: Some(&t),
            ..Request::default()
        };
        assert_eq!(
            s.score(&cycle_for(&request, &c), &all(&c)),
            vec![0.0, 1.0, 0.0]
        );
        let none = Request::default();
        assert_eq!(
            s.score(&cycle_for(&none, &c), &all(&c)),
            vec![0.0, 0.0, 0.0]
        );
    }
}
