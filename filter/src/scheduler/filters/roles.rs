//! P/D role filters on label `llm-d.ai/role` (router `filter/bylabel/roles.go`):
//!
//! | filter | keeps |
//! |---|---|
//! | `decode-endpoints-filter` (`decode-filter`) | decode, prefill-decode, both, encode-prefill-decode, and endpoints **without** the label |
//! | `prefill-endpoints-filter` (`prefill-filter`) | prefill, encode-prefill, prefill-decode, both, encode-prefill-decode |
//! | `encode-filter` | encode, encode-prefill, encode-prefill-decode |

use crate::config::{ConfigError, Params};
use crate::rng::Rng;
use crate::scheduler::handlers::pd::ROLE_LABEL;
use crate::scheduler::{Cycle, Filter};
use serde_json::Value;

/// Type names in `EndpointPickerConfig`: the prefill filter and its short name.
pub const PREFILL_TYPES: [&str; 2] = ["prefill-endpoints-filter", "prefill-filter"];
/// Type names in `EndpointPickerConfig`: the decode filter and its short name.
pub const DECODE_TYPES: [&str; 2] = ["decode-endpoints-filter", "decode-filter"];
/// Type name of the encode filter (llm-d-router's E/P/D).
pub const ENCODE_TYPE: &str = "encode-filter";

/// Which role a filter keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Prefill-capable endpoints.
    Prefill,
    /// Decode-capable endpoints (and unlabelled ones).
    Decode,
    /// Encode-capable endpoints (multimodal encoders).
    Encode,
}

impl Role {
    /// Whether an endpoint with role label `value` (`None`: no label) is kept.
    pub fn accepts(self, value: Option<&str>) -> bool {
        match (self, value) {
            (Role::Decode, None) => true,
            (Role::Prefill | Role::Encode, None) => false,
            (Role::Encode, Some(v)) => {
                matches!(v, "encode" | "encode-prefill" | "encode-prefill-decode")
            }
            (Role::Decode, Some(v)) => matches!(
                v,
                "decode" | "prefill-decode" | "both" | "encode-prefill-decode" | "encode-decode"
            ),
            (Role::Prefill, Some(v)) => matches!(
                v,
                "prefill" | "encode-prefill" | "prefill-decode" | "both" | "encode-prefill-decode"
            ),
        }
    }
}

/// A role filter.
#[derive(Debug)]
pub struct RoleFilter {
    /// The role kept.
    pub role: Role,
}

impl Filter for RoleFilter {
    fn filter(&self, cx: &Cycle<'_>, endpoints: Vec<usize>, _rng: &mut Rng) -> Vec<usize> {
        endpoints
            .into_iter()
            .filter(|&i| {
                cx.candidate(i).is_some_and(|c| {
                    self.role
                        .accepts(c.labels.get(ROLE_LABEL).map(String::as_str))
                })
            })
            .collect()
    }
}

impl RoleFilter {
    /// Builds the filter keeping `role` from its `parameters` (it takes none).
    pub fn from_parameters(role: Role, v: &Value, path: &str) -> Result<Self, ConfigError> {
        Params::new(Some(v), path, &[])?;
        Ok(Self { role })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn role_labels_as_the_router() {
        let mut c = candidates(&[(0, 0, 0.0); 4]);
        for (i, role) in ["prefill", "decode", "both"].iter().enumerate() {
            c[i].labels.insert(ROLE_LABEL.into(), role.to_string());
        }
        let mut rng = Rng::new(0);
        let decode = RoleFilter { role: Role::Decode };
        let prefill = RoleFilter {
            role: Role::Prefill,
        };
        assert_eq!(
            with_cycle(&c, &[], |cx| decode.filter(cx, all(&c), &mut rng)),
            vec![1, 2, 3]
        );
        assert_eq!(
            with_cycle(&c, &[], |cx| prefill.filter(cx, all(&c), &mut rng)),
            vec![0, 2]
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_encode_filter_keeps_encoders_only() {
        let mut c = candidates(&[(0, 0, 0.0); 5]);
        for (i, role) in ["encode", "encode-prefill", "decode", "prefill"]
            .iter()
            .enumerate()
        {
            c[i].labels.insert(ROLE_LABEL.into(), role.to_string());
        }
        let mut rng = Rng::new(0);
        let encode = RoleFilter { role: Role::Encode };
        assert_eq!(
            with_cycle(&c, &[], |cx| encode.filter(cx, all(&c), &mut rng)),
            vec![0, 1]
        );
        assert!(!Role::Encode.accepts(None));
        assert!(Role::Encode.accepts(Some("encode-prefill-decode")));
    }
}
