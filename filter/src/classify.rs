//! The trust boundary: what a request's headers are believed to say.
//!
//! * Its flow ([`classify`]): its fairness id and objective, read from the source
//!   `pool.classification` trusts (`crate::config::classification`), with the defaults
//!   and the objective allow-list applied. The proxy reads the headers once and hands in
//!   a property reader; it is called only for a `metadata` / `filterState` source, so
//!   the default (`client`) costs no host call.
//! * The other headers that change what the gateway does ([`steering`]): the model
//!   rewrite, the subset hint, the SLO and profile-selection headers and the session
//!   token, each only where `pool.trustHeaders` obeys it (`crate::config::trust`).

use crate::config::{Claim, Classification, Source, TrustHeaders};
use crate::headers::{
    HeaderMap, FAIRNESS_ID, MODEL_REWRITE, OBJECTIVE, PREDICTION_BASED, PREDICTION_BASED_OFF,
    SESSION_TOKEN, SLO_TPOT, SLO_TTFT, SUBSET,
};

/// Longest fairness id or objective kept, in bytes: a longer value is cut (at a
/// character boundary), so a client cannot make the shared records and metric labels
/// hold arbitrarily long keys.
pub const MAX_VALUE_BYTES: usize = 128;

/// What a request is classified as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classified {
    /// The tenant (flow) for fairness.
    pub fairness_id: String,
    /// The objective (its priority from `pool.objectives`), if any.
    pub objective: Option<String>,
    /// The request claimed an objective outside the allow-list (the default was used).
    pub refused_objective: bool,
}

fn cut(s: &str) -> &str {
    if s.len() <= MAX_VALUE_BYTES {
        return s;
    }
    let mut end = MAX_VALUE_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or_default()
}

fn read(
    claim: &Claim,
    client: &[&str],
    headers: &HeaderMap,
    property: &mut dyn FnMut(&[String]) -> Option<String>,
) -> Option<String> {
    match &claim.source {
        Source::Client => headers.first(client).map(|v| cut(v).to_string()),
        Source::Ignore => None,
        Source::Header(name) => headers
            .get(name)
            .filter(|v| !v.is_empty())
            .map(|v| cut(v).to_string()),
        Source::Property(path) => property(path)
            .filter(|v| !v.is_empty())
            .map(|v| cut(&v).to_string()),
    }
}

/// Classifies a request from its headers and, for property sources, `property`
/// (a host property read: `None` when absent or not a string).
pub fn classify(
    c: &Classification,
    headers: &HeaderMap,
    property: &mut dyn FnMut(&[String]) -> Option<String>,
) -> Classified {
    let fairness_id = read(&c.fairness_id, &FAIRNESS_ID, headers, property)
        .or_else(|| c.fairness_id.default.clone())
        .unwrap_or_default();
    let claimed = read(&c.objective, &OBJECTIVE, headers, property);
    let allowed = |o: &String| {
        c.allowed_objectives
            .as_ref()
            .is_none_or(|list| list.iter().any(|a| a == o))
    };
    let refused_objective = claimed.as_ref().is_some_and(|o| !allowed(o));
    let objective = claimed
        .filter(|o| allowed(o))
        .or_else(|| c.objective.default.clone());
    Classified {
        fairness_id,
        objective,
        refused_objective,
    }
}

/// Longest session token obeyed, in bytes: a token names one endpoint (`ip:port` in
/// base64), so a longer one is not the gateway's and is ignored.
pub const MAX_SESSION_TOKEN_BYTES: usize = 256;

/// The headers that steer a request, as far as they are obeyed (`None`: absent, empty, or
/// not trusted). Values borrow the header map; the caller parses them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Steering<'a> {
    /// The model to send the request as (`x-gateway-model-name-rewrite`, then `x-llm-d-`).
    pub model_rewrite: Option<&'a str>,
    /// The endpoints the pick is narrowed to (`x-gateway-destination-endpoint-subset`).
    pub subset: Option<&'a str>,
    /// The TTFT SLO in ms (`x-slo-ttft-ms`, then `x-llm-d-`).
    pub slo_ttft: Option<&'a str>,
    /// The TPOT SLO in ms (`x-slo-tpot-ms`, then `x-llm-d-`).
    pub slo_tpot: Option<&'a str>,
    /// `x-prediction-based-scheduling`.
    pub prediction_based: Option<&'a str>,
    /// `x-prediction-based-scheduling-off`.
    pub prediction_based_off: Option<&'a str>,
    /// `x-session-token`, at most [`MAX_SESSION_TOKEN_BYTES`].
    pub session_token: Option<&'a str>,
}

/// The steering headers of a request that `trust` obeys.
pub fn steering<'a>(trust: &TrustHeaders, headers: &'a HeaderMap<'_>) -> Steering<'a> {
    let when = |on: bool, v: Option<&'a str>| v.filter(|_| on);
    Steering {
        model_rewrite: when(trust.model_rewrite, headers.first(&MODEL_REWRITE)),
        subset: when(trust.subset, headers.get(SUBSET)),
        slo_ttft: when(trust.slo, headers.first(&SLO_TTFT)),
        slo_tpot: when(trust.slo, headers.first(&SLO_TPOT)),
        prediction_based: when(trust.profile, headers.get(PREDICTION_BASED)),
        prediction_based_off: when(trust.profile, headers.get(PREDICTION_BASED_OFF)),
        session_token: when(trust.session_token, headers.first(&[SESSION_TOKEN]))
            .filter(|t| t.len() <= MAX_SESSION_TOKEN_BYTES),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::pool::parse_pool;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    use crate::headers::testing::map as headers;

    fn classification(c: serde_json::Value) -> Classification {
        parse_pool(&json!({
            "objectives": [{"name": "premium", "priority": 100}, {"name": "standard"}],
            "classification": c
        }))
        .unwrap()
        .classification
    }

    const SPOOF: &[(&str, &str)] = &[
        ("x-gateway-inference-fairness-id", "someone-else"),
        ("x-gateway-inference-objective", "premium"),
        ("x-tenant", "acme"),
        ("x-tier", "standard"),
    ];

    fn no_property(_: &[String]) -> Option<String> {
        panic!("a header source must not read a property")
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn client_mode_trusts_the_gateway_headers_as_the_reference_does() {
        let c = classify(
            &Classification::default(),
            &headers(SPOOF),
            &mut no_property,
        );
        assert_eq!(c.fairness_id, "someone-else");
        assert_eq!(c.objective.as_deref(), Some("premium"));
        let none = classify(&Classification::default(), &headers(&[]), &mut no_property);
        assert_eq!(none.fairness_id, "default-flow");
        assert_eq!(none.objective, None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn ignore_mode_gives_the_defaults_whatever_the_client_sends() {
        let c = classification(json!({
            "fairnessId": {"from": "none", "default": "shared"},
            "objective": {"from": "none", "default": "standard"}
        }));
        let got = classify(&c, &headers(SPOOF), &mut no_property);
        assert_eq!(got.fairness_id, "shared");
        assert_eq!(got.objective.as_deref(), Some("standard"));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn header_mode_reads_only_the_named_header() {
        let c = classification(json!({
            "fairnessId": {"from": "header", "header": "x-tenant"},
            "objective": {"from": "header", "header": "x-tier"}
        }));
        let got = classify(&c, &headers(SPOOF), &mut no_property);
        assert_eq!(got.fairness_id, "acme");
        assert_eq!(got.objective.as_deref(), Some("standard"));
        let absent = classify(
            &c,
            &headers(&[("x-gateway-inference-objective", "premium")]),
            &mut no_property,
        );
        assert_eq!(absent.fairness_id, "default-flow");
        assert_eq!(absent.objective, None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn property_sources_read_the_path_and_fall_back_to_the_default() {
        let c = classification(json!({
            "fairnessId": {"from": "metadata", "metadata": {"namespace": "jwt", "path": ["payload", "sub"]}},
            "objective": {"from": "filterState", "filterState": "tier", "default": "standard"}
        }));
        let mut asked = Vec::new();
        let got = classify(&c, &headers(SPOOF), &mut |p: &[String]| {
            asked.push(p.join("."));
            (p.last().map(String::as_str) == Some("sub")).then(|| "alice".to_string())
        });
        assert_eq!(got.fairness_id, "alice");
        assert_eq!(got.objective.as_deref(), Some("standard"));
        assert_eq!(
            asked,
            [
                "metadata.filter_metadata.jwt.payload.sub",
                "filter_state.tier"
            ]
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn an_objective_outside_the_allow_list_gets_the_default() {
        let c = classification(json!({
            "objective": {"default": "standard", "allowed": ["standard"]}
        }));
        let got = classify(&c, &headers(SPOOF), &mut no_property);
        assert_eq!(got.objective.as_deref(), Some("standard"));
        assert!(got.refused_objective);
        let ok = classify(
            &c,
            &headers(&[("x-gateway-inference-objective", "standard")]),
            &mut no_property,
        );
        assert_eq!(ok.objective.as_deref(), Some("standard"));
        assert!(!ok.refused_objective);
        // Without a default, a refused objective is no objective (priority 0).
        let c = classification(json!({"objective": {"allowed": ["standard"]}}));
        let got = classify(&c, &headers(SPOOF), &mut no_property);
        assert_eq!(got.objective, None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn long_values_are_cut_at_a_character_boundary() {
        let long = "é".repeat(100); // 200 bytes
        let got = classify(
            &Classification::default(),
            &headers(&[("x-gateway-inference-fairness-id", &long)]),
            &mut no_property,
        );
        assert_eq!(got.fairness_id.len(), MAX_VALUE_BYTES);
        assert!(long.starts_with(&got.fairness_id));
    }

    const STEER: &[(&str, &str)] = &[
        ("x-llm-d-model-name-rewrite", "forbidden-model"),
        ("x-gateway-destination-endpoint-subset", "10.0.0.1:8000"),
        ("x-slo-ttft-ms", "100"),
        ("x-llm-d-slo-tpot-ms", "20"),
        ("x-prediction-based-scheduling", "true"),
        ("x-prediction-based-scheduling-off", "false"),
        ("x-session-token", "MTAuMC4wLjE6ODAwMA=="),
    ];

    #[wasm_bindgen_test(unsupported = test)]
    fn by_default_every_steering_header_is_obeyed_but_the_model_rewrite() {
        let h = headers(STEER);
        let s = steering(&TrustHeaders::default(), &h);
        assert_eq!(
            s.model_rewrite, None,
            "a client cannot choose the model served"
        );
        assert_eq!(s.subset, Some("10.0.0.1:8000"));
        assert_eq!((s.slo_ttft, s.slo_tpot), (Some("100"), Some("20")));
        assert_eq!(
            (s.prediction_based, s.prediction_based_off),
            (Some("true"), Some("false"))
        );
        assert_eq!(s.session_token, Some("MTAuMC4wLjE6ODAwMA=="));
        let all = TrustHeaders {
            model_rewrite: true,
            ..TrustHeaders::default()
        };
        assert_eq!(steering(&all, &h).model_rewrite, Some("forbidden-model"));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn each_switch_turns_its_headers_off() {
        let h = headers(STEER);
        let none = TrustHeaders {
            model_rewrite: false,
            subset: false,
            slo: false,
            profile: false,
            session_token: false,
        };
        assert_eq!(steering(&none, &h), Steering::default());
        let no_slo = TrustHeaders {
            slo: false,
            ..TrustHeaders::default()
        };
        let s = steering(&no_slo, &h);
        assert_eq!((s.slo_ttft, s.slo_tpot), (None, None));
        assert_eq!(s.subset, Some("10.0.0.1:8000"));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn an_oversized_session_token_is_ignored() {
        let long = "A".repeat(MAX_SESSION_TOKEN_BYTES + 1);
        let h = headers(&[("x-session-token", &long)]);
        assert_eq!(steering(&TrustHeaders::default(), &h).session_token, None);
    }
}
