//! Session affinity, shared by `session-affinity-scorer` and `session-affinity-filter`:
//! which endpoint a request's session is pinned to, and the parameters both take.
//!
//! * `encoded_endpoint_header` (default): the header (`x-session-token`, or
//!   `encodedEndpointHeaderConfig.header`, or `headerName`) carries the base64 of the
//!   endpoint that served the session before; the gateway writes the endpoint it chose
//!   back on every response. The reference encodes the pod's `namespace/name`; here there
//!   are no pods, so the token is the base64 of its `ip:port`.
//! * `session_id`: the header (`sessionIdConfig.sources[].header`, first present wins;
//!   default `x-session-id`) carries an opaque id. Deliberate difference: the reference
//!   keeps a server-side table (id → pod, evicted after `evictionTtlSeconds`) filled by
//!   where the first request went; here the session's endpoint is the candidate with the
//!   highest rendezvous hash of (id, address), so every worker and every gateway replica
//!   agrees with no table and no shared state, a departed endpoint's sessions move to
//!   their next choice only, and nothing is written back. The first request of a session
//!   is pinned as well (the reference lets the other plugins place it).
//!   `evictionTtlSeconds`, `evictionSweepSeconds` are checked and have nothing to evict.
//!   `attribute` sources (request attributes of other plugins, e.g. `agent-identity`)
//!   are refused: no plugin here publishes one.
//!
//! `profileName` (pin the prefill pick) is refused: only the primary endpoint is pinned.
//! One header per configuration: two session plugins naming different headers are
//! refused (the proxy reads and writes one).

use crate::config::validate::{as_array, as_str, err};
use crate::config::{ConfigError, Params};
use serde_json::Value;

/// Default header of `encoded_endpoint_header`.
pub const DEFAULT_TOKEN_HEADER: &str = "x-session-token";
/// Default header of `session_id`.
pub const DEFAULT_ID_HEADER: &str = "x-session-id";

/// How the session header is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// The header is the base64 of the endpoint's address; written back on responses.
    EncodedEndpoint,
    /// The header is an opaque id; its endpoint is its rendezvous choice.
    SessionId,
}

/// A session plugin's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// How the header is read.
    pub strategy: Strategy,
    /// The request headers read, first present wins (lowercase).
    pub headers: Vec<String>,
}

impl Session {
    /// Reads the parameters common to the scorer and the filter.
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(
            Some(v),
            path,
            &[
                "strategy",
                "profileName",
                "headerName",
                "encodedEndpointHeaderConfig",
                "sessionIdConfig",
            ],
        )?;
        if p.get("profileName").is_some() && !p.string("profileName", "")?.is_empty() {
            return Err(err(
                &p.path("profileName"),
                "pinning another profile's pick (e.g. prefill) is not supported: the session pins the primary endpoint",
            ));
        }
        let header = |name: String, path: String| -> Result<String, ConfigError> {
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
                return Err(err(&path, "must be a header name"));
            }
            Ok(name.to_ascii_lowercase())
        };
        match p.string("strategy", "encoded_endpoint_header")?.as_str() {
            "encoded_endpoint_header" => {
                let mut name = p.string("headerName", DEFAULT_TOKEN_HEADER)?;
                let mut at = p.path("headerName");
                if let Some(c) = p.get("encodedEndpointHeaderConfig") {
                    let cp =
                        Params::new(Some(c), &p.path("encodedEndpointHeaderConfig"), &["header"])?;
                    if cp.get("header").is_some() {
                        name = cp.string("header", DEFAULT_TOKEN_HEADER)?;
                        at = cp.path("header");
                    }
                }
                Ok(Self {
                    strategy: Strategy::EncodedEndpoint,
                    headers: vec![header(name, at)?],
                })
            }
            "session_id" => {
                let mut headers = Vec::new();
                if let Some(c) = p.get("sessionIdConfig") {
                    let cp = Params::new(
                        Some(c),
                        &p.path("sessionIdConfig"),
                        &["sources", "evictionTtlSeconds", "evictionSweepSeconds"],
                    )?;
                    cp.non_negative("evictionTtlSeconds", 300.0)?;
                    if cp.f64("evictionSweepSeconds", 10.0)? <= 0.0 {
                        return Err(err(&cp.path("evictionSweepSeconds"), "must be positive"));
                    }
                    if let Some(list) = cp.get("sources") {
                        let lp = cp.path("sources");
                        for (i, s) in as_array(list, &lp)?.iter().enumerate() {
                            let sp = format!("{lp}[{i}]");
                            let src = Params::new(Some(s), &sp, &["header", "attribute"])?;
                            if src.get("attribute").is_some() {
                                return Err(err(
                                    &src.path("attribute"),
                                    "request attributes of other plugins are not available here; use a header source",
                                ));
                            }
                            let h = src
                                .get("header")
                                .ok_or_else(|| err(&sp, "needs a header"))?;
                            let hp = src.path("header");
                            headers.push(header(as_str(h, &hp)?.to_string(), hp)?);
                        }
                    }
                }
                if headers.is_empty() {
                    headers.push(DEFAULT_ID_HEADER.to_string());
                }
                Ok(Self {
                    strategy: Strategy::SessionId,
                    headers,
                })
            }
            other => Err(err(
                &p.path("strategy"),
                format!("\"{other}\" is not a strategy: encoded_endpoint_header or session_id"),
            )),
        }
    }

    /// The endpoint among `addresses` (index into it) the session `value` is pinned to.
    pub fn pinned<'a>(
        &self,
        value: Option<&str>,
        addresses: impl Iterator<Item = &'a str>,
    ) -> Option<usize> {
        let value = value.filter(|v| !v.is_empty())?;
        match self.strategy {
            Strategy::EncodedEndpoint => {
                let endpoint = decode(value)?;
                addresses
                    .enumerate()
                    .find(|(_, a)| *a == endpoint)
                    .map(|(i, _)| i)
            }
            Strategy::SessionId => {
                let seed = xxhash_rust::xxh64::xxh64(value.as_bytes(), 0x5e55_1017);
                addresses
                    .enumerate()
                    .max_by_key(|(_, a)| xxhash_rust::xxh64::xxh64(a.as_bytes(), seed))
                    .map(|(i, _)| i)
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
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
    fn headers_and_strategies_from_the_parameters() {
        let s = |v| Session::from_parameters(&v, "p");
        assert_eq!(s(Value::Null).unwrap().headers, vec!["x-session-token"]);
        assert_eq!(
            s(json!({"headerName": "X-Conv"})).unwrap().headers,
            vec!["x-conv"]
        );
        assert_eq!(
            s(json!({"encodedEndpointHeaderConfig": {"header": "x-t"}}))
                .unwrap()
                .headers,
            vec!["x-t"]
        );
        let id = s(json!({"strategy": "session_id",
            "sessionIdConfig": {"sources": [{"header": "x-a"}, {"header": "x-b"}]}}))
        .unwrap();
        assert_eq!(
            (id.strategy, id.headers.clone()),
            (Strategy::SessionId, vec!["x-a".into(), "x-b".into()])
        );
        let e = |v| s(v).unwrap_err().path;
        assert_eq!(e(json!({"profileName": "prefill"})), "p.profileName");
        assert_eq!(
            e(
                json!({"strategy": "session_id", "sessionIdConfig": {"sources": [{"attribute": "agent-identity"}]}})
            ),
            "p.sessionIdConfig.sources[0].attribute"
        );
        assert_eq!(e(json!({"strategy": "cookie"})), "p.strategy");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_session_id_keeps_its_endpoint_while_others_come_and_go() {
        let s = Session::from_parameters(&json!({"strategy": "session_id"}), "p").unwrap();
        let pool = [
            "10.0.0.1:8000",
            "10.0.0.2:8000",
            "10.0.0.3:8000",
            "10.0.0.4:8000",
        ];
        let at = |addrs: &[&str], id: &str| {
            s.pinned(Some(id), addrs.iter().copied())
                .map(|i| addrs[i].to_string())
        };
        let home = at(&pool, "conversation-7").unwrap();
        // Another endpoint leaving does not move the session.
        let fewer: Vec<&str> = pool.iter().copied().filter(|a| *a != home).collect();
        let other = fewer[0];
        let without_other: Vec<&str> = pool.iter().copied().filter(|a| *a != other).collect();
        assert_eq!(at(&without_other, "conversation-7").unwrap(), home);
        // Its own endpoint leaving moves it somewhere that stays put.
        let moved = at(&fewer, "conversation-7").unwrap();
        assert_ne!(moved, home);
        // Sessions spread over the pool.
        let homes: std::collections::BTreeSet<String> = (0..64)
            .map(|i| at(&pool, &format!("s{i}")).unwrap())
            .collect();
        assert_eq!(homes.len(), 4);
        assert_eq!(s.pinned(None, pool.iter().copied()), None);
    }
}
