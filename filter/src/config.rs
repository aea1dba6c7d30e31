//! The filter's configuration: what Envoy hands `on_configure` as a JSON string.
//!
//! The shape follows the reference's `EndpointPickerConfig` (apiVersion
//! `inference.networking.x-k8s.io/v1alpha1`, kind `EndpointPickerConfig`) plus a
//! `pool` section of our own for what the reference keeps in Kubernetes objects:
//!
//! ```json
//! {
//!   "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
//!   "kind": "EndpointPickerConfig",
//!   "pool": {
//!     "name": "vllm-llama3-8b",
//!     "endpoints": ["10.0.0.1:8000", {"address": "10.0.0.2:8000", "labels": {"role": "decode"}}],
//!     "maxRequestBodyBytes": 4194304
//!   }
//! }
//! ```
//!
//! Validation is strict: an unknown field, a wrong type or a bad value is refused
//! at load time with the field's path and the reason, and the filter never half-loads.

use crate::flow_control::config::{FlowControlConfig, PluginRef};
use crate::flow_control::fairness::FairnessPolicy;
use crate::flow_control::ordering::OrderingPolicy;
use crate::flow_control::saturation::Detector;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;

/// The API version the reference uses for `EndpointPickerConfig`.
pub const API_VERSION: &str = "inference.networking.x-k8s.io/v1alpha1";
/// The kind the reference uses.
pub const KIND: &str = "EndpointPickerConfig";
/// Default request-body limit: 4 MiB, as vLLM's simulator (`max-request-body-size-mb`).
pub const DEFAULT_MAX_REQUEST_BODY_BYTES: usize = 4 * 1024 * 1024;
/// Default pool name, used as the `name` label of pool metrics.
pub const DEFAULT_POOL_NAME: &str = "default-pool";

/// A configuration error: the path of the offending field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// JSON path of the field, e.g. `pool.endpoints[2]`; empty for the document itself.
    pub path: String,
    /// Why the value is refused.
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "invalid configuration: {}", self.reason)
        } else {
            write!(
                f,
                "invalid configuration at `{}`: {}",
                self.path, self.reason
            )
        }
    }
}

impl std::error::Error for ConfigError {}

fn err(path: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        path: path.to_string(),
        reason: reason.into(),
    }
}

/// One model-server endpoint of the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `ip:port`, as written into `x-gateway-destination-endpoint`.
    pub address: String,
    /// Labels (role, zone, ...), used by label filters.
    pub labels: BTreeMap<String, String>,
}

/// The pool of model servers the filter picks from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// Pool name (metric label `name`).
    pub name: String,
    /// Static endpoints, in configuration order.
    pub endpoints: Vec<Endpoint>,
    /// InferenceObjectives of this pool.
    pub objectives: Vec<Objective>,
    /// Largest request body accepted; larger bodies get 413.
    pub max_request_body_bytes: usize,
}

/// An InferenceObjective: a name clients put in `x-gateway-inference-objective`, and its priority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Objective {
    /// The objective's name.
    pub name: String,
    /// Its priority: higher is served first; negative is sheddable.
    pub priority: i32,
}

/// Feature gates the reference registers.
pub const FEATURE_GATES: [&str; 3] = ["dataLayer", "enableLegacyMetrics", "flowControl"];

/// Flow control and admission settings.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FlowSettings {
    /// The `flowControl` feature gate: queue in the gateway. Off: legacy admission
    /// (sheddable requests get 429 while the pool is saturated).
    pub enabled: bool,
    /// The `flowControl` section (read only when enabled).
    pub control: FlowControlConfig,
    /// The saturation detector (`saturationDetector.pluginRef`; default `utilization-detector`).
    pub detector: Detector,
}

/// The whole, validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The model-server pool.
    pub pool: Pool,
    /// Flow control and admission.
    pub flow: FlowSettings,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            pool: Pool {
                name: DEFAULT_POOL_NAME.to_string(),
                endpoints: Vec::new(),
                objectives: Vec::new(),
                max_request_body_bytes: DEFAULT_MAX_REQUEST_BODY_BYTES,
            },
            flow: FlowSettings::default(),
        }
    }
}

impl Pool {
    /// The priority of an objective name; 0 when absent or unknown, as in the reference.
    pub fn priority_of(&self, objective: Option<&str>) -> i32 {
        objective
            .and_then(|name| self.objectives.iter().find(|o| o.name == name))
            .map_or(0, |o| o.priority)
    }
}

impl Config {
    /// Parses and validates the plugin configuration. An empty string means defaults.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        if text.trim().is_empty() {
            return Ok(Config::default());
        }
        let doc: Value =
            serde_json::from_str(text).map_err(|e| err("", format!("not valid JSON: {e}")))?;
        let top = as_object(&doc, "")?;
        only_fields(
            top,
            "",
            &[
                "apiVersion",
                "kind",
                "featureGates",
                "plugins",
                "saturationDetector",
                "flowControl",
                "pool",
            ],
        )?;
        if let Some(v) = top.get("apiVersion") {
            let s = as_str(v, "apiVersion")?;
            if s != API_VERSION {
                return Err(err(
                    "apiVersion",
                    format!("must be `{API_VERSION}`, got `{s}`"),
                ));
            }
        }
        if let Some(v) = top.get("kind") {
            let s = as_str(v, "kind")?;
            if s != KIND {
                return Err(err("kind", format!("must be `{KIND}`, got `{s}`")));
            }
        }
        let mut config = Config::default();
        if let Some(pool) = top.get("pool") {
            config.pool = parse_pool(pool)?;
        }
        config.flow = parse_flow(top)?;
        Ok(config)
    }
}

/// A declared plugin.
struct Plugin<'a> {
    name: String,
    type_name: &'a str,
    parameters: &'a Value,
}

const USAGE_LIMIT_POLICY: &str = crate::flow_control::config::STATIC_USAGE_LIMIT_POLICY;

fn parse_plugins(top: &Map<String, Value>) -> Result<Vec<Plugin<'_>>, ConfigError> {
    let mut plugins: Vec<Plugin<'_>> = Vec::new();
    let Some(list) = top.get("plugins") else {
        return Ok(plugins);
    };
    let list = list
        .as_array()
        .ok_or_else(|| err("plugins", "must be a list"))?;
    for (i, item) in list.iter().enumerate() {
        let path = format!("plugins[{i}]");
        let obj = as_object(item, &path)?;
        only_fields(obj, &path, &["type", "name", "parameters"])?;
        let type_name = as_str(
            obj.get("type")
                .ok_or_else(|| err(&path, "missing field `type`"))?,
            &format!("{path}.type"),
        )?;
        let known = FairnessPolicy::from_type(type_name).is_some()
            || OrderingPolicy::from_type(type_name).is_some()
            || Detector::TYPES.contains(&type_name)
            || type_name == USAGE_LIMIT_POLICY;
        if !known {
            let mut types: Vec<&str> = FairnessPolicy::TYPES.to_vec();
            types.extend(OrderingPolicy::TYPES);
            types.extend(Detector::TYPES);
            types.push(USAGE_LIMIT_POLICY);
            return Err(err(
                &format!("{path}.type"),
                format!(
                    "unknown plugin type \"{type_name}\"; known types: {}",
                    types.join(", ")
                ),
            ));
        }
        let name = match obj.get("name") {
            Some(n) => as_str(n, &format!("{path}.name"))?.to_string(),
            None => type_name.to_string(),
        };
        if plugins.iter().any(|p| p.name == name) {
            return Err(err(
                &format!("{path}.name"),
                format!("duplicate plugin name \"{name}\""),
            ));
        }
        let parameters = obj.get("parameters").unwrap_or(&Value::Null);
        // Validates a detector's parameters now, so errors name the plugin.
        Detector::from_plugin(type_name, parameters, &format!("{path}.parameters"))?;
        plugins.push(Plugin {
            name,
            type_name,
            parameters,
        });
    }
    Ok(plugins)
}

fn parse_flow(top: &Map<String, Value>) -> Result<FlowSettings, ConfigError> {
    let plugins = parse_plugins(top)?;
    let mut flow = FlowSettings::default();
    if let Some(gates) = top.get("featureGates") {
        let gates = gates
            .as_array()
            .ok_or_else(|| err("featureGates", "must be a list"))?;
        for (i, g) in gates.iter().enumerate() {
            let path = format!("featureGates[{i}]");
            let g = as_str(g, &path)?;
            if !FEATURE_GATES.contains(&g) {
                return Err(err(
                    &path,
                    format!(
                        "unknown feature gate \"{g}\"; known gates: {}",
                        FEATURE_GATES.join(", ")
                    ),
                ));
            }
            flow.enabled |= g == "flowControl";
        }
    }
    if let Some(sd) = top.get("saturationDetector") {
        let obj = as_object(sd, "saturationDetector")?;
        only_fields(obj, "saturationDetector", &["pluginRef"])?;
        if let Some(r) = obj.get("pluginRef") {
            let name = as_str(r, "saturationDetector.pluginRef")?;
            let plugin = plugins.iter().find(|p| p.name == name);
            flow.detector = match plugin {
                Some(p) => Detector::from_plugin(p.type_name, p.parameters, "saturationDetector")?
                    .ok_or_else(|| {
                        err(
                            "saturationDetector.pluginRef",
                            format!(
                                "plugin \"{name}\" is a {}, not a saturation detector",
                                p.type_name
                            ),
                        )
                    })?,
                None if Detector::TYPES.contains(&name) => {
                    Detector::from_plugin(name, &Value::Null, "saturationDetector")?
                        .unwrap_or_default()
                }
                None => {
                    return Err(err(
                        "saturationDetector.pluginRef",
                        format!("no plugin named \"{name}\" is declared"),
                    ))
                }
            };
        }
    }
    // The section is read only when the gate is on, as in the reference.
    if flow.enabled {
        if let Some(section) = top.get("flowControl") {
            flow.control = FlowControlConfig::parse(section, "flowControl", |name| {
                plugins.iter().find(|p| p.name == name).map(|p| PluginRef {
                    type_name: p.type_name,
                    parameters: p.parameters,
                })
            })?;
        }
    }
    Ok(flow)
}

fn parse_pool(v: &Value) -> Result<Pool, ConfigError> {
    let obj = as_object(v, "pool")?;
    only_fields(
        obj,
        "pool",
        &["name", "endpoints", "objectives", "maxRequestBodyBytes"],
    )?;
    let mut pool = Config::default().pool;
    if let Some(name) = obj.get("name") {
        let name = as_str(name, "pool.name")?;
        if name.is_empty() {
            return Err(err("pool.name", "must not be empty"));
        }
        pool.name = name.to_string();
    }
    if let Some(limit) = obj.get("maxRequestBodyBytes") {
        let n = limit
            .as_u64()
            .filter(|n| *n > 0)
            .ok_or_else(|| err("pool.maxRequestBodyBytes", "must be a positive integer"))?;
        pool.max_request_body_bytes = usize::try_from(n)
            .map_err(|_| err("pool.maxRequestBodyBytes", "is too large for this platform"))?;
    }
    if let Some(list) = obj.get("objectives") {
        let list = list
            .as_array()
            .ok_or_else(|| err("pool.objectives", "must be a list of {name, priority}"))?;
        for (i, item) in list.iter().enumerate() {
            let path = format!("pool.objectives[{i}]");
            let o = as_object(item, &path)?;
            only_fields(o, &path, &["name", "priority"])?;
            let name = as_str(
                o.get("name")
                    .ok_or_else(|| err(&path, "missing field `name`"))?,
                &format!("{path}.name"),
            )?;
            let priority = match o.get("priority") {
                None => 0,
                Some(p) => p
                    .as_i64()
                    .and_then(|p| i32::try_from(p).ok())
                    .ok_or_else(|| err(&format!("{path}.priority"), "must be an integer"))?,
            };
            if pool.objectives.iter().any(|x| x.name == name) {
                return Err(err(
                    &format!("{path}.name"),
                    format!("duplicate objective `{name}`"),
                ));
            }
            pool.objectives.push(Objective {
                name: name.to_string(),
                priority,
            });
        }
    }
    if let Some(list) = obj.get("endpoints") {
        let list = list
            .as_array()
            .ok_or_else(|| err("pool.endpoints", "must be a list"))?;
        for (i, item) in list.iter().enumerate() {
            let path = format!("pool.endpoints[{i}]");
            let endpoint = parse_endpoint(item, &path)?;
            if pool.endpoints.iter().any(|e| e.address == endpoint.address) {
                return Err(err(
                    &path,
                    format!("duplicate endpoint `{}`", endpoint.address),
                ));
            }
            pool.endpoints.push(endpoint);
        }
    }
    Ok(pool)
}

fn parse_endpoint(v: &Value, path: &str) -> Result<Endpoint, ConfigError> {
    let (address, labels) = match v {
        Value::String(s) => (s.as_str(), BTreeMap::new()),
        Value::Object(obj) => {
            only_fields(obj, path, &["address", "labels"])?;
            let address = obj
                .get("address")
                .ok_or_else(|| err(path, "missing field `address`"))?;
            let address = as_str(address, &format!("{path}.address"))?;
            let mut labels = BTreeMap::new();
            if let Some(l) = obj.get("labels") {
                let lpath = format!("{path}.labels");
                for (k, v) in as_object(l, &lpath)? {
                    let s = as_str(v, &format!("{lpath}.{k}"))?;
                    labels.insert(k.clone(), s.to_string());
                }
            }
            (address, labels)
        }
        _ => {
            return Err(err(
                path,
                "must be an `ip:port` string or an object with `address`",
            ))
        }
    };
    let parsed: SocketAddr = address
        .parse()
        .map_err(|_| err(path, format!("`{address}` is not an `ip:port` address")))?;
    if parsed.port() == 0 {
        return Err(err(path, format!("`{address}` has port 0")));
    }
    Ok(Endpoint {
        address: parsed.to_string(),
        labels,
    })
}

fn as_object<'a>(v: &'a Value, path: &str) -> Result<&'a Map<String, Value>, ConfigError> {
    v.as_object().ok_or_else(|| err(path, "must be an object"))
}

fn as_str<'a>(v: &'a Value, path: &str) -> Result<&'a str, ConfigError> {
    v.as_str().ok_or_else(|| err(path, "must be a string"))
}

fn only_fields(obj: &Map<String, Value>, path: &str, known: &[&str]) -> Result<(), ConfigError> {
    for key in obj.keys() {
        if !known.contains(&key.as_str()) {
            let field = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            return Err(err(
                &field,
                format!("unknown field; expected one of: {}", known.join(", ")),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn empty_configuration_means_defaults() {
        let c = Config::parse("  ").unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.pool.max_request_body_bytes, 4 * 1024 * 1024);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn reads_endpoints_as_strings_or_objects() {
        let c = Config::parse(
            r#"{"apiVersion":"inference.networking.x-k8s.io/v1alpha1","kind":"EndpointPickerConfig",
                "pool":{"name":"p","maxRequestBodyBytes":1000,
                "endpoints":["127.0.0.1:8001",{"address":"127.0.0.1:8002","labels":{"role":"decode"}}]}}"#,
        )
        .unwrap();
        assert_eq!(c.pool.name, "p");
        assert_eq!(c.pool.max_request_body_bytes, 1000);
        assert_eq!(c.pool.endpoints.len(), 2);
        assert_eq!(c.pool.endpoints[1].address, "127.0.0.1:8002");
        assert_eq!(c.pool.endpoints[1].labels["role"], "decode");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn flow_control_is_read_only_with_its_feature_gate() {
        let section = r#""flowControl":{"maxRequests":"1k","defaultRequestTTL":"30s"}"#;
        let off = Config::parse(&format!("{{{section}}}")).unwrap();
        assert!(!off.flow.enabled);
        assert_eq!(off.flow.control.max_requests, 0, "ignored without the gate");
        let on = Config::parse(&format!(
            r#"{{"featureGates":["flowControl"],
                "plugins":[{{"type":"concurrency-detector","name":"cd","parameters":{{"maxConcurrency":15}}}}],
                "saturationDetector":{{"pluginRef":"cd"}},
                "pool":{{"objectives":[{{"name":"premium","priority":100}},{{"name":"batch","priority":-10}}]}},
                {section}}}"#
        ))
        .unwrap();
        assert!(on.flow.enabled);
        assert_eq!(on.flow.control.max_requests, 1000);
        assert_eq!(on.flow.control.default_ttl_ms, 30_000);
        assert!(
            matches!(on.flow.detector, Detector::Concurrency(ref p) if p.max_concurrency == 15)
        );
        assert_eq!(on.pool.priority_of(Some("premium")), 100);
        assert_eq!(on.pool.priority_of(Some("batch")), -10);
        assert_eq!(on.pool.priority_of(Some("unknown")), 0);
        assert_eq!(on.pool.priority_of(None), 0);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn errors_name_the_field_and_the_reason() {
        let cases = [
            (
                r#"{"pool":{"endpoints":["127.0.0.1"]}}"#,
                "pool.endpoints[0]",
                "not an `ip:port`",
            ),
            (
                r#"{"pool":{"endpoints":[1]}}"#,
                "pool.endpoints[0]",
                "must be",
            ),
            (
                r#"{"pool":{"endpoints":["1.2.3.4:5","1.2.3.4:5"]}}"#,
                "pool.endpoints[1]",
                "duplicate",
            ),
            (
                r#"{"pool":{"maxRequestBodyBytes":-1}}"#,
                "pool.maxRequestBodyBytes",
                "positive",
            ),
            (
                r#"{"pool":{"endpoint":[]}}"#,
                "pool.endpoint",
                "unknown field",
            ),
            (r#"{"kind":"Other"}"#, "kind", "EndpointPickerConfig"),
            (
                r#"{"pool":{"endpoints":[{"address":"1.2.3.4:5","labels":{"a":1}}]}}"#,
                "pool.endpoints[0].labels.a",
                "string",
            ),
            ("{", "", "not valid JSON"),
            (
                r#"{"featureGates":["fastLane"]}"#,
                "featureGates[0]",
                "unknown feature gate",
            ),
            (
                r#"{"plugins":[{"type":"magic-scorer"}]}"#,
                "plugins[0].type",
                "unknown plugin type",
            ),
            (
                r#"{"plugins":[{"type":"fcfs-ordering-policy"},{"type":"fcfs-ordering-policy"}]}"#,
                "plugins[1].name",
                "duplicate",
            ),
            (
                r#"{"plugins":[{"type":"concurrency-detector","parameters":{"maxConcurrency":0}}]}"#,
                "plugins[0].parameters.maxConcurrency",
                "positive",
            ),
            (
                r#"{"saturationDetector":{"pluginRef":"nope"}}"#,
                "saturationDetector.pluginRef",
                "no plugin named",
            ),
            (
                r#"{"featureGates":["flowControl"],"flowControl":{"maxRequests":"x"}}"#,
                "flowControl.maxRequests",
                "not a quantity",
            ),
            (
                r#"{"pool":{"objectives":[{"name":"a","priority":"high"}]}}"#,
                "pool.objectives[0].priority",
                "integer",
            ),
        ];
        for (text, path, reason) in cases {
            let e = Config::parse(text).unwrap_err();
            assert_eq!(e.path, path, "for {text}");
            assert!(e.reason.contains(reason), "for {text}: {}", e.reason);
            assert!(e.to_string().contains(reason));
        }
    }
}
