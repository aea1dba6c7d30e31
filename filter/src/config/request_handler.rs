//! The reference's `requestHandler` section: `parsers`, the request parser plugins, each
//! `{pluginRef: <name>}`, in order. Which parser claims which path is the runtime's
//! (`crate::openai::parsers`); here only the shape is read.

use super::validate::{as_array, as_object, only_fields, ConfigError};
use serde_json::Value;

/// `requestHandler.parsers[].pluginRef`, in order (empty or absent: the defaults, as in the
/// reference).
pub fn parse(v: &Value) -> Result<Vec<String>, ConfigError> {
    let o = as_object(v, "requestHandler")?;
    only_fields(o, "requestHandler", &["parsers"])?;
    let Some(list) = o.get("parsers").filter(|l| !l.is_null()) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (i, item) in as_array(list, "requestHandler.parsers")?.iter().enumerate() {
        out.push(super::epp::parse_plugin_ref(
            item,
            &format!("requestHandler.parsers[{i}]"),
        )?);
    }
    Ok(out)
}
