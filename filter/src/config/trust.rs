//! `pool.trustHeaders`: which request headers that change what the gateway does it obeys.
//! (The fairness id and objective have their own, richer switch: `pool.classification`.)
//!
//! ```yaml
//! pool:
//!   trustHeaders:
//!     modelRewrite: false   # x-gateway-model-name-rewrite, x-llm-d-model-name-rewrite
//!     subset: true          # x-gateway-destination-endpoint-subset
//!     slo: true             # x-slo-ttft-ms, x-slo-tpot-ms (and the x-llm-d- names)
//!     profile: true         # x-prediction-based-scheduling, x-prediction-based-scheduling-off
//!     sessionToken: true    # x-session-token
//! ```
//!
//! `true`: the header is obeyed as it reaches the filter (any client may set it, unless an
//! earlier filter or the route sets or removes it on every request). `false`: it is
//! ignored. Either way the gateway's own headers are stripped before upstream. The defaults
//! are the reference's (the llm-d router reads each of these from the request), except the
//! model rewrite: obeyed, it lets any client have the server run another model than the
//! one its body names, past anything that authorizes, meters or bills by that model, and
//! past the weights of `pool.modelRewrites`.

use super::validate::{as_object, err, join, only_fields, ConfigError};
use serde_json::Value;

/// `pool.trustHeaders`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrustHeaders {
    /// Obey the model-rewrite headers.
    pub model_rewrite: bool,
    /// Obey the subset hint.
    pub subset: bool,
    /// Obey the TTFT and TPOT SLO headers.
    pub slo: bool,
    /// Obey the profile-selection headers of `slo-aware-profile-handler`.
    pub profile: bool,
    /// Obey the session token (whichever session plugin reads it).
    pub session_token: bool,
}

impl Default for TrustHeaders {
    fn default() -> Self {
        Self {
            model_rewrite: false,
            subset: true,
            slo: true,
            profile: true,
            session_token: true,
        }
    }
}

/// The fields of `pool.trustHeaders`.
pub const FIELDS: &[&str] = &["modelRewrite", "subset", "slo", "profile", "sessionToken"];

/// Parses `pool.trustHeaders`.
pub fn parse_trust_headers(v: &Value) -> Result<TrustHeaders, ConfigError> {
    let path = "pool.trustHeaders";
    let o = as_object(v, path)?;
    only_fields(o, path, FIELDS)?;
    let mut t = TrustHeaders::default();
    for (field, slot) in [
        ("modelRewrite", &mut t.model_rewrite),
        ("subset", &mut t.subset),
        ("slo", &mut t.slo),
        ("profile", &mut t.profile),
        ("sessionToken", &mut t.session_token),
    ] {
        if let Some(v) = o.get(field) {
            *slot = v
                .as_bool()
                .ok_or_else(|| err(&join(path, field), "must be true or false"))?;
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn the_defaults_obey_what_the_reference_obeys_but_the_rewrite() {
        let t = parse_trust_headers(&json!({})).unwrap();
        assert_eq!(t, TrustHeaders::default());
        assert!(!t.model_rewrite);
        assert!(t.subset && t.slo && t.profile && t.session_token);
        let t = parse_trust_headers(&json!({"modelRewrite": true, "subset": false})).unwrap();
        assert!(t.model_rewrite && !t.subset && t.slo);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_bad_value_is_refused_naming_the_field() {
        let e = parse_trust_headers(&json!({"slo": "yes"})).unwrap_err();
        assert_eq!(e.path, "pool.trustHeaders.slo");
        assert!(e.reason.contains("true or false"), "{e}");
        let e = parse_trust_headers(&json!({"modelrewrite": true})).unwrap_err();
        assert!(e.to_string().contains("modelrewrite"), "{e}");
        assert!(parse_trust_headers(&json!([])).is_err());
    }
}
