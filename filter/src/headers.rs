//! Every HTTP header name of the protocol, in one place: what the gateway reads from
//! clients, what it writes for Envoy and the model servers, and what it answers with.
//! Where the reference's two generations differ (Gateway API Inference Extension,
//! `x-gateway-*`; llm-d router, `x-llm-d-*`), both are read, the first found wins.

use std::borrow::Cow;

/// Request header carrying the chosen endpoints (primary, then fallbacks,
/// comma-separated), as the reference protocol defines it. An `override_host` cluster
/// takes its first member.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// Request header carrying the primary endpoint alone: what our `ORIGINAL_DST` cluster
/// routes on (it reads a single `ip:port`, so a fallback list in [`DESTINATION`] would
/// make it fail).
pub const PRIMARY: &str = "x-gateway-destination-endpoint-primary";
/// Request header restricting the candidates (read, then stripped before upstream).
pub const SUBSET: &str = "x-gateway-destination-endpoint-subset";
/// Request header naming the prefill endpoint (P/D disaggregation).
pub const PREFILLER: &str = "x-prefiller-host-port";
/// Request header naming the encode endpoints, comma-separated (llm-d-router's E/P/D).
pub const ENCODERS: &str = "x-encoder-hosts-ports";
/// Response header naming the endpoint that served.
pub const SERVED: &str = "x-gateway-destination-endpoint-served";
/// The request's tenant for fairness (GIE name, router name).
pub const FAIRNESS_ID: [&str; 2] = [
    "x-gateway-inference-fairness-id",
    "x-llm-d-inference-fairness-id",
];
/// The request's objective, which gives its priority (GIE name, router name).
pub const OBJECTIVE: [&str; 2] = [
    "x-gateway-inference-objective",
    "x-llm-d-inference-objective",
];
/// The request's time-to-first-token objective in ms (GIE name, router name).
pub const SLO_TTFT: [&str; 2] = ["x-slo-ttft-ms", "x-llm-d-slo-ttft-ms"];
/// The request's time-per-output-token objective in ms (GIE name, router name).
pub const SLO_TPOT: [&str; 2] = ["x-slo-tpot-ms", "x-llm-d-slo-tpot-ms"];
/// Asks for (`true`) or declines (`false`) the SLO profile of `slo-aware-profile-handler`.
pub const PREDICTION_BASED: &str = "x-prediction-based-scheduling";
/// `true` declines the SLO profile (the later generation of [`PREDICTION_BASED`]).
pub const PREDICTION_BASED_OFF: &str = "x-prediction-based-scheduling-off";
/// Model rewrite (GIE name, router name).
pub const MODEL_REWRITE: [&str; 2] = ["x-gateway-model-name-rewrite", "x-llm-d-model-name-rewrite"];
/// The request's id: generated (a UUID) when the client sent none, as the reference does.
pub const REQUEST_ID: &str = "x-request-id";
/// Session affinity: the client sends back the token the gateway answered with.
pub const SESSION_TOKEN: &str = "x-session-token";
/// On a flow-control refusal: why the request was dropped (the llm-d router's values).
pub const DROPPED_REASON: &str = "x-llm-d-request-dropped-reason";
/// On a flow-control 429 or 503: seconds to wait before retrying.
pub const RETRY_AFTER: &str = "retry-after";

/// On the metrics callouts: the endpoint the `ORIGINAL_DST` scrape cluster connects to.
pub const ORIGINAL_DST_HOST: &str = "x-envoy-original-dst-host";

/// Headers a client must not pass upstream or set itself: the gateway owns them (the
/// subset hint, the rewrite, SLO and profile-selection headers are read first).
pub const GATEWAY_OWNED: [&str; 18] = [
    DESTINATION,
    PRIMARY,
    PREFILLER,
    ENCODERS,
    SERVED,
    SUBSET,
    MODEL_REWRITE[0],
    MODEL_REWRITE[1],
    FAIRNESS_ID[0],
    FAIRNESS_ID[1],
    OBJECTIVE[0],
    OBJECTIVE[1],
    SLO_TTFT[0],
    SLO_TTFT[1],
    SLO_TPOT[0],
    SLO_TPOT[1],
    PREDICTION_BASED,
    PREDICTION_BASED_OFF,
];

/// A request's headers as one read gave them (the proxy-wasm header-map encoding), looked
/// up by name without further host calls. Names and values borrow the buffer read (a
/// copy only for one that is not UTF-8, with the invalid bytes replaced).
pub struct HeaderMap<'a> {
    pairs: Vec<(Cow<'a, str>, Cow<'a, str>)>,
    /// Bit `n % 64` set for every name of `n` bytes: most names looked up are absent,
    /// and most of those are told so by their length without a pass over the pairs.
    lengths: u64,
}

impl<'a> HeaderMap<'a> {
    /// Decodes the proxy-wasm serialization of a header map: a little-endian `u32`
    /// count, then each pair's key and value sizes (`u32` each), then the keys and
    /// values, each followed by a NUL. A malformed buffer yields the pairs decoded
    /// before the fault.
    pub fn decode(bytes: &'a [u8]) -> Self {
        let le32 = |b: &[u8]| b.first_chunk::<4>().map_or(0, |w| u32::from_le_bytes(*w));
        let count = match bytes.first_chunk::<4>() {
            Some(w) => usize::try_from(u32::from_le_bytes(*w)).unwrap_or(usize::MAX),
            None => {
                return Self {
                    pairs: Vec::new(),
                    lengths: 0,
                }
            }
        };
        let first = count.saturating_mul(8).saturating_add(4);
        let sizes = bytes.get(4..first).unwrap_or_default();
        // Names and values, each followed by a NUL; checked as UTF-8 in one pass over all
        // of them (each then borrowed as it is when it starts and ends on a character
        // boundary), one at a time only when that fails.
        let data = bytes.get(first..).unwrap_or_default();
        let text = std::str::from_utf8(data).ok();
        let piece = |from: usize, to: usize| -> Option<Cow<'a, str>> {
            match text.and_then(|t| t.get(from..to)) {
                Some(s) => Some(Cow::Borrowed(s)),
                None => data.get(from..to).map(String::from_utf8_lossy),
            }
        };
        // Sized once (a pair takes at least 10 bytes of the buffer, so a bogus count
        // cannot reserve more than the buffer could hold).
        let mut pairs = Vec::with_capacity(count.min(bytes.len() / 10));
        let mut lengths = 0;
        let mut at = 0usize;
        // A malformed buffer yields the pairs decoded before the fault.
        for size in sizes.chunks_exact(8) {
            let k = usize::try_from(le32(size)).unwrap_or(usize::MAX);
            let v = usize::try_from(size.get(4..).map_or(0, le32)).unwrap_or(usize::MAX);
            let key_end = at.saturating_add(k);
            let value_at = key_end.saturating_add(1);
            let value_end = value_at.saturating_add(v);
            let (Some(key), Some(value)) = (piece(at, key_end), piece(value_at, value_end)) else {
                break;
            };
            at = value_end.saturating_add(1);
            lengths |= length_bit(&key);
            pairs.push((key, value));
        }
        Self { pairs, lengths }
    }

    /// The first value of header `name` (names are lower case, as Envoy gives them).
    pub fn get(&self, name: &str) -> Option<&str> {
        if self.lengths & length_bit(name) == 0 {
            return None;
        }
        self.pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_ref())
    }

    /// The first of `names` that is present, unless its value is empty (the
    /// generations of a header's name, in order of precedence).
    pub fn first(&self, names: &[&str]) -> Option<&str> {
        names
            .iter()
            .find_map(|n| self.get(n))
            .filter(|v| !v.is_empty())
    }

    /// Whether the map holds no header at all (a request always has pseudo-headers, so
    /// this means the read failed).
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// The gateway-owned headers present (to strip before upstream), in the order of
    /// [`GATEWAY_OWNED`]. One pass over the pairs: every gateway-owned name starts with
    /// `x-`, so most of a request's headers are passed over on their first bytes.
    pub fn gateway_owned(&self) -> impl Iterator<Item = &'static str> + '_ {
        let mut present = 0u32;
        for (k, _) in &self.pairs {
            if k.starts_with("x-") {
                if let Some(i) = GATEWAY_OWNED.iter().position(|name| k.as_ref() == *name) {
                    present |= 1 << i;
                }
            }
        }
        GATEWAY_OWNED
            .into_iter()
            .enumerate()
            .filter(move |(i, _)| present & (1 << i) != 0)
            .map(|(_, name)| name)
    }
}

/// The bit of [`HeaderMap::lengths`] for `name`.
fn length_bit(name: &str) -> u64 {
    1 << (name.len() % 64)
}

/// Test helpers: header maps in the proxy-wasm pair encoding.
#[cfg(test)]
pub mod testing {
    use super::HeaderMap;

    /// `pairs` in the proxy-wasm header-map encoding.
    pub fn encode(pairs: &[(&str, &str)]) -> Vec<u8> {
        let mut out = (pairs.len() as u32).to_le_bytes().to_vec();
        for (k, v) in pairs {
            out.extend((k.len() as u32).to_le_bytes());
            out.extend((v.len() as u32).to_le_bytes());
        }
        for (k, v) in pairs {
            out.extend(k.as_bytes());
            out.push(0);
            out.extend(v.as_bytes());
            out.push(0);
        }
        out
    }

    /// A [`HeaderMap`] of `pairs`.
    pub fn map(pairs: &[(&str, &str)]) -> HeaderMap<'static> {
        HeaderMap::decode(Box::leak(encode(pairs).into_boxed_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    use super::testing::{encode, map};

    #[wasm_bindgen_test(unsupported = test)]
    fn reads_the_hosts_encoding() {
        let h = map(&[
            (":path", "/v1/completions"),
            ("x-gateway-inference-objective", "critical"),
            ("x-a", ""),
            ("x-a", "second"),
        ]);
        assert_eq!(h.get(":path"), Some("/v1/completions"));
        assert_eq!(
            h.get("x-a"),
            Some(""),
            "the first value, as the host's lookup"
        );
        assert_eq!(h.get("x-missing"), None);
        assert_eq!(h.first(&OBJECTIVE), Some("critical"));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_value_that_is_not_utf8_is_read_with_replacement_characters() {
        let mut bytes = encode(&[("x-gateway-inference-fairness-id", "ab")]);
        // The value's first byte made invalid UTF-8.
        let at = bytes.len() - 3;
        bytes[at] = 0xff;
        let h = HeaderMap::decode(&bytes);
        assert_eq!(h.get("x-gateway-inference-fairness-id"), Some("\u{fffd}b"));
        // The others around it read as they are.
        let mut bytes = encode(&[("a", "é"), ("x-tenant", "ab"), ("z", "ü")]);
        let at = bytes.len() - 8;
        assert_eq!(bytes[at], b'a');
        bytes[at] = 0xff;
        let h = HeaderMap::decode(&bytes);
        assert_eq!(
            (h.get("a"), h.get("x-tenant"), h.get("z")),
            (Some("é"), Some("\u{fffd}b"), Some("ü"))
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_first_generation_present_wins_and_an_empty_value_is_none() {
        let both = map(&[
            ("x-llm-d-inference-fairness-id", "router"),
            ("x-gateway-inference-fairness-id", "gie"),
        ]);
        assert_eq!(both.first(&FAIRNESS_ID), Some("gie"));
        let router = map(&[("x-llm-d-inference-fairness-id", "r")]);
        assert_eq!(router.first(&FAIRNESS_ID), Some("r"));
        let empty = map(&[
            ("x-gateway-inference-fairness-id", ""),
            ("x-llm-d-inference-fairness-id", "r"),
        ]);
        assert_eq!(empty.first(&FAIRNESS_ID), None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn lists_the_gateway_owned_headers_a_client_sent() {
        let h = map(&[
            ("x-llm-d-model-name-rewrite", "m"),
            ("x-gateway-destination-endpoint", "10.0.0.1:80"),
            ("content-type", "application/json"),
            ("x-gateway-destination-endpoint", "10.0.0.2:80"),
            ("x-request-id", "r"),
        ]);
        let owned: Vec<&str> = h.gateway_owned().collect();
        assert_eq!(
            owned,
            vec![DESTINATION, MODEL_REWRITE[1]],
            "each once, in order"
        );
        assert_eq!(map(&[(":path", "/")]).gateway_owned().count(), 0);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn names_of_the_same_length_are_told_apart() {
        let long = "x".repeat(65);
        let h = map(&[("content-type", "a"), (&long, "b"), ("y", "c")]);
        assert_eq!(h.get("x-request-id"), None, "12 bytes, as content-type");
        assert_eq!(h.get("content-type"), Some("a"));
        assert_eq!(h.get(&long), Some("b"));
        assert_eq!(h.get("x"), None, "1 byte, 65 modulo 64");
        assert_eq!(h.get("y"), Some("c"));
        assert_eq!(h.get("x-slo-ttft-ms"), None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_malformed_buffer_gives_what_it_holds_and_never_panics() {
        let good = encode(&[("a", "1"), ("b", "2")]);
        assert_eq!(
            HeaderMap::decode(&good[..good.len() - 2]).get("a"),
            Some("1")
        );
        assert_eq!(HeaderMap::decode(&[]).get("a"), None);
        assert_eq!(HeaderMap::decode(&[255, 255, 255, 255]).get("a"), None);
    }
}
