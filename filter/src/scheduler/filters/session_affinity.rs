//! `session-affinity-filter` (llm-d-router #1631): the hard form of
//! `session-affinity-scorer` — when the request's session is pinned to one of the
//! candidates, only that one is kept; otherwise (no session, an undecodable token, the
//! endpoint gone) all pass, so the filter never empties a profile. Strategies and
//! parameters in [`crate::scheduler::session`].

use crate::config::ConfigError;
use crate::rng::Rng;
use crate::scheduler::session::Session;
use crate::scheduler::{Cycle, Filter};
use serde_json::Value;

/// The type name.
pub const TYPE: &str = "session-affinity-filter";

/// The filter.
#[derive(Debug)]
pub struct SessionAffinity {
    /// Its strategy and header.
    pub session: Session,
}

impl SessionAffinity {
    /// Builds the filter from its `parameters` ([`Session::from_parameters`]).
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        Ok(Self {
            session: Session::from_parameters(v, path)?,
        })
    }
}

impl Filter for SessionAffinity {
    fn filter(&self, cx: &Cycle<'_>, endpoints: Vec<usize>, _rng: &mut Rng) -> Vec<usize> {
        let addresses = endpoints
            .iter()
            .map(|&i| cx.candidate(i).map_or("", |c| c.address.as_str()));
        match self.session.pinned(cx.request.session_token, addresses) {
            Some(k) => endpoints.get(k).map(|&i| vec![i]).unwrap_or(endpoints),
            None => endpoints,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::session::token;
    use crate::scheduler::testing::*;
    use crate::scheduler::Request;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn keeps_only_the_sessions_endpoint_or_everything() {
        let c = candidates(&[(0, 0, 0.0); 3]);
        let f = SessionAffinity::from_parameters(&json!({"headerName": "x-conv"}), "p").unwrap();
        let t = token(&c[2].address);
        let run = |token: Option<&str>, eps: Vec<usize>| {
            let r = Request {
                session_token: token,
                ..Request::default()
            };
            f.filter(&cycle_for(&r, &c), eps, &mut Rng::new(0))
        };
        assert_eq!(run(Some(&t), all(&c)), vec![2]);
        // Pinned endpoint filtered out earlier, no token, garbage: everything passes.
        assert_eq!(run(Some(&t), vec![0, 1]), vec![0, 1]);
        assert_eq!(run(None, all(&c)), vec![0, 1, 2]);
        assert_eq!(run(Some("%%%"), all(&c)), vec![0, 1, 2]);
    }
}
