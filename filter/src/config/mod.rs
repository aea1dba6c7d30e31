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
pub mod trust;
pub mod validate;

pub use classification::{Claim, Classification, Source, DEFAULT_FAIRNESS_ID};
pub use epp::{PluginSpec, ProfilePlugin, ProfileSpec, SourceSpec};
pub use health::PassiveHealth;
pub use pool::{Pool, DEFAULT_MAX_REQUEST_BODY_BYTES, DEFAULT_POOL_NAME};
pub use trust::TrustHeaders;
pub use validate::{ConfigError, Params};

pub use crate::endpoint::Endpoint;
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

/// The configuration document as written, its shape checked, nothing defaulted.
#[derive(Debug, Clone, PartialEq, Default)]
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
    /// `dataLayer.sources` (`None`: the section is absent; empty: collection disabled).
    pub data_sources: Option<Vec<SourceSpec>>,
    /// `parser.pluginRef`.
    pub parser: Option<String>,
    /// Our `pool` section (defaults when absent).
    pub pool: Pool,
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
        let plugins = top.get("plugins").map(epp::parse_plugins).transpose()?;
        let profiles = match top.get("schedulingProfiles") {
            Some(p) => epp::parse_profiles(p)?,
            None => Vec::new(),
        };
        let saturation_detector = top
            .get("saturationDetector")
            .map(|v| epp::parse_plugin_ref(v, "saturationDetector"))
            .transpose()?;
        let data_sources = top
            .get("dataLayer")
            .map(epp::parse_data_layer)
            .transpose()?;
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
            parser,
            pool,
        })
    }
}
