//! The filter's configuration: what Envoy hands `on_configure` as a JSON string.
//!
//! The shape is the reference's `EndpointPickerConfig` (apiVersion
//! `inference.networking.x-k8s.io/v1alpha1`, kind `EndpointPickerConfig`: `plugins`,
//! `schedulingProfiles`, `featureGates`, `saturationDetector`, `flowControl`,
//! `dataLayer`, `parser`) plus a `pool` section of our own for what the reference keeps in
//! Kubernetes objects ([`pool`]).
//!
//! Validation is strict: an unknown field, a wrong type, an unknown plugin type or
//! reference, a bad weight or quantity is refused at load time with the field's path and
//! the reason, and the filter never half-loads. Defaulting follows the reference
//! (`defaults.go`): names default to types, weights to 1, a profile without a picker
//! gets one, one profile gets `single-profile-handler`, and no configuration at all (or no
//! `plugins`) means the reference's default profile — queue-scorer 2,
//! kv-cache-utilization-scorer 2, prefix-cache-scorer 3, max-score-picker — with the
//! reference's default `utilization-detector` also placed in it as a filter (a deliberate
//! difference: without it a hot prefix group piles onto one server; see `parse`).

pub mod epp;
pub mod pool;
pub mod quantity;
pub mod validate;

pub use epp::{PluginSpec, ProfilePlugin, ProfileSpec, SourceSpec};
pub use pool::{Endpoint, Pool, DEFAULT_MAX_REQUEST_BODY_BYTES, DEFAULT_POOL_NAME};
pub use validate::ConfigError;

use crate::flow_control::config::{FlowControlConfig, PluginRef};
use crate::flow_control::saturation::Detector;
use crate::registry::{self, Role};
use serde_json::Value;
use validate::{as_object, as_str, err, only_fields};

/// The API version the reference uses for `EndpointPickerConfig`.
pub const API_VERSION: &str = "inference.networking.x-k8s.io/v1alpha1";
/// The kind the reference uses.
pub const KIND: &str = "EndpointPickerConfig";

const TOP_FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "plugins",
    "schedulingProfiles",
    "featureGates",
    "saturationDetector",
    "flowControl",
    "dataLayer",
    "parser",
    "pool",
];

/// Flow control and admission settings (the flow-control layer's view of the config).
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

/// The whole, validated and defaulted configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The model-server pool.
    pub pool: Pool,
    /// Every plugin, declared or added by defaulting.
    pub plugins: Vec<PluginSpec>,
    /// Scheduling profiles (at least one).
    pub profiles: Vec<ProfileSpec>,
    /// Enabled feature gates.
    pub feature_gates: Vec<String>,
    /// Name of the saturation-detector plugin.
    pub saturation_detector: String,
    /// Metric sources (empty: collection disabled).
    pub data_sources: Vec<SourceSpec>,
    /// Name of the request parser plugin.
    pub parser: String,
    /// Flow control and admission, as the flow-control layer uses them.
    pub flow: FlowSettings,
}

impl Default for Config {
    fn default() -> Self {
        // The default configuration is valid by construction (tested).
        Config::from_value(&Value::Object(serde_json::Map::new())).unwrap_or_else(|_| Config {
            pool: Pool::default(),
            plugins: Vec::new(),
            profiles: Vec::new(),
            feature_gates: Vec::new(),
            saturation_detector: String::new(),
            data_sources: Vec::new(),
            parser: String::new(),
            flow: FlowSettings::default(),
        })
    }
}

fn plugin(type_name: &str) -> PluginSpec {
    PluginSpec {
        type_name: type_name.to_string(),
        name: type_name.to_string(),
        parameters: Value::Null,
        index: None,
    }
}

fn weighted(name: &str, weight: f64) -> ProfilePlugin {
    ProfilePlugin {
        plugin_ref: name.to_string(),
        weight: Some(weight),
    }
}

impl Config {
    /// Parses and validates the plugin configuration. An empty string means defaults.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        if text.trim().is_empty() {
            return Config::from_value(&Value::Object(serde_json::Map::new()));
        }
        let doc: Value =
            serde_json::from_str(text).map_err(|e| err("", format!("not valid JSON: {e}")))?;
        Config::from_value(&doc)
    }

    /// Validates an already-parsed document (JSON or YAML turned into JSON values).
    pub fn from_value(doc: &Value) -> Result<Config, ConfigError> {
        let top = as_object(doc, "")?;
        only_fields(top, "", TOP_FIELDS)?;
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
        let pool = match top.get("pool") {
            Some(p) => pool::parse_pool(p)?,
            None => Pool::default(),
        };
        let feature_gates = match top.get("featureGates") {
            Some(g) => epp::parse_feature_gates(g)?,
            None => Vec::new(),
        };
        let mut plugins = match top.get("plugins") {
            Some(p) => epp::parse_plugins(p)?,
            None => Vec::new(),
        };
        let mut profiles = match top.get("schedulingProfiles") {
            Some(p) => epp::parse_profiles(p)?,
            None => Vec::new(),
        };
        if top.get("plugins").is_none() && profiles.is_empty() {
            // The reference's loadDefaultConfig, plus its default saturation detector in
            // the profile as a filter: with the 3:2:2 weights alone, an endpoint that
            // matches ≥ 67 % of a prompt wins whatever its queue, so a hot prefix group
            // piles onto one server (BENCHMARKS.md, `scripts/bench quality-sim --zipf
            // 1.1`: TTFT p90 12 s → 0.12 s at 32 QPS). Its filter role leaves out an
            // endpoint with 5+ waiting or KV ≥ 80 % while others are below (all kept if
            // none is).
            for t in [
                "utilization-detector",
                "queue-scorer",
                "kv-cache-utilization-scorer",
                "prefix-cache-scorer",
            ] {
                plugins.push(plugin(t));
            }
            profiles.push(ProfileSpec {
                name: "default".to_string(),
                plugins: vec![
                    ProfilePlugin {
                        plugin_ref: "utilization-detector".to_string(),
                        weight: None,
                    },
                    weighted("queue-scorer", 2.0),
                    weighted("kv-cache-utilization-scorer", 2.0),
                    weighted("prefix-cache-scorer", 3.0),
                ],
            });
        }
        // Every declared type must be registered.
        for (i, p) in plugins.iter().enumerate() {
            if registry::roles(&p.type_name).is_none() {
                return Err(err(
                    &format!("plugins[{}].type", p.index.unwrap_or(i)),
                    format!(
                        "unknown plugin type \"{}\"; known types: {}",
                        p.type_name,
                        registry::type_names().join(", ")
                    ),
                ));
            }
        }
        ensure_scheduling_layer(&mut plugins, &mut profiles)?;
        let saturation_detector =
            ensure_saturation_detector(top.get("saturationDetector"), &mut plugins)?;
        let data_sources = ensure_data_layer(top.get("dataLayer"), &mut plugins)?;
        let parser = match top.get("parser") {
            Some(p) => {
                let name = epp::parse_plugin_ref(p, "parser")?;
                require_role(
                    &plugins,
                    &name,
                    Role::Parser,
                    "parser.pluginRef",
                    &["openai-parser"],
                )?;
                name
            }
            None => "openai-parser".to_string(),
        };
        let flow = flow_settings(
            top.get("flowControl"),
            &feature_gates,
            &saturation_detector,
            &plugins,
        )?;
        let config = Config {
            pool,
            plugins,
            profiles,
            feature_gates,
            saturation_detector,
            data_sources,
            parser,
            flow,
        };
        // Build every plugin once: parameter errors surface now, never at request time.
        registry::build(&config)?;
        Ok(config)
    }

    /// The declared plugin called `name`.
    pub fn plugin(&self, name: &str) -> Option<&PluginSpec> {
        self.plugins.iter().find(|p| p.name == name)
    }

    /// Whether a feature gate is on.
    pub fn gate(&self, name: &str) -> bool {
        self.feature_gates.iter().any(|g| g == name)
    }
}

/// The flow-control layer's settings: the gate, the detector the `saturationDetector`
/// names (its parameters checked by the flow-control layer), and the `flowControl` section
/// parsed by `FlowControlConfig::parse` when the gate is on.
fn flow_settings(
    section: Option<&Value>,
    gates: &[String],
    detector: &str,
    plugins: &[PluginSpec],
) -> Result<FlowSettings, ConfigError> {
    let mut flow = FlowSettings {
        enabled: gates.iter().any(|g| g == "flowControl"),
        ..FlowSettings::default()
    };
    if let Some((i, p)) = plugins.iter().enumerate().find(|(_, p)| p.name == detector) {
        let path = format!("plugins[{}].parameters", p.index.unwrap_or(i));
        if let Some(d) = Detector::from_plugin(&p.type_name, &p.parameters, &path)? {
            flow.detector = d;
        }
    }
    if let Some(section) = section {
        // Decoded strictly whatever the gate (as the reference), used only with it on.
        let control = FlowControlConfig::parse(section, "flowControl", |name| {
            plugins.iter().find(|p| p.name == name).map(|p| PluginRef {
                type_name: p.type_name.as_str(),
                parameters: &p.parameters,
            })
        })?;
        if flow.enabled {
            flow.control = control;
        }
    }
    Ok(flow)
}

fn has_role(p: &PluginSpec, role: Role) -> bool {
    registry::roles(&p.type_name).is_some_and(|r| r.contains(&role))
}

fn require_role(
    plugins: &[PluginSpec],
    name: &str,
    role: Role,
    path: &str,
    builtin: &[&str],
) -> Result<(), ConfigError> {
    match plugins.iter().find(|p| p.name == name) {
        Some(p) if has_role(p, role) => Ok(()),
        Some(p) => Err(err(
            path,
            format!(
                "plugin \"{name}\" (type {}) is not a {}",
                p.type_name,
                role.describe()
            ),
        )),
        None if builtin.contains(&name) => Ok(()),
        None => Err(err(
            path,
            format!(
                "unknown pluginRef \"{name}\"; declared plugins: {}",
                names(plugins)
            ),
        )),
    }
}

fn names(plugins: &[PluginSpec]) -> String {
    let v: Vec<&str> = plugins.iter().map(|p| p.name.as_str()).collect();
    if v.is_empty() {
        "(none)".to_string()
    } else {
        v.join(", ")
    }
}

fn ensure_scheduling_layer(
    plugins: &mut Vec<PluginSpec>,
    profiles: &mut Vec<ProfileSpec>,
) -> Result<(), ConfigError> {
    if profiles.is_empty() {
        // The auto-built `default` profile: every filter, scorer and picker, in declaration
        // order (the reference uses Go map order, §15 #16; declaration order is stable).
        let refs = plugins
            .iter()
            .filter(|p| {
                has_role(p, Role::Filter) && !has_role(p, Role::Detector)
                    || has_role(p, Role::Scorer)
                    || has_role(p, Role::Picker)
            })
            .map(|p| ProfilePlugin {
                plugin_ref: p.name.clone(),
                weight: None,
            })
            .collect();
        profiles.push(ProfileSpec {
            name: "default".to_string(),
            plugins: refs,
        });
    }
    for (i, profile) in profiles.iter().enumerate() {
        let mut pickers = 0;
        for (j, r) in profile.plugins.iter().enumerate() {
            let path = format!("schedulingProfiles[{i}].plugins[{j}].pluginRef");
            let Some(p) = plugins.iter().find(|p| p.name == r.plugin_ref) else {
                return Err(err(
                    &path,
                    format!(
                        "unknown pluginRef \"{}\"; declared plugins: {}",
                        r.plugin_ref,
                        names(plugins)
                    ),
                ));
            };
            if !(has_role(p, Role::Filter)
                || has_role(p, Role::Scorer)
                || has_role(p, Role::Picker))
            {
                return Err(err(
                    &path,
                    format!(
                        "plugin \"{}\" (type {}) is not a filter, scorer or picker",
                        p.name, p.type_name
                    ),
                ));
            }
            if has_role(p, Role::Picker) {
                pickers += 1;
                if pickers > 1 {
                    return Err(err(
                        &path,
                        format!(
                            "profile \"{}\" already has a picker; a profile takes one",
                            profile.name
                        ),
                    ));
                }
            }
        }
    }
    // A profile without a picker gets the first declared picker, or a new max-score-picker.
    for profile in profiles.iter_mut() {
        let has_picker = profile.plugins.iter().any(|r| {
            plugins
                .iter()
                .any(|p| p.name == r.plugin_ref && has_role(p, Role::Picker))
        });
        if has_picker {
            continue;
        }
        let name = match plugins.iter().find(|p| has_role(p, Role::Picker)) {
            Some(p) => p.name.clone(),
            None => {
                let name = unique_name(plugins, "max-score-picker");
                let mut p = plugin("max-score-picker");
                p.name = name.clone();
                plugins.push(p);
                name
            }
        };
        profile.plugins.push(ProfilePlugin {
            plugin_ref: name,
            weight: None,
        });
    }
    let handlers: Vec<usize> = plugins
        .iter()
        .enumerate()
        .filter(|(_, p)| has_role(p, Role::Handler))
        .map(|(i, _)| i)
        .collect();
    match handlers.as_slice() {
        [] if profiles.len() == 1 => plugins.push(plugin("single-profile-handler")),
        [] => {
            return Err(err(
                "schedulingProfiles",
                format!(
                    "{} profiles need a profile handler plugin (e.g. disagg-profile-handler); \
                     single-profile-handler runs exactly one",
                    profiles.len()
                ),
            ))
        }
        [one] => {
            let p = plugins.get(*one).map(|p| (p.type_name.clone(), p.index));
            if let Some((t, index)) = p {
                if t == "single-profile-handler" && profiles.len() != 1 {
                    return Err(err(
                        &format!("plugins[{}]", index.unwrap_or(*one)),
                        format!(
                            "single-profile-handler runs exactly one profile, but {} are configured",
                            profiles.len()
                        ),
                    ));
                }
            }
        }
        [_, second, ..] => {
            let index = plugins
                .get(*second)
                .and_then(|p| p.index)
                .unwrap_or(*second);
            return Err(err(
                &format!("plugins[{index}]"),
                "only one profile handler may be declared",
            ));
        }
    }
    Ok(())
}

fn unique_name(plugins: &[PluginSpec], base: &str) -> String {
    if !plugins.iter().any(|p| p.name == base) {
        return base.to_string();
    }
    (2..)
        .map(|i| format!("{base}-{i}"))
        .find(|n| !plugins.iter().any(|p| &p.name == n))
        .unwrap_or_else(|| base.to_string())
}

fn ensure_saturation_detector(
    v: Option<&Value>,
    plugins: &mut Vec<PluginSpec>,
) -> Result<String, ConfigError> {
    let name = match v {
        Some(v) => {
            let name = epp::parse_plugin_ref(v, "saturationDetector")?;
            require_role(
                plugins,
                &name,
                Role::Detector,
                "saturationDetector.pluginRef",
                &[],
            )?;
            return Ok(name);
        }
        None => "utilization-detector".to_string(),
    };
    if !plugins.iter().any(|p| p.name == name) {
        plugins.push(plugin("utilization-detector"));
    }
    Ok(name)
}

fn ensure_data_layer(
    v: Option<&Value>,
    plugins: &mut Vec<PluginSpec>,
) -> Result<Vec<SourceSpec>, ConfigError> {
    let Some(v) = v else {
        // The default source and extractor (`ensureDataLayer`).
        for t in ["metrics-data-source", "core-metrics-extractor"] {
            if !plugins.iter().any(|p| p.name == t) {
                plugins.push(plugin(t));
            }
        }
        let source = plugins
            .iter()
            .find(|p| p.type_name == "metrics-data-source")
            .map_or("metrics-data-source".to_string(), |p| p.name.clone());
        let extractor = plugins
            .iter()
            .find(|p| p.type_name == "core-metrics-extractor")
            .map_or("core-metrics-extractor".to_string(), |p| p.name.clone());
        return Ok(vec![SourceSpec {
            plugin_ref: source,
            extractors: vec![extractor],
        }]);
    };
    let sources = epp::parse_data_layer(v)?;
    for (i, s) in sources.iter().enumerate() {
        let path = format!("dataLayer.sources[{i}].pluginRef");
        require_role(plugins, &s.plugin_ref, Role::DataSource, &path, &[])?;
        for (j, e) in s.extractors.iter().enumerate() {
            let path = format!("dataLayer.sources[{i}].extractors[{j}].pluginRef");
            require_role(plugins, e, Role::Extractor, &path, &[])?;
        }
    }
    Ok(sources)
}

#[cfg(test)]
mod tests;
