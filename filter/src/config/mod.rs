//! The filter's configuration document: what Envoy hands `on_configure` as a JSON string.
//!
//! The shape is the reference's `EndpointPickerConfig` (apiVersion
//! `inference.networking.x-k8s.io/v1alpha1`, kind `EndpointPickerConfig`: `plugins`,
//! `schedulingProfiles`, `featureGates`, `saturationDetector`, `flowControl`,
//! `dataLayer`, `parser`) plus a `pool` section of our own for what the reference keeps in
//! Kubernetes objects ([`pool`]).
//!
//! This module reads the document strictly — an unknown field, a wrong type, a bad
//! weight or quantity is refused with the field's path and the reason — into plain specs
//! ([`EndpointPickerConfig`]). It knows nothing of plugin types: defaulting, references
//! between sections and every plugin's parameters are checked when the runtime is built
//! from it (`crate::runtime::load`). It is a leaf: it imports only the plain endpoint
//! data (`crate::endpoint`).

pub mod classification;
pub mod epp;
pub mod health;
pub mod pool;
pub mod quantity;
pub mod validate;

pub use classification::{Claim, Classification, Source, DEFAULT_FAIRNESS_ID};
pub use epp::{PluginSpec, ProfilePlugin, ProfileSpec, SourceSpec};
pub use health::PassiveHealth;
pub use pool::{Pool, DEFAULT_MAX_REQUEST_BODY_BYTES, DEFAULT_POOL_NAME};
pub use validate::{ConfigError, Params};

pub use crate::endpoint::Endpoint;
use serde_json::Value;
use validate::{as_object, as_str, err, only_fields};

/// The API version GIE's EPP used for `EndpointPickerConfig`.
pub const API_VERSION: &str = "inference.networking.x-k8s.io/v1alpha1";
/// Every accepted `apiVersion`: GIE's group, and llm-d-router's `llm-d.ai` group (its
/// `v1alpha1`, and `v1`) — the same document under the group that now owns it.
pub const API_VERSIONS: &[&str] = &[API_VERSION, "llm-d.ai/v1alpha1", "llm-d.ai/v1"];
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

/// The configuration document as written, its shape checked, nothing defaulted.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointPickerConfig {
    /// `plugins[]`, in declaration order (`None`: the section is absent).
    pub plugins: Option<Vec<PluginSpec>>,
    /// `schedulingProfiles[]` (empty when absent).
    pub profiles: Vec<ProfileSpec>,
    /// `featureGates` (empty when absent).
    pub feature_gates: Vec<String>,
    /// `saturationDetector.pluginRef`.
    pub saturation_detector: Option<String>,
    /// The `flowControl` section, read by the flow-control layer.
    pub flow_control: Option<Value>,
    /// `dataLayer.sources` (`None`: the section is absent).
    pub data_sources: Option<Vec<SourceSpec>>,
    /// `dataLayer.injectDefaults` (default true): add the metrics source and extractor
    /// when no `metrics-data-source` is among the sources, as llm-d-router does.
    pub inject_data_defaults: bool,
    /// `parser.pluginRef`.
    pub parser: Option<String>,
    /// Our `pool` section (defaults when absent).
    pub pool: Pool,
}

impl Default for EndpointPickerConfig {
    fn default() -> Self {
        Self {
            plugins: None,
            profiles: Vec::new(),
            feature_gates: Vec::new(),
            saturation_detector: None,
            flow_control: None,
            data_sources: None,
            inject_data_defaults: true,
            parser: None,
            pool: Pool::default(),
        }
    }
}

impl EndpointPickerConfig {
    /// Parses a JSON document. An empty string is the empty document (every default).
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let doc: Value =
            serde_json::from_str(text).map_err(|e| err("", format!("not valid JSON: {e}")))?;
        Self::from_value(&doc)
    }

    /// Reads an already-parsed document (JSON, or YAML turned into JSON values).
    pub fn from_value(doc: &Value) -> Result<Self, ConfigError> {
        let top = as_object(doc, "")?;
        only_fields(top, "", TOP_FIELDS)?;
        if let Some(v) = top.get("apiVersion") {
            let s = as_str(v, "apiVersion")?;
            if !API_VERSIONS.contains(&s) {
                return Err(err(
                    "apiVersion",
                    format!("must be one of `{}`, got `{s}`", API_VERSIONS.join("`, `")),
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
        let plugins = top.get("plugins").map(epp::parse_plugins).transpose()?;
        let profiles = match top.get("schedulingProfiles") {
            Some(p) => epp::parse_profiles(p)?,
            None => Vec::new(),
        };
        let top_detector = top
            .get("saturationDetector")
            .map(|v| epp::parse_plugin_ref(v, "saturationDetector"))
            .transpose()?;
        // llm-d-router moved the detector into `flowControl.saturationDetector`; both
        // places name the same thing (the detector serves legacy admission too).
        let flow_detector = top
            .get("flowControl")
            .and_then(|f| f.get("saturationDetector"))
            .map(|v| epp::parse_plugin_ref(v, "flowControl.saturationDetector"))
            .transpose()?;
        let saturation_detector = match (top_detector, flow_detector) {
            (Some(a), Some(b)) if a != b => {
                return Err(err(
                    "flowControl.saturationDetector.pluginRef",
                    format!(
                        "names \"{b}\" but saturationDetector.pluginRef names \"{a}\": set one"
                    ),
                ))
            }
            (a, b) => a.or(b),
        };
        let data_layer = top
            .get("dataLayer")
            .map(epp::parse_data_layer)
            .transpose()?;
        let inject_data_defaults = data_layer.as_ref().is_none_or(|d| d.inject_defaults);
        let data_sources = data_layer.map(|d| d.sources);
        let parser = top
            .get("parser")
            .map(|v| epp::parse_plugin_ref(v, "parser"))
            .transpose()?;
        Ok(Self {
            plugins,
            profiles,
            feature_gates,
            saturation_detector,
            flow_control: top.get("flowControl").cloned(),
            data_sources,
            inject_data_defaults,
            parser,
            pool,
        })
    }
}
