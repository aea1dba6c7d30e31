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
use crate::scheduler::filters::session_affinity as session_filter;
use crate::scheduler::filters::topology_affinity;
use crate::scheduler::handlers::pd::Disagg;
use crate::scheduler::handlers::single::{self, Single};
use crate::scheduler::handlers::slo_aware::{self, SloAware};
use crate::scheduler::handlers::Handler;
use crate::scheduler::profile::{Named, WeightedScorer};
use crate::scheduler::scorers::topology_affinity as topology_scorer;
use crate::scheduler::scorers::{prefix_cache, session_affinity};
use crate::scheduler::session::Session;
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
        let parameters = with_topology_labels(&resolved, p, i)?;
        built.insert(
            p.name.as_str(),
            (t.build)(
                parameters.as_ref().unwrap_or(&p.parameters),
                &params_path(p, i),
            )?,
        );
    }
    check_producer_names(&resolved)?;
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
        probabilistic: built.values().find_map(|b| b.probabilistic.clone()),
        latency,
    };
    let data_layer = data_layer(&resolved, &built);
    let flow = flow_settings(&doc, &resolved, &built)?;
    let session = session_header(&resolved)?;
    Ok(Runtime {
        pool: doc.pool,
        resolved,
        scheduler,
        data_layer,
        flow,
        session,
    })
}

/// The topology filter's and scorer's parameters with the label names of the
/// `topology-extractor` they read (`topologyProducerName`, else the first declared) as
/// `topologyLabels`; `None`: the plugin's own parameters as they are.
fn with_topology_labels(
    resolved: &Resolved,
    p: &PluginSpec,
    i: usize,
) -> Result<Option<serde_json::Value>, ConfigError> {
    if p.type_name != topology_affinity::TYPE && p.type_name != topology_scorer::TYPE {
        return Ok(None);
    }
    let extractors = || {
        resolved
            .plugins
            .iter()
            .filter(|q| q.type_name == topology_affinity::EXTRACTOR_TYPE)
    };
    let extractor = match p
        .parameters
        .get("topologyProducerName")
        .and_then(|v| v.as_str())
    {
        Some(name) => Some(extractors().find(|q| q.name == name).ok_or_else(|| {
            err(
                &format!("{}.topologyProducerName", params_path(p, i)),
                format!("\"{name}\" is not a declared topology-extractor"),
            )
        })?),
        None => extractors().next(),
    };
    let Some(extractor) = extractor else {
        return Ok(None);
    };
    let mut params = match &p.parameters {
        serde_json::Value::Object(o) => o.clone(),
        _ => serde_json::Map::new(),
    };
    params.insert(
        topology_affinity::LABELS_PARAMETER.to_string(),
        extractor.parameters.clone(),
    );
    Ok(Some(serde_json::Value::Object(params)))
}

/// The one session header of the session-affinity plugins (none configured: `None`).
fn session_header(resolved: &Resolved) -> Result<Option<Session>, ConfigError> {
    let mut found: Option<Session> = None;
    for (i, p) in resolved.plugins.iter().enumerate() {
        if p.type_name != session_affinity::TYPE && p.type_name != session_filter::TYPE {
            continue;
        }
        let path = params_path(p, i);
        let s = Session::from_parameters(&p.parameters, &path)?;
        match &found {
            Some(f) if *f != s => {
                return Err(err(
                    &path,
                    format!(
                        "reads session header(s) {:?} ({:?}), but another session plugin reads {:?} ({:?}): one session header per configuration",
                        s.headers, s.strategy, f.headers, f.strategy
                    ),
                ))
            }
            Some(_) => {}
            None => found = Some(s),
        }
    }
    Ok(found)
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
    if h.type_name == single::TYPE || h.type_name == single::DATA_PARALLEL_TYPE {
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

/// The prefix producers a `prefixMatchInfoProducerName` may name.
const PREFIX_PRODUCERS: &[&str] = &[
    prefix::PRODUCER_TYPE,
    prefix::precise::PRODUCER_TYPE,
    prefix::burst::TYPE,
    prefix::precise::TYPE,
];

/// Every `prefixMatchInfoProducerName` names a declared prefix producer.
fn check_producer_names(resolved: &Resolved) -> Result<(), ConfigError> {
    for (i, p) in resolved.plugins.iter().enumerate() {
        let Some(name) = p
            .parameters
            .get(prefix_cache::PRODUCER_NAME)
            .and_then(|v| v.as_str())
        else {
            continue;
        };
        let ok = resolved
            .plugin(name)
            .is_some_and(|q| PREFIX_PRODUCERS.contains(&q.type_name.as_str()));
        if !ok {
            return Err(err(
                &format!("{}.{}", params_path(p, i), prefix_cache::PRODUCER_NAME),
                format!(
                    "\"{name}\" is not a declared prefix producer ({})",
                    PREFIX_PRODUCERS.join(", ")
                ),
            ));
        }
    }
    Ok(())
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
            .or_else(|| carried(prefix::burst::TYPE))
            .or_else(|| carried(prefix_cache::TYPE))
            .or_else(|| carried(prefix_cache::ALIAS))
            .unwrap_or_default(),
    )
}

/// The first metrics source's settings with its first metrics extractor's mapping (no
/// metrics source: collection disabled). Other sources (`endpoint-notification-source`)
/// scrape nothing: their extractors take their state from elsewhere (kv-relay).
fn data_layer(resolved: &Resolved, built: &BTreeMap<&str, Built>) -> Settings {
    let Some(source) = resolved.data_sources.iter().find(|s| {
        built
            .get(s.plugin_ref.as_str())
            .is_some_and(|b| b.source.is_some())
    }) else {
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
        .iter()
        .find_map(|e| built.get(e.as_str()).and_then(|b| b.extractor.clone()))
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
