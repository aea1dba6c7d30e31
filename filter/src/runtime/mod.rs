//! The runtime of one plugin instance: the configuration document validated, defaulted
//! and built into the objects requests use — once, when Envoy loads the configuration.
//! Every error (an unknown type, a bad reference, a bad parameter) surfaces here, with
//! the field's path, and never at request time.
//!
//! * [`load`] — text in, [`Runtime`] out: the one loader; it depends on every layer.
//! * `defaults` — the reference's defaulting and cross-section checks (roles, refs).
//! * `build` — every plugin built once; profiles, handler, prefix index, data layer and
//!   flow control assembled from them.

mod build;
mod defaults;

use crate::config::{ConfigError, EndpointPickerConfig, PluginSpec, Pool, ProfileSpec, SourceSpec};
use crate::datalayer::Settings;
use crate::flow_control::config::FlowControlConfig;
use crate::flow_control::saturation::Detector;
use crate::scheduler::Scheduler;
use serde_json::Value;

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

/// The configuration after the reference's defaulting: every plugin, declared or added,
/// and what each section resolved to.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
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
}

impl Resolved {
    /// The plugin called `name`.
    pub fn plugin(&self, name: &str) -> Option<&PluginSpec> {
        self.plugins.iter().find(|p| p.name == name)
    }

    /// Whether a feature gate is on.
    pub fn gate(&self, name: &str) -> bool {
        self.feature_gates.iter().any(|g| g == name)
    }
}

/// Everything one plugin instance runs with.
pub struct Runtime {
    /// The model-server pool (`pool` section).
    pub pool: Pool,
    /// The defaulted configuration.
    pub resolved: Resolved,
    /// The scheduler.
    pub scheduler: Scheduler,
    /// The data layer: scrape settings and metric mapping.
    pub data_layer: Settings,
    /// Flow control and admission.
    pub flow: FlowSettings,
    /// The session header the session-affinity plugins read (and, with
    /// `encoded_endpoint_header`, write back), when one is configured.
    pub session: Option<crate::scheduler::session::Session>,
}

impl Runtime {
    /// Whether a plugin reads the other gateway replicas' requests from the servers'
    /// reports: a `concurrency-detector` with `inFlightSource: servers`, or a
    /// `rendezvous-home-filter` with `otherGatewayShare` above 0. Only then does a scrape
    /// record this gateway's own requests in flight at each server.
    pub fn counts_other_replicas(&self) -> bool {
        self.resolved.plugins.iter().any(|p| {
            let param = |name| p.parameters.get(name);
            match p.type_name.as_str() {
                "concurrency-detector" => {
                    param("inFlightSource").and_then(Value::as_str) == Some("servers")
                }
                "rendezvous-home-filter" => {
                    param("otherGatewayShare").and_then(Value::as_f64) > Some(0.0)
                }
                _ => false,
            }
        })
    }
}

/// Loads a JSON configuration (empty: every default).
pub fn load(text: &str) -> Result<Runtime, ConfigError> {
    from_document(EndpointPickerConfig::parse(text)?)
}

/// Loads an already-parsed document (JSON, or YAML turned into JSON values).
pub fn from_value(doc: &Value) -> Result<Runtime, ConfigError> {
    from_document(EndpointPickerConfig::from_value(doc)?)
}

/// Defaults, checks and builds a document.
pub fn from_document(doc: EndpointPickerConfig) -> Result<Runtime, ConfigError> {
    let resolved = defaults::resolve(&doc)?;
    build::build(doc, resolved)
}

#[cfg(test)]
mod tests;
