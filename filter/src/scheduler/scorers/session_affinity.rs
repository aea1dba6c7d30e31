//! `session-affinity-scorer` (router), strategy `encoded_endpoint_header`: the request
//! header `x-session-token` carries the base64 of the endpoint that served the session
//! before; that endpoint scores 1.0, the others 0. The gateway writes the token of the
//! endpoint it chose on every response (`crate::scheduler::scorers::session_affinity::token`).

use crate::config::{ConfigError, Params};
use crate::scheduler::{Cycle, Scorer};
use serde_json::Value;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "session-affinity-scorer";

/// The session-affinity scorer.
#[derive(Debug, Default)]
pub struct SessionAffinity;

impl Scorer for SessionAffinity {
    fn score(&self, cx: &Cycle<'_>, endpoints: &[usize]) -> Vec<f64> {
        let pinned = cx.request.session_token.and_then(decode);
        endpoints
            .iter()
            .map(|&i| {
                let hit = pinned
                    .as_deref()
                    .zip(cx.candidate(i))
                    .is_some_and(|(p, c)| p == c.address);
                if hit {
                    1.0
                } else {
                    0.0
                }
            })
            .collect()
    }
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// The session token for `endpoint` (standard base64).
pub fn token(endpoint: &str) -> String {
    let bytes = endpoint.as_bytes();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk.first().copied().unwrap_or(0),
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for k in 0..4 {
            if k <= chunk.len() {
                let idx = ((n >> (18 - 6 * k)) & 63) as usize;
                out.push(char::from(ALPHABET.get(idx).copied().unwrap_or(b'A')));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The endpoint a session token names (`None` if it is not valid base64 text).
pub fn decode(token: &str) -> Option<String> {
    let mut bits: u32 = 0;
    let mut n = 0;
    let mut out = Vec::new();
    for c in token.trim().bytes() {
        if c == b'=' {
            break;
        }
        let v = ALPHABET.iter().position(|a| *a == c)?;
        bits = (bits << 6) | u32::try_from(v).ok()?;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push(u8::try_from((bits >> n) & 0xff).ok()?);
        }
    }
    String::from_utf8(out).ok()
}

impl SessionAffinity {
    /// Builds the scorer from its `parameters`: `strategy` (only `encoded_endpoint_header`).
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(Some(v), path, &["strategy"])?;
        p.only("strategy", "encoded_endpoint_header")?;
        Ok(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::*;
    use crate::scheduler::Request;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn tokens_round_trip_as_base64() {
        assert_eq!(token("10.0.0.1:8000"), "MTAuMC4wLjE6ODAwMA==");
        assert_eq!(
            decode("MTAuMC4wLjE6ODAwMA==").as_deref(),
            Some("10.0.0.1:8000")
        );
        assert_eq!(decode("!!"), None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_sessions_endpoint_scores_one() {
        let c = candidates(&[(0, 0, 0.0); 3]);
        let t = token(&c[1].address);
        let request = Request {
            session_token: Some(&t),
            ..Request::default()
        };
        let cx = crate::scheduler::Cycle {
            request: &request,
            candidates: &c,
            prefix: &[],
            prior: &[],
            rendezvous_key: None,
            estimates: &[],
        };
        assert_eq!(SessionAffinity.score(&cx, &all(&c)), vec![0.0, 1.0, 0.0]);
        let none = Request::default();
        let cx = crate::scheduler::Cycle {
            request: &none,
            candidates: &c,
            prefix: &[],
            prior: &[],
            rendezvous_key: None,
            estimates: &[],
        };
        assert_eq!(SessionAffinity.score(&cx, &all(&c)), vec![0.0, 0.0, 0.0]);
    }
}
