//! The `flowControl` section of `EndpointPickerConfig`, validated, with the reference's
//! defaults: no global limits, no TTL, 1,000,000,000 bytes per band, no per-band count
//! limit, `global-strict-fairness-policy` and `fcfs-ordering-policy`.

use super::fairness::program_aware::Las;
use super::fairness::FairnessPolicy;
use super::ordering::OrderingPolicy;
use super::usage_limit::{UsageLimit, SOFT_REFLECTIVE_CEILING_POLICY};
use crate::config::epp::quantity as read_quantity;
use crate::config::quantity::parse_duration_ms;
use crate::config::ConfigError;
use serde_json::{Map, Value};

/// Default per-band byte limit (`defaultPriorityBandMaxBytes`).
pub const DEFAULT_BAND_MAX_BYTES: u64 = 1_000_000_000;
/// Type of the always-available usage-limit policy.
pub const STATIC_USAGE_LIMIT_POLICY: &str = "static-usage-limit-policy";

/// One priority band's limits and policies.
#[derive(Debug, Clone, PartialEq)]
pub struct Band {
    /// Priority; higher is served first; negative is sheddable.
    pub priority: i32,
    /// Bytes of queued request bodies allowed in this band.
    pub max_bytes: u64,
    /// Queued requests allowed in this band; 0 = no limit.
    pub max_requests: u64,
    /// Tier 2 policy.
    pub fairness: FairnessPolicy,
    /// Tier 3 policy.
    pub ordering: OrderingPolicy,
}

/// The validated `flowControl` section.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowControlConfig {
    /// Global byte limit on queued requests; 0 = none.
    pub max_bytes: u64,
    /// Global count limit on queued requests; 0 = none.
    pub max_requests: u64,
    /// Queue TTL (ms) while the pool has endpoints; 0 = wait until the client goes away.
    pub default_ttl_ms: u64,
    /// Queue TTL (ms) while the pool has no endpoint (`noEndpointRequestTTL`); `None`
    /// follows `default_ttl_ms`.
    pub no_endpoint_ttl_ms: Option<u64>,
    /// Template for priorities without an explicit band.
    pub default_band: Band,
    /// Explicit bands, highest priority first.
    pub bands: Vec<Band>,
    /// Saturation at or above which a band stops dispatching (static usage-limit threshold).
    pub ceiling: f64,
    /// The usage-limit policy (`Static(ceiling)` unless the soft policy is named).
    pub usage_limit: UsageLimit,
}

impl FlowControlConfig {
    /// The queue-wait budgets of the two regimes.
    pub fn budgets(&self) -> super::ttl::Budgets {
        super::ttl::Budgets {
            with_endpoints_ms: self.default_ttl_ms,
            without_endpoints_ms: self.no_endpoint_ttl_ms.unwrap_or(self.default_ttl_ms),
        }
    }
}

impl Default for FlowControlConfig {
    fn default() -> Self {
        Self {
            max_bytes: 0,
            max_requests: 0,
            default_ttl_ms: 0,
            no_endpoint_ttl_ms: None,
            default_band: Band {
                priority: 0,
                max_bytes: DEFAULT_BAND_MAX_BYTES,
                max_requests: 0,
                fairness: FairnessPolicy::GlobalStrict,
                ordering: OrderingPolicy::Fcfs,
            },
            bands: Vec::new(),
            ceiling: 1.0,
            usage_limit: UsageLimit::Static(1.0),
        }
    }
}

/// A declared plugin, as the flow-control section can reference it.
pub struct PluginRef<'a> {
    /// Its type.
    pub type_name: &'a str,
    /// Its parameters.
    pub parameters: &'a Value,
}

impl FlowControlConfig {
    /// The band of `priority`: the explicit one, or the template with that priority.
    pub fn band(&self, priority: i32) -> Band {
        self.bands
            .iter()
            .find(|b| b.priority == priority)
            .cloned()
            .unwrap_or_else(|| Band {
                priority,
                ..self.default_band.clone()
            })
    }

    /// Parses the section at `path`. `plugin(name)` finds a declared plugin by name;
    /// the default policies are available under their type names without declaring them.
    pub fn parse<'a>(
        section: &Value,
        path: &str,
        plugin: impl Fn(&str) -> Option<PluginRef<'a>>,
    ) -> Result<Self, ConfigError> {
        let err = |field: &str, reason: String| ConfigError {
            path: format!("{path}.{field}"),
            reason,
        };
        let obj = match section {
            Value::Null => return Ok(Self::default()),
            Value::Object(o) => o,
            _ => {
                return Err(ConfigError {
                    path: path.into(),
                    reason: "must be an object".into(),
                })
            }
        };
        only(
            obj,
            path,
            &[
                "maxBytes",
                "maxRequests",
                "defaultRequestTTL",
                "noEndpointRequestTTL",
                "defaultPriorityBand",
                "priorityBands",
                "usageLimitPolicyPluginRef",
                // Read with the top-level `saturationDetector` (crate::config).
                "saturationDetector",
            ],
        )?;
        let mut c = Self {
            max_bytes: q(obj, "maxBytes", path)?.unwrap_or(0),
            max_requests: q(obj, "maxRequests", path)?.unwrap_or(0),
            ..Self::default()
        };
        let duration = |field: &str| -> Result<Option<u64>, ConfigError> {
            let Some(v) = obj.get(field) else {
                return Ok(None);
            };
            let s = v
                .as_str()
                .ok_or_else(|| err(field, "must be a duration string such as \"30s\"".into()))?;
            parse_duration_ms(s).map(Some).map_err(|r| err(field, r))
        };
        if let Some(ms) = duration("defaultRequestTTL")? {
            c.default_ttl_ms = ms;
        }
        c.no_endpoint_ttl_ms = duration("noEndpointRequestTTL")?;
        if let Some(v) = obj.get("defaultPriorityBand") {
            c.default_band = parse_band(v, &format!("{path}.defaultPriorityBand"), false, &plugin)?;
        }
        if let Some(v) = obj.get("priorityBands") {
            let list = v
                .as_array()
                .ok_or_else(|| err("priorityBands", "must be a list".into()))?;
            for (i, b) in list.iter().enumerate() {
                let bpath = format!("{path}.priorityBands[{i}]");
                let band = parse_band(b, &bpath, true, &plugin)?;
                if c.bands.iter().any(|x| x.priority == band.priority) {
                    return Err(ConfigError {
                        path: format!("{bpath}.priority"),
                        reason: format!("duplicate priority {}", band.priority),
                    });
                }
                c.bands.push(band);
            }
            c.bands.sort_by_key(|b| std::cmp::Reverse(b.priority));
        }
        if let Some(v) = obj.get("usageLimitPolicyPluginRef") {
            let name = v
                .as_str()
                .ok_or_else(|| err("usageLimitPolicyPluginRef", "must be a plugin name".into()))?;
            let (type_name, params) = match plugin(name) {
                Some(p) => (p.type_name, Some(p.parameters)),
                None if name == STATIC_USAGE_LIMIT_POLICY => (STATIC_USAGE_LIMIT_POLICY, None),
                None => {
                    return Err(err(
                        "usageLimitPolicyPluginRef",
                        format!("no plugin named \"{name}\" is declared"),
                    ))
                }
            };
            if type_name == SOFT_REFLECTIVE_CEILING_POLICY {
                c.usage_limit = UsageLimit::SoftReflective;
                return Ok(c);
            }
            if type_name != STATIC_USAGE_LIMIT_POLICY {
                return Err(err(
                    "usageLimitPolicyPluginRef",
                    format!("\"{name}\" is a {type_name}, not a usage-limit policy ({STATIC_USAGE_LIMIT_POLICY}, {SOFT_REFLECTIVE_CEILING_POLICY})"),
                ));
            }
            if let Some(t) = params.and_then(|p| p.get("threshold")) {
                c.ceiling = t.as_f64().filter(|t| *t > 0.0).ok_or_else(|| {
                    err(
                        "usageLimitPolicyPluginRef",
                        format!("plugin \"{name}\": threshold must be a positive number"),
                    )
                })?;
            }
            c.usage_limit = UsageLimit::Static(c.ceiling);
        }
        Ok(c)
    }
}

fn only(obj: &Map<String, Value>, path: &str, known: &[&str]) -> Result<(), ConfigError> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(ConfigError {
            path: format!("{path}.{k}"),
            reason: format!("unknown field; expected one of: {}", known.join(", ")),
        }),
        None => Ok(()),
    }
}

fn q(obj: &Map<String, Value>, key: &str, path: &str) -> Result<Option<u64>, ConfigError> {
    obj.get(key)
        .map(|v| read_quantity(Some(v), &format!("{path}.{key}")))
        .transpose()
}

fn parse_band<'a>(
    v: &Value,
    path: &str,
    explicit: bool,
    plugin: &impl Fn(&str) -> Option<PluginRef<'a>>,
) -> Result<Band, ConfigError> {
    let obj = v.as_object().ok_or_else(|| ConfigError {
        path: path.into(),
        reason: "must be an object".into(),
    })?;
    let mut known = vec![
        "maxBytes",
        "maxRequests",
        "fairnessPolicyRef",
        "orderingPolicyRef",
    ];
    if explicit {
        known.push("priority");
    }
    only(obj, path, &known)?;
    let err = |field: &str, reason: String| ConfigError {
        path: format!("{path}.{field}"),
        reason,
    };
    let priority = if explicit {
        let p = obj
            .get("priority")
            .ok_or_else(|| err("priority", "is required".into()))?;
        p.as_i64()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| err("priority", "must be an integer".into()))?
    } else {
        0
    };
    let max_bytes = match q(obj, "maxBytes", path)? {
        None | Some(0) => DEFAULT_BAND_MAX_BYTES,
        Some(n) => n,
    };
    let max_requests = q(obj, "maxRequests", path)?.unwrap_or(0);
    let resolve = |field: &str| -> Result<Option<String>, ConfigError> {
        match obj.get(field) {
            None => Ok(None),
            Some(Value::String(name)) => Ok(Some(match plugin(name) {
                Some(p) => p.type_name.to_string(),
                None => name.clone(),
            })),
            Some(_) => Err(err(field, "must be a plugin name".into())),
        }
    };
    let declared = |field: &str| {
        obj.get(field)
            .and_then(Value::as_str)
            .is_some_and(|n| plugin(n).is_some())
    };
    let fairness = match resolve("fairnessPolicyRef")? {
        None => FairnessPolicy::GlobalStrict,
        Some(t) => match FairnessPolicy::from_type(&t) {
            // The default policy needs no declaration; others must be declared.
            Some(FairnessPolicy::GlobalStrict) => FairnessPolicy::GlobalStrict,
            Some(FairnessPolicy::ProgramAware(_)) if declared("fairnessPolicyRef") => {
                let name = obj
                    .get("fairnessPolicyRef")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let params = plugin(name).map_or(&Value::Null, |p| p.parameters);
                FairnessPolicy::ProgramAware(Las::from_parameters(
                    params,
                    &format!("{path}.fairnessPolicyRef({name}).parameters"),
                )?)
            }
            Some(p)
                if obj
                    .get("fairnessPolicyRef")
                    .and_then(Value::as_str)
                    .is_some_and(|n| plugin(n).is_some()) =>
            {
                p
            }
            Some(_) => {
                return Err(err(
                    "fairnessPolicyRef",
                    format!("\"{t}\" must be declared in plugins"),
                ))
            }
            None => {
                return Err(err(
                    "fairnessPolicyRef",
                    format!(
                        "{} \"{t}\"; known types: {}",
                        if declared("fairnessPolicyRef") {
                            "not a fairness policy:"
                        } else {
                            "unknown pluginRef"
                        },
                        FairnessPolicy::TYPES.join(", ")
                    ),
                ))
            }
        },
    };
    let ordering = match resolve("orderingPolicyRef")? {
        None => OrderingPolicy::Fcfs,
        Some(t) => match OrderingPolicy::from_type(&t) {
            Some(OrderingPolicy::Fcfs) => OrderingPolicy::Fcfs,
            Some(p)
                if obj
                    .get("orderingPolicyRef")
                    .and_then(Value::as_str)
                    .is_some_and(|n| plugin(n).is_some()) =>
            {
                p
            }
            Some(_) => {
                return Err(err(
                    "orderingPolicyRef",
                    format!("\"{t}\" must be declared in plugins"),
                ))
            }
            None => {
                return Err(err(
                    "orderingPolicyRef",
                    format!(
                        "{} \"{t}\"; known types: {}",
                        if declared("orderingPolicyRef") {
                            "not an ordering policy:"
                        } else {
                            "unknown pluginRef"
                        },
                        OrderingPolicy::TYPES.join(", ")
                    ),
                ))
            }
        },
    };
    Ok(Band {
        priority,
        max_bytes,
        max_requests,
        fairness,
        ordering,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn declared<'a>(
        plugins: &'a [(&'a str, &'a str, Value)],
    ) -> impl Fn(&str) -> Option<PluginRef<'a>> + 'a {
        move |name| {
            plugins
                .iter()
                .find(|(n, _, _)| *n == name)
                .map(|(_, t, p)| PluginRef {
                    type_name: t,
                    parameters: p,
                })
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_reference_example_parses() {
        let plugins = [
            (
                "round-robin-fairness-policy",
                "round-robin-fairness-policy",
                Value::Null,
            ),
            ("fcfs-ordering-policy", "fcfs-ordering-policy", Value::Null),
        ];
        let section = json!({
            "maxBytes": "10Gi", "maxRequests": "1k", "defaultRequestTTL": "60s",
            "priorityBands": [
                {"priority": 0, "maxRequests": "200", "fairnessPolicyRef": "round-robin-fairness-policy"},
                {"priority": 100, "maxRequests": "500", "fairnessPolicyRef": "round-robin-fairness-policy",
                 "orderingPolicyRef": "fcfs-ordering-policy"},
                {"priority": -10, "maxRequests": "50"}
            ]
        });
        let c = FlowControlConfig::parse(&section, "flowControl", declared(&plugins)).unwrap();
        assert_eq!(c.max_bytes, 10 * 1024 * 1024 * 1024);
        assert_eq!(c.max_requests, 1000);
        assert_eq!(c.default_ttl_ms, 60_000);
        // Without noEndpointRequestTTL both regimes have defaultRequestTTL.
        assert_eq!(c.budgets().without_endpoints_ms, 60_000);
        let mut split = section.clone();
        split["noEndpointRequestTTL"] = json!("5m");
        let c2 = FlowControlConfig::parse(&split, "flowControl", declared(&plugins)).unwrap();
        assert_eq!(
            (
                c2.budgets().with_endpoints_ms,
                c2.budgets().without_endpoints_ms
            ),
            (60_000, 300_000)
        );
        let prios: Vec<i32> = c.bands.iter().map(|b| b.priority).collect();
        assert_eq!(prios, [100, 0, -10], "highest first");
        assert_eq!(c.bands[0].fairness, FairnessPolicy::RoundRobin);
        assert_eq!(c.bands[2].fairness, FairnessPolicy::GlobalStrict);
        assert_eq!(c.bands[2].max_bytes, DEFAULT_BAND_MAX_BYTES);
        // An unlisted priority gets the template.
        let b = c.band(7);
        assert_eq!((b.priority, b.max_requests), (7, 0));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn errors_name_the_field() {
        let none: [(&str, &str, Value); 0] = [];
        let cases = [
            (json!({"maxBytes": "lots"}), "flowControl.maxBytes"),
            (json!({"maxRequests": -1}), "flowControl.maxRequests"),
            (
                json!({"noEndpointRequestTTL": 5}),
                "flowControl.noEndpointRequestTTL",
            ),
            (
                json!({"defaultRequestTTL": "-1s"}),
                "flowControl.defaultRequestTTL",
            ),
            (
                json!({"priorityBands": [{"priority": 1}, {"priority": 1}]}),
                "flowControl.priorityBands[1].priority",
            ),
            (
                json!({"priorityBands": [{"maxRequests": 1}]}),
                "flowControl.priorityBands[0].priority",
            ),
            (
                json!({"priorityBands": [{"priority": 1, "fairnessPolicyRef": "round-robin-fairness-policy"}]}),
                "flowControl.priorityBands[0].fairnessPolicyRef",
            ),
            (
                json!({"priorityBands": [{"priority": 1, "orderingPolicyRef": "lifo"}]}),
                "flowControl.priorityBands[0].orderingPolicyRef",
            ),
            (json!({"maxQueue": 3}), "flowControl.maxQueue"),
        ];
        for (section, path) in cases {
            let e = FlowControlConfig::parse(&section, "flowControl", declared(&none)).unwrap_err();
            assert_eq!(e.path, path, "{section}: {}", e.reason);
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn usage_limit_threshold_sets_the_ceiling() {
        let plugins = [(
            "limit",
            STATIC_USAGE_LIMIT_POLICY,
            json!({"threshold": 0.8}),
        )];
        let c = FlowControlConfig::parse(
            &json!({"usageLimitPolicyPluginRef": "limit"}),
            "fc",
            declared(&plugins),
        )
        .unwrap();
        assert_eq!(c.ceiling, 0.8);
    }
}
