//! Every plugin of a resolved configuration built once, and the runtime assembled from
//! the built plugins: the scheduler's profiles and handler, the prefix index's
//! parameters, the data layer's settings and flow control's settings.

use super::defaults::has_role;
use super::{FlowSettings, Resolved, Runtime};
use crate::config::validate::err;
use crate::config::{ConfigError, EndpointPickerConfig, PluginSpec};
use crate::datalayer::Settings;
use crate::flow_control::config::{FlowControlConfig, PluginRef};
use crate::prefix::{self, PrefixConfig};
use crate::registry::{self, Built, Role};
use crate::scheduler::handlers::pd::Disagg;
use crate::scheduler::handlers::single::{self, Single};
use crate::scheduler::handlers::slo_aware::{self, SloAware};
use crate::scheduler::handlers::Handler;
use crate::scheduler::profile::{Named, WeightedScorer};
use crate::scheduler::scorers::{prefix_cache, session_affinity};
use crate::scheduler::{Profile, Scheduler};
use std::collections::BTreeMap;

fn params_path(p: &PluginSpec, i: usize) -> String {
    format!("plugins[{}].parameters", p.index.unwrap_or(i))
}

/// Builds the runtime of a resolved document.
pub fn build(doc: EndpointPickerConfig, resolved: Resolved) -> Result<Runtime, ConfigError> {
    let mut built: BTreeMap<&str, Built> = BTreeMap::new();
    for (i, p) in resolved.plugins.iter().enumerate() {
        let Some(t) = registry::lookup(&p.type_name) else {
            return Err(err(
                &format!("plugins[{}].type", p.index.unwrap_or(i)),
                format!("unknown plugin type \"{}\"", p.type_name),
            ));
        };
        built.insert(
            p.name.as_str(),
            (t.build)(&p.parameters, &params_path(p, i))?,
        );
    }
    let profiles = profiles(&resolved, &built)?;
    let handler = handler(&resolved, &built)?;
    let latency = resolved
        .plugins
        .iter()
        .find_map(|p| built.get(p.name.as_str()).and_then(|b| b.latency.clone()));
    if latency.is_none() {
        if let Some((i, p)) = resolved
            .plugins
            .iter()
            .enumerate()
            .find(|(_, p)| built.get(p.name.as_str()).is_some_and(|b| b.needs_latency))
        {
            return Err(err(
                &format!("plugins[{}].type", p.index.unwrap_or(i)),
                format!(
                    "{} needs latency predictions: declare a predicted-latency-producer (or slo-request-tracker) plugin",
                    p.type_name
                ),
            ));
        }
    }
    let scheduler = Scheduler {
        profiles,
        handler,
        prefix: prefix_config(&resolved, &built),
        precise: resolved
            .plugins
            .iter()
            .find_map(|p| built.get(p.name.as_str()).and_then(|b| b.precise.clone())),
        slo_admitter: built.values().any(|b| b.slo_admitter),
        latency,
    };
    let data_layer = data_layer(&resolved, &built);
    let flow = flow_settings(&doc, &resolved, &built)?;
    let sessions = resolved
        .plugins
        .iter()
        .any(|p| p.type_name == session_affinity::TYPE);
    Ok(Runtime {
        pool: doc.pool,
        resolved,
        scheduler,
        data_layer,
        flow,
        sessions,
    })
}

fn profiles(
    resolved: &Resolved,
    built: &BTreeMap<&str, Built>,
) -> Result<Vec<Profile>, ConfigError> {
    let mut profiles = Vec::new();
    for (pi, spec) in resolved.profiles.iter().enumerate() {
        let mut filters = Vec::new();
        let mut scorers = Vec::new();
        let mut picker = None;
        for (j, r) in spec.plugins.iter().enumerate() {
            let (Some(p), Some(b)) = (
                resolved.plugin(&r.plugin_ref),
                built.get(r.plugin_ref.as_str()),
            ) else {
                return Err(err(
                    &format!("schedulingProfiles[{pi}].plugins[{j}].pluginRef"),
                    format!("unknown pluginRef \"{}\"", r.plugin_ref),
                ));
            };
            if let Some(f) = &b.filter {
                filters.push(Named {
                    name: p.name.clone(),
                    type_name: p.type_name.clone(),
                    plugin: f.clone(),
                });
            }
            if let Some(s) = &b.scorer {
                scorers.push(WeightedScorer {
                    name: p.name.clone(),
                    type_name: p.type_name.clone(),
                    plugin: s.clone(),
                    weight: r.weight.unwrap_or(1.0),
                });
            }
            if let Some(k) = &b.picker {
                picker = Some(Named {
                    name: p.name.clone(),
                    type_name: p.type_name.clone(),
                    plugin: k.clone(),
                });
            }
        }
        let picker = picker.ok_or_else(|| {
            err(
                &format!("schedulingProfiles[{pi}]"),
                "profile has no picker",
            )
        })?;
        profiles.push(Profile {
            name: spec.name.clone(),
            filters,
            scorers,
            picker,
        });
    }
    Ok(profiles)
}

fn handler(resolved: &Resolved, built: &BTreeMap<&str, Built>) -> Result<Handler, ConfigError> {
    let Some((i, h)) = resolved
        .plugins
        .iter()
        .enumerate()
        .find(|(_, p)| has_role(p, Role::Handler))
    else {
        return Ok(Handler::Single(Single));
    };
    if h.type_name == single::TYPE {
        return Ok(Handler::Single(Single));
    }
    let names: Vec<&str> = resolved.profiles.iter().map(|p| p.name.as_str()).collect();
    if h.type_name == slo_aware::TYPE {
        let handler = SloAware::from_parameters(&h.parameters, &params_path(h, i), &names)?;
        return Ok(Handler::SloAware(handler));
    }
    let disagg = Disagg::from_parameters(&h.parameters, &params_path(h, i), &names, |name| {
        built.get(name).and_then(|b| b.decider.clone())
    })?;
    Ok(Handler::Disagg(disagg))
}

/// The prefix index's parameters when any plugin reads prefix matches: the producer's,
/// else the first `prefix-cache-scorer`'s (v1.4 put them there), else the defaults.
fn prefix_config(resolved: &Resolved, built: &BTreeMap<&str, Built>) -> Option<PrefixConfig> {
    if !built.values().any(|b| b.reads_prefix) {
        return None;
    }
    let carried = |type_name: &str| {
        resolved
            .plugins
            .iter()
            .filter(|p| p.type_name == type_name)
            .find_map(|p| built.get(p.name.as_str()).and_then(|b| b.prefix.clone()))
    };
    Some(
        carried(prefix::PRODUCER_TYPE)
            .or_else(|| carried(prefix_cache::TYPE))
            .or_else(|| carried(prefix_cache::ALIAS))
            .unwrap_or_default(),
    )
}

/// The first source's settings with its first extractor's mapping (no source:
/// collection disabled).
fn data_layer(resolved: &Resolved, built: &BTreeMap<&str, Built>) -> Settings {
    let Some(source) = resolved.data_sources.first() else {
        return Settings {
            enabled: false,
            ..Settings::default()
        };
    };
    let mut settings = built
        .get(source.plugin_ref.as_str())
        .and_then(|b| b.source.clone())
        .unwrap_or_default();
    if let Some(mapping) = source
        .extractors
        .first()
        .and_then(|e| built.get(e.as_str()))
        .and_then(|b| b.extractor.clone())
    {
        settings.mapping = mapping;
    }
    settings
}

/// The flow-control layer's settings: the gate, the detector `saturationDetector` names,
/// and the `flowControl` section — decoded strictly whatever the gate (as the reference),
/// used only with it on.
fn flow_settings(
    doc: &EndpointPickerConfig,
    resolved: &Resolved,
    built: &BTreeMap<&str, Built>,
) -> Result<FlowSettings, ConfigError> {
    let mut flow = FlowSettings {
        enabled: resolved.gate("flowControl"),
        ..FlowSettings::default()
    };
    if let Some(d) = built
        .get(resolved.saturation_detector.as_str())
        .and_then(|b| b.detector.clone())
    {
        flow.detector = d;
    }
    if let Some(section) = &doc.flow_control {
        let control = FlowControlConfig::parse(section, "flowControl", |name| {
            resolved.plugin(name).map(|p| PluginRef {
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
