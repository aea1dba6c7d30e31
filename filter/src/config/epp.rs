//! The reference's `EndpointPickerConfig` sections: `plugins`, `schedulingProfiles`,
//! `featureGates`, `saturationDetector`, `flowControl`, `dataLayer` and `parser`, read
//! strictly (unknown fields are errors) into plain specs. Plugin parameters are checked
//! by each plugin's constructor (`crate::registry`).

use super::quantity::parse_quantity;
use super::validate::{as_array, as_object, as_str, err, only_fields, ConfigError};
use serde_json::Value;

/// Registered feature gates (an unknown gate is an error, as in the reference).
pub const FEATURE_GATES: &[&str] = &["dataLayer", "enableLegacyMetrics", "flowControl"];
/// Largest scorer weight accepted.
pub const MAX_WEIGHT: f64 = 1_000_000.0;

/// A declared plugin.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginSpec {
    /// Registered type name, e.g. `queue-scorer`.
    pub type_name: String,
    /// Unique name (defaults to the type).
    pub name: String,
    /// The plugin's parameters (`null` when none).
    pub parameters: Value,
    /// Index in `plugins[]`, for error paths (`None` for plugins added by defaulting).
    pub index: Option<usize>,
}

/// A plugin placed in a profile.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfilePlugin {
    /// Name of a declared plugin.
    pub plugin_ref: String,
    /// Scorer weight (default 1.0).
    pub weight: Option<f64>,
}

/// A scheduling profile.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileSpec {
    /// Profile name.
    pub name: String,
    /// Its plugins, in order.
    pub plugins: Vec<ProfilePlugin>,
}

/// One data source and its extractors.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceSpec {
    /// Name of a declared data-source plugin.
    pub plugin_ref: String,
    /// Names of declared extractor plugins.
    pub extractors: Vec<String>,
}

/// Parses `plugins[]`. Names default to the type; duplicates are errors.
pub fn parse_plugins(v: &Value) -> Result<Vec<PluginSpec>, ConfigError> {
    let mut out: Vec<PluginSpec> = Vec::new();
    for (i, item) in as_array(v, "plugins")?.iter().enumerate() {
        let path = format!("plugins[{i}]");
        let o = as_object(item, &path)?;
        only_fields(o, &path, &["type", "name", "parameters"])?;
        let type_name = o.get("type").ok_or_else(|| {
            err(
                &format!("{path}.type"),
                "missing: every plugin needs a type",
            )
        })?;
        let type_name = as_str(type_name, &format!("{path}.type"))?.to_string();
        let name = match o.get("name") {
            Some(n) => as_str(n, &format!("{path}.name"))?.to_string(),
            None => type_name.clone(),
        };
        if name.is_empty() {
            return Err(err(&format!("{path}.name"), "must not be empty"));
        }
        if let Some(prev) = out.iter().find(|p| p.name == name) {
            let first = prev.index.unwrap_or(0);
            return Err(err(
                &format!("{path}.name"),
                format!("duplicate plugin name \"{name}\" (also plugins[{first}])"),
            ));
        }
        out.push(PluginSpec {
            type_name,
            name,
            parameters: o.get("parameters").cloned().unwrap_or(Value::Null),
            index: Some(i),
        });
    }
    Ok(out)
}

/// Parses `schedulingProfiles[]`.
pub fn parse_profiles(v: &Value) -> Result<Vec<ProfileSpec>, ConfigError> {
    let mut out: Vec<ProfileSpec> = Vec::new();
    for (i, item) in as_array(v, "schedulingProfiles")?.iter().enumerate() {
        let path = format!("schedulingProfiles[{i}]");
        let o = as_object(item, &path)?;
        only_fields(o, &path, &["name", "plugins"])?;
        let name = o.get("name").ok_or_else(|| {
            err(
                &format!("{path}.name"),
                "missing: every profile needs a name",
            )
        })?;
        let name = as_str(name, &format!("{path}.name"))?.to_string();
        if name.is_empty() {
            return Err(err(&format!("{path}.name"), "must not be empty"));
        }
        if out.iter().any(|p| p.name == name) {
            return Err(err(
                &format!("{path}.name"),
                format!("duplicate profile name \"{name}\""),
            ));
        }
        let mut plugins = Vec::new();
        if let Some(list) = o.get("plugins") {
            for (j, p) in as_array(list, &format!("{path}.plugins"))?
                .iter()
                .enumerate()
            {
                let ppath = format!("{path}.plugins[{j}]");
                let po = as_object(p, &ppath)?;
                only_fields(po, &ppath, &["pluginRef", "weight"])?;
                let r = po
                    .get("pluginRef")
                    .ok_or_else(|| err(&format!("{ppath}.pluginRef"), "missing"))?;
                let plugin_ref = as_str(r, &format!("{ppath}.pluginRef"))?.to_string();
                let weight = match po.get("weight") {
                    None | Some(Value::Null) => None,
                    Some(w) => {
                        let wp = format!("{ppath}.weight");
                        let w = w.as_f64().ok_or_else(|| err(&wp, "must be a number"))?;
                        if !(0.0..=MAX_WEIGHT).contains(&w) {
                            return Err(err(
                                &wp,
                                format!("{w} is out of range: must be between 0 and {MAX_WEIGHT}"),
                            ));
                        }
                        Some(w)
                    }
                };
                plugins.push(ProfilePlugin { plugin_ref, weight });
            }
        }
        out.push(ProfileSpec { name, plugins });
    }
    Ok(out)
}

/// Parses `featureGates` (a list of registered gate names).
pub fn parse_feature_gates(v: &Value) -> Result<Vec<String>, ConfigError> {
    let mut out = Vec::new();
    for (i, g) in as_array(v, "featureGates")?.iter().enumerate() {
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
        out.push(g.to_string());
    }
    Ok(out)
}

/// Parses a `{pluginRef: name}` object.
pub fn parse_plugin_ref(v: &Value, path: &str) -> Result<String, ConfigError> {
    let o = as_object(v, path)?;
    only_fields(o, path, &["pluginRef"])?;
    let r = o
        .get("pluginRef")
        .ok_or_else(|| err(&format!("{path}.pluginRef"), "missing"))?;
    Ok(as_str(r, &format!("{path}.pluginRef"))?.to_string())
}

/// Reads an optional quantity field (`null` or absent: 0).
pub(crate) fn quantity(v: Option<&Value>, path: &str) -> Result<u64, ConfigError> {
    match v {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) => n
            .as_u64()
            .ok_or_else(|| err(path, "must be a non-negative quantity")),
        Some(Value::String(s)) => parse_quantity(s).map_err(|e| err(path, e)),
        Some(_) => Err(err(path, "must be a quantity such as 500, 1k or 10Gi")),
    }
}

/// The `dataLayer` section.
#[derive(Debug, Clone, PartialEq)]
pub struct DataLayerSpec {
    /// `sources`.
    pub sources: Vec<SourceSpec>,
    /// `injectDefaults` (default true).
    pub inject_defaults: bool,
}

/// Parses `dataLayer` (`sources: [{pluginRef, extractors: [{pluginRef}]}]`,
/// `injectDefaults`).
pub fn parse_data_layer(v: &Value) -> Result<DataLayerSpec, ConfigError> {
    let o = as_object(v, "dataLayer")?;
    only_fields(o, "dataLayer", &["sources", "injectDefaults"])?;
    let inject_defaults = match o.get("injectDefaults") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(err("dataLayer.injectDefaults", "must be true or false")),
    };
    let mut out = Vec::new();
    let Some(list) = o.get("sources") else {
        return Ok(DataLayerSpec {
            sources: out,
            inject_defaults,
        });
    };
    for (i, s) in as_array(list, "dataLayer.sources")?.iter().enumerate() {
        let path = format!("dataLayer.sources[{i}]");
        let so = as_object(s, &path)?;
        only_fields(so, &path, &["pluginRef", "extractors"])?;
        let r = so
            .get("pluginRef")
            .ok_or_else(|| err(&format!("{path}.pluginRef"), "missing"))?;
        let plugin_ref = as_str(r, &format!("{path}.pluginRef"))?.to_string();
        let mut extractors = Vec::new();
        if let Some(list) = so.get("extractors") {
            for (j, e) in as_array(list, &format!("{path}.extractors"))?
                .iter()
                .enumerate()
            {
                extractors.push(parse_plugin_ref(e, &format!("{path}.extractors[{j}]"))?);
            }
        }
        out.push(SourceSpec {
            plugin_ref,
            extractors,
        });
    }
    Ok(DataLayerSpec {
        sources: out,
        inject_defaults,
    })
}
