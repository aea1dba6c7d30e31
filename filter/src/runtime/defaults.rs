//! The reference's defaulting (`defaults.go`) and the checks between sections: names
//! default to types, weights to 1; no `plugins` means the default profile; a profile
//! without a picker gets one; one profile gets `single-profile-handler`; the default
//! saturation detector, data source and extractor are added when not declared; every
//! reference names a declared plugin of the right role.
//!
//! The default profile (no configuration, or no `plugins`) is the reference's —
//! queue-scorer 2, kv-cache-utilization-scorer 2, prefix-cache-scorer 3, max-score-picker —
//! with the reference's default `utilization-detector` also placed in it as a filter (a
//! deliberate difference: with the 3:2:2 weights alone, an endpoint that matches ≥ 67 % of
//! a prompt wins whatever its queue, so a hot prefix group piles onto one server —
//! `scripts/bench quality-sim --zipf 1.1`: TTFT p90 12 s → 0.12 s at 32 QPS). Its filter
//! role leaves out an endpoint with KV ≥ 80 %, or with 5+ waiting and more than
//! [`QUEUE_DEPTH_MEAN_FACTOR`] × the pool's mean queue, while others are below (all are
//! kept if none is). The relative bound matters past capacity, where every queue is above
//! 5: the reference's absolute bound alone then sends requests to whichever server last
//! scraped below 5, away from their prefix (`scripts/bench quality-sim --qps 64`: TTFT
//! p50 3.8 s with it, 2.0 s with the relative bound).

use super::Resolved;
use crate::config::validate::err;
use crate::config::{
    ConfigError, EndpointPickerConfig, PluginSpec, ProfilePlugin, ProfileSpec, SourceSpec,
};
use crate::datalayer::{mapping, source};
use crate::flow_control::saturation::utilization;
use crate::openai;
use crate::registry::{self, Role};
use crate::scheduler::handlers::single;
use crate::scheduler::pickers::max_score;
use crate::scheduler::scorers::{kv_cache, prefix_cache, queue};
use serde_json::Value;

fn plugin(type_name: &str) -> PluginSpec {
    PluginSpec {
        type_name: type_name.to_string(),
        name: type_name.to_string(),
        parameters: Value::Null,
        index: None,
    }
}

/// The default profile's `utilization-detector` `queueDepthMeanFactor`.
pub const QUEUE_DEPTH_MEAN_FACTOR: f64 = 2.0;

fn weighted(name: &str, weight: f64) -> ProfilePlugin {
    ProfilePlugin {
        plugin_ref: name.to_string(),
        weight: Some(weight),
    }
}

/// Applies the defaults to `doc` and checks every reference between its sections.
pub fn resolve(doc: &EndpointPickerConfig) -> Result<Resolved, ConfigError> {
    let mut plugins = doc.plugins.clone().unwrap_or_default();
    let mut profiles = doc.profiles.clone();
    if doc.plugins.is_none() && profiles.is_empty() {
        let mut detector = plugin(utilization::TYPE);
        detector.parameters = serde_json::json!({"queueDepthMeanFactor": QUEUE_DEPTH_MEAN_FACTOR});
        plugins.push(detector);
        for t in [queue::TYPE, kv_cache::TYPE, prefix_cache::TYPE] {
            plugins.push(plugin(t));
        }
        profiles.push(ProfileSpec {
            name: "default".to_string(),
            plugins: vec![
                ProfilePlugin {
                    plugin_ref: utilization::TYPE.to_string(),
                    weight: None,
                },
                weighted(queue::TYPE, 2.0),
                weighted(kv_cache::TYPE, 2.0),
                weighted(prefix_cache::TYPE, 3.0),
            ],
        });
    }
    // Every declared type must be registered.
    for (i, p) in plugins.iter().enumerate() {
        if let Some(why) = registry::refused(&p.type_name) {
            return Err(err(
                &format!("plugins[{}].type", p.index.unwrap_or(i)),
                format!("\"{}\" is not supported: {why}", p.type_name),
            ));
        }
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
        ensure_saturation_detector(doc.saturation_detector.as_ref(), &mut plugins)?;
    let data_sources = ensure_data_layer(
        doc.data_sources.as_ref(),
        doc.inject_data_defaults,
        &mut plugins,
    )?;
    let parser = match &doc.parser {
        Some(name) => {
            require_role(
                &plugins,
                name,
                Role::Parser,
                "parser.pluginRef",
                &[openai::PARSER_TYPE],
            )?;
            name.clone()
        }
        None => openai::PARSER_TYPE.to_string(),
    };
    Ok(Resolved {
        plugins,
        profiles,
        feature_gates: doc.feature_gates.clone(),
        saturation_detector,
        data_sources,
        parser,
    })
}

/// Whether `p`'s type has `role`.
pub fn has_role(p: &PluginSpec, role: Role) -> bool {
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
        // order (the reference iterates a Go map, whose order varies; declaration order is
        // stable).
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
                let name = unique_name(plugins, max_score::TYPE);
                let mut p = plugin(max_score::TYPE);
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
        [] if profiles.len() == 1 => plugins.push(plugin(single::TYPE)),
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
                if (t == single::TYPE || t == single::DATA_PARALLEL_TYPE) && profiles.len() != 1 {
                    return Err(err(
                        &format!("plugins[{}]", index.unwrap_or(*one)),
                        format!(
                            "{t} runs exactly one profile, but {} are configured",
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
    declared: Option<&String>,
    plugins: &mut Vec<PluginSpec>,
) -> Result<String, ConfigError> {
    let name = match declared {
        Some(name) => {
            let name = name.clone();
            require_role(
                plugins,
                &name,
                Role::Detector,
                "saturationDetector.pluginRef",
                &[],
            )?;
            return Ok(name);
        }
        None => utilization::TYPE.to_string(),
    };
    if !plugins.iter().any(|p| p.name == name) {
        plugins.push(plugin(utilization::TYPE));
    }
    Ok(name)
}

/// The data sources: the declared ones, checked; with none declared, the default metrics
/// source and extractor. When sources are declared but none is a `metrics-data-source`
/// (e.g. only llm-d-router's `endpoint-notification-source`), the default one is added
/// after them unless `dataLayer.injectDefaults` is false, as llm-d-router's
/// `ensureDataLayer` does. `sources: []` still disables collection (our documented
/// switch; llm-d-router would inject the default there too).
fn ensure_data_layer(
    declared: Option<&Vec<SourceSpec>>,
    inject: bool,
    plugins: &mut Vec<PluginSpec>,
) -> Result<Vec<SourceSpec>, ConfigError> {
    let mut out = Vec::new();
    if let Some(sources) = declared {
        for (i, s) in sources.iter().enumerate() {
            let path = format!("dataLayer.sources[{i}].pluginRef");
            require_role(plugins, &s.plugin_ref, Role::DataSource, &path, &[])?;
            for (j, e) in s.extractors.iter().enumerate() {
                let path = format!("dataLayer.sources[{i}].extractors[{j}].pluginRef");
                require_role(plugins, e, Role::Extractor, &path, &[])?;
            }
        }
        let has_metrics = sources.iter().any(|s| {
            plugins
                .iter()
                .any(|p| p.name == s.plugin_ref && p.type_name == source::TYPE)
        });
        if sources.is_empty() || has_metrics || !inject {
            return Ok(sources.clone());
        }
        out.clone_from(sources);
    }
    // The default source and extractor (`ensureDataLayer`).
    for t in [source::TYPE, mapping::EXTRACTOR_TYPE] {
        if !plugins.iter().any(|p| p.name == t) {
            plugins.push(plugin(t));
        }
    }
    let source = plugins
        .iter()
        .find(|p| p.type_name == source::TYPE)
        .map_or(source::TYPE.to_string(), |p| p.name.clone());
    let extractor = plugins
        .iter()
        .find(|p| p.type_name == mapping::EXTRACTOR_TYPE)
        .map_or(mapping::EXTRACTOR_TYPE.to_string(), |p| p.name.clone());
    out.push(SourceSpec {
        plugin_ref: source,
        extractors: vec![extractor],
    });
    Ok(out)
}
