//! `pool.classification`: where a request's fairness id and objective come from — the
//! trust boundary for the two values that grant a share and a priority.
//!
//! ```yaml
//! pool:
//!   objectives: [{name: premium, priority: 100}, {name: standard}]
//!   classification:
//!     fairnessId:
//!       from: metadata                  # client (default) | none | header | metadata | filterState
//!       metadata: {namespace: envoy.filters.http.jwt_authn, path: [payload, sub]}
//!       default: anonymous
//!     objective:
//!       from: header                    # e.g. set by jwt_authn claim_to_headers / ext_authz
//!       header: x-tier
//!       default: standard
//!       allowed: [standard]             # the objectives a request may claim
//! ```
//!
//! * `client` — the gateway's own request headers (`x-gateway-inference-*`, then the
//!   `x-llm-d-*` aliases): any client may set them. The reference's behaviour and the
//!   default.
//! * `none` — ignore every request: always `default`.
//! * `header` — a header an earlier Envoy filter set (`jwt_authn` `claim_to_headers`,
//!   Istio `RequestAuthentication.outputClaimToHeaders`, `ext_authz`).
//! * `metadata` — a string in the stream's dynamic metadata (`namespace`, then `path`
//!   into the `Struct`), e.g. `jwt_authn`'s `payload_in_metadata`.
//! * `filterState` — a filter-state object (its string form), e.g. set by
//!   `set_filter_state`.
//!
//! An absent or empty value gives `default`. An objective outside `allowed` (when given)
//! gives the default objective.

use super::pool::Objective;
use super::validate::{as_array, as_object, as_str, err, join, only_fields, ConfigError};
use serde_json::{Map, Value};

/// The flow of requests without a fairness id.
pub const DEFAULT_FAIRNESS_ID: &str = "default-flow";
/// The values of `from`.
pub const SOURCES: &[&str] = &["client", "none", "header", "metadata", "filterState"];

/// Where one value comes from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Source {
    /// The gateway's request headers, as any client may set them.
    #[default]
    Client,
    /// Never from the request: always the default.
    Ignore,
    /// A request header (lower case) an earlier filter set.
    Header(String),
    /// A host property path (`metadata.filter_metadata.<ns>.<path…>`, or
    /// `filter_state.<key>`), read with one host call per request.
    Property(Vec<String>),
}

/// One classified value: its source and its default.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Claim {
    /// Where it is read.
    pub source: Source,
    /// The value when the source gives none (`None`: no value).
    pub default: Option<String>,
}

/// `pool.classification`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classification {
    /// The fairness id (tenant).
    pub fairness_id: Claim,
    /// The objective (its priority comes from `pool.objectives`).
    pub objective: Claim,
    /// The objectives a request may claim (`None`: any).
    pub allowed_objectives: Option<Vec<String>>,
}

impl Default for Classification {
    fn default() -> Self {
        Self {
            fairness_id: Claim {
                source: Source::Client,
                default: Some(DEFAULT_FAIRNESS_ID.to_string()),
            },
            objective: Claim::default(),
            allowed_objectives: None,
        }
    }
}

impl Classification {
    /// Whether any value is read from a host property (a host call per request).
    pub fn reads_properties(&self) -> bool {
        [&self.fairness_id, &self.objective]
            .iter()
            .any(|c| matches!(c.source, Source::Property(_)))
    }
}

/// Parses `pool.classification`; `objectives` are the pool's declared objectives (the
/// objective's default and allow-list must name them).
pub fn parse_classification(
    v: &Value,
    objectives: &[Objective],
) -> Result<Classification, ConfigError> {
    let path = "pool.classification";
    let o = as_object(v, path)?;
    only_fields(o, path, &["fairnessId", "objective"])?;
    let mut c = Classification::default();
    if let Some(f) = o.get("fairnessId") {
        let p = join(path, "fairnessId");
        let fo = as_object(f, &p)?;
        only_fields(
            fo,
            &p,
            &["from", "header", "metadata", "filterState", "default"],
        )?;
        c.fairness_id = parse_claim(fo, &p, Some(DEFAULT_FAIRNESS_ID))?;
    }
    if let Some(f) = o.get("objective") {
        let p = join(path, "objective");
        let fo = as_object(f, &p)?;
        only_fields(
            fo,
            &p,
            &[
                "from",
                "header",
                "metadata",
                "filterState",
                "default",
                "allowed",
            ],
        )?;
        c.objective = parse_claim(fo, &p, None)?;
        let declared = |name: &str, at: &str| -> Result<(), ConfigError> {
            if objectives.iter().any(|x| x.name == name) {
                return Ok(());
            }
            let known: Vec<&str> = objectives.iter().map(|x| x.name.as_str()).collect();
            Err(err(
                at,
                format!(
                    "`{name}` is not an objective of pool.objectives (declared: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            ))
        };
        if let Some(d) = &c.objective.default {
            declared(d, &join(&p, "default"))?;
        }
        if let Some(list) = fo.get("allowed") {
            let ap = join(&p, "allowed");
            let mut allowed: Vec<String> = Vec::new();
            for (i, item) in as_array(list, &ap)?.iter().enumerate() {
                let ip = format!("{ap}[{i}]");
                let name = as_str(item, &ip)?;
                declared(name, &ip)?;
                if allowed.iter().any(|a| a == name) {
                    return Err(err(&ip, format!("duplicate objective `{name}`")));
                }
                allowed.push(name.to_string());
            }
            c.allowed_objectives = Some(allowed);
        }
    }
    Ok(c)
}

fn non_empty<'a>(v: &'a Value, path: &str) -> Result<&'a str, ConfigError> {
    let s = as_str(v, path)?;
    if s.is_empty() {
        return Err(err(path, "must not be empty"));
    }
    Ok(s)
}

fn parse_claim(
    o: &Map<String, Value>,
    path: &str,
    default: Option<&str>,
) -> Result<Claim, ConfigError> {
    let from = match o.get("from") {
        Some(v) => as_str(v, &join(path, "from"))?,
        None => "client",
    };
    if !SOURCES.contains(&from) {
        return Err(err(
            &join(path, "from"),
            format!(
                "unknown source `{from}`; expected one of: {}",
                SOURCES.join(", ")
            ),
        ));
    }
    // The field each source needs; any other source field is a mistake.
    let needs = match from {
        "header" => Some("header"),
        "metadata" => Some("metadata"),
        "filterState" => Some("filterState"),
        _ => None,
    };
    for field in ["header", "metadata", "filterState"] {
        if o.contains_key(field) && needs != Some(field) {
            return Err(err(
                &join(path, field),
                format!("is read only with `from: {field}` (from is `{from}`)"),
            ));
        }
    }
    if let Some(field) = needs {
        if !o.contains_key(field) {
            return Err(err(
                &join(path, field),
                format!("missing: `from: {from}` needs it"),
            ));
        }
    }
    let source = match from {
        "none" => Source::Ignore,
        "header" => {
            let hp = join(path, "header");
            let name = non_empty(o.get("header").unwrap_or(&Value::Null), &hp)?;
            if !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                return Err(err(&hp, format!("`{name}` is not a header name")));
            }
            Source::Header(name.to_ascii_lowercase())
        }
        "metadata" => {
            let mp = join(path, "metadata");
            let m = as_object(o.get("metadata").unwrap_or(&Value::Null), &mp)?;
            only_fields(m, &mp, &["namespace", "path"])?;
            let np = join(&mp, "namespace");
            let namespace = non_empty(m.get("namespace").unwrap_or(&Value::Null), &np)?;
            let pp = join(&mp, "path");
            let keys = as_array(m.get("path").unwrap_or(&Value::Null), &pp)?;
            if keys.is_empty() {
                return Err(err(&pp, "must name at least one key"));
            }
            let mut property = vec![
                "metadata".to_string(),
                "filter_metadata".to_string(),
                namespace.to_string(),
            ];
            for (i, k) in keys.iter().enumerate() {
                property.push(non_empty(k, &format!("{pp}[{i}]"))?.to_string());
            }
            Source::Property(property)
        }
        "filterState" => {
            let fp = join(path, "filterState");
            let key = non_empty(o.get("filterState").unwrap_or(&Value::Null), &fp)?;
            Source::Property(vec!["filter_state".to_string(), key.to_string()])
        }
        _ => Source::Client,
    };
    let default = match o.get("default") {
        None | Some(Value::Null) => default.map(str::to_string),
        Some(v) => Some(non_empty(v, &join(path, "default"))?.to_string()),
    };
    Ok(Claim { source, default })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn objectives() -> Vec<Objective> {
        ["premium", "standard"]
            .iter()
            .map(|n| Objective {
                name: n.to_string(),
                priority: 0,
            })
            .collect()
    }

    fn parse(v: Value) -> Result<Classification, ConfigError> {
        parse_classification(&v, &objectives())
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn every_source_is_read() {
        let c = parse(json!({
            "fairnessId": {
                "from": "metadata",
                "metadata": {"namespace": "envoy.filters.http.jwt_authn", "path": ["payload", "sub"]},
                "default": "anonymous"
            },
            "objective": {"from": "header", "header": "X-Tier", "default": "standard", "allowed": ["standard"]}
        }))
        .unwrap();
        assert_eq!(
            c.fairness_id.source,
            Source::Property(
                [
                    "metadata",
                    "filter_metadata",
                    "envoy.filters.http.jwt_authn",
                    "payload",
                    "sub"
                ]
                .map(String::from)
                .to_vec()
            )
        );
        assert_eq!(c.fairness_id.default.as_deref(), Some("anonymous"));
        assert_eq!(c.objective.source, Source::Header("x-tier".into()));
        assert_eq!(c.objective.default.as_deref(), Some("standard"));
        assert_eq!(c.allowed_objectives, Some(vec!["standard".to_string()]));
        assert!(c.reads_properties());
        let fs = parse(json!({"objective": {"from": "filterState", "filterState": "tier"}}));
        assert_eq!(
            fs.unwrap().objective.source,
            Source::Property(vec!["filter_state".into(), "tier".into()])
        );
        let none = parse(json!({"fairnessId": {"from": "none"}})).unwrap();
        assert_eq!(none.fairness_id.source, Source::Ignore);
        assert_eq!(
            none.fairness_id.default.as_deref(),
            Some(DEFAULT_FAIRNESS_ID)
        );
        assert!(!none.reads_properties());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn mistakes_name_the_field() {
        let cases = [
            (json!({"tenant": {}}), "pool.classification.tenant"),
            (
                json!({"objective": {"from": "jwt"}}),
                "pool.classification.objective.from",
            ),
            (
                json!({"objective": {"from": "header"}}),
                "pool.classification.objective.header",
            ),
            (
                json!({"objective": {"from": "client", "header": "x-a"}}),
                "pool.classification.objective.header",
            ),
            (
                json!({"fairnessId": {"from": "header", "header": "x a"}}),
                "pool.classification.fairnessId.header",
            ),
            (
                json!({"fairnessId": {"from": "metadata", "metadata": {"namespace": "n", "path": []}}}),
                "pool.classification.fairnessId.metadata.path",
            ),
            (
                json!({"fairnessId": {"from": "metadata", "metadata": {"path": ["a"]}}}),
                "pool.classification.fairnessId.metadata.namespace",
            ),
            (
                json!({"fairnessId": {"default": ""}}),
                "pool.classification.fairnessId.default",
            ),
            (
                json!({"fairnessId": {"allowed": ["a"]}}),
                "pool.classification.fairnessId.allowed",
            ),
            (
                json!({"objective": {"default": "gold"}}),
                "pool.classification.objective.default",
            ),
            (
                json!({"objective": {"allowed": ["standard", "gold"]}}),
                "pool.classification.objective.allowed[1]",
            ),
            (
                json!({"objective": {"allowed": ["standard", "standard"]}}),
                "pool.classification.objective.allowed[1]",
            ),
        ];
        for (doc, path) in cases {
            let e = parse(doc.clone()).unwrap_err();
            assert_eq!(e.path, path, "{doc}: {e}");
        }
        let e = parse(json!({"objective": {"default": "gold"}})).unwrap_err();
        assert!(e.reason.contains("premium, standard"), "{e}");
    }
}
