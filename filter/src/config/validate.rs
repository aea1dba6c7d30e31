//! Helpers every part of the configuration parser uses: errors that name the field
//! path and the reason, and typed getters that produce such errors.

use serde_json::{Map, Value};
use std::fmt;

/// A configuration error: the path of the offending field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// JSON path of the field, e.g. `plugins[2].type`; empty for the document itself.
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

/// Builds a [`ConfigError`].
pub fn err(path: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        path: path.to_string(),
        reason: reason.into(),
    }
}

/// `parent.child`, or `child` at the top.
pub fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

/// The value as an object.
pub fn as_object<'a>(v: &'a Value, path: &str) -> Result<&'a Map<String, Value>, ConfigError> {
    v.as_object().ok_or_else(|| err(path, "must be an object"))
}

/// The value as a string.
pub fn as_str<'a>(v: &'a Value, path: &str) -> Result<&'a str, ConfigError> {
    v.as_str().ok_or_else(|| err(path, "must be a string"))
}

/// The value as a list.
pub fn as_array<'a>(v: &'a Value, path: &str) -> Result<&'a Vec<Value>, ConfigError> {
    v.as_array().ok_or_else(|| err(path, "must be a list"))
}

/// Refuses any field not in `known`.
pub fn only_fields(
    obj: &Map<String, Value>,
    path: &str,
    known: &[&str],
) -> Result<(), ConfigError> {
    for key in obj.keys() {
        if !known.contains(&key.as_str()) {
            let expected = if known.is_empty() {
                "this plugin takes no parameters".to_string()
            } else {
                format!("expected one of: {}", known.join(", "))
            };
            return Err(err(&join(path, key), format!("unknown field; {expected}")));
        }
    }
    Ok(())
}

/// Typed access to a plugin's `parameters` object — the one way a plugin reads its
/// parameters: [`Params::new`] refuses fields the plugin does not know, and every getter
/// checks the type and names the field in its error.
pub struct Params<'a> {
    obj: Option<&'a Map<String, Value>>,
    path: String,
}

impl<'a> Params<'a> {
    /// `v` is the `parameters` value (null or absent means none), `path` its path,
    /// `known` every field the plugin accepts (any other is an error).
    pub fn new(v: Option<&'a Value>, path: &str, known: &[&str]) -> Result<Self, ConfigError> {
        let obj = match v {
            None | Some(Value::Null) => None,
            Some(v) => Some(as_object(v, path)?),
        };
        if let Some(o) = obj {
            only_fields(o, path, known)?;
        }
        Ok(Self {
            obj,
            path: path.to_string(),
        })
    }

    /// The path of field `name`.
    pub fn path(&self, name: &str) -> String {
        join(&self.path, name)
    }

    /// The raw value of field `name`, if present and not null.
    pub fn get(&self, name: &str) -> Option<&'a Value> {
        self.obj.and_then(|o| o.get(name)).filter(|v| !v.is_null())
    }

    /// A number (integer or float).
    pub fn f64(&self, name: &str, default: f64) -> Result<f64, ConfigError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .ok_or_else(|| err(&self.path(name), "must be a number")),
        }
    }

    /// A number, if present.
    pub fn number(&self, name: &str) -> Result<Option<f64>, ConfigError> {
        self.get(name).map(|_| self.f64(name, 0.0)).transpose()
    }

    /// An integer.
    pub fn i64(&self, name: &str, default: i64) -> Result<i64, ConfigError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v
                .as_i64()
                .ok_or_else(|| err(&self.path(name), "must be an integer")),
        }
    }

    /// A boolean.
    pub fn bool(&self, name: &str, default: bool) -> Result<bool, ConfigError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| err(&self.path(name), "must be true or false")),
        }
    }

    /// A string.
    pub fn string(&self, name: &str, default: &str) -> Result<String, ConfigError> {
        match self.get(name) {
            None => Ok(default.to_string()),
            Some(v) => Ok(as_str(v, &self.path(name))?.to_string()),
        }
    }

    /// A positive integer.
    pub fn positive(&self, name: &str, default: i64) -> Result<i64, ConfigError> {
        let v = self.i64(name, default)?;
        if v <= 0 {
            return Err(err(&self.path(name), format!("must be positive, got {v}")));
        }
        Ok(v)
    }

    /// A number between 0 and 1.
    pub fn unit(&self, name: &str, default: f64) -> Result<f64, ConfigError> {
        let v = self.f64(name, default)?;
        if !(0.0..=1.0).contains(&v) {
            return Err(err(
                &self.path(name),
                format!("must be between 0 and 1, got {v}"),
            ));
        }
        Ok(v)
    }

    /// A number that is not negative.
    pub fn non_negative(&self, name: &str, default: f64) -> Result<f64, ConfigError> {
        let v = self.f64(name, default)?;
        if v < 0.0 {
            return Err(err(
                &self.path(name),
                format!("must not be negative, got {v}"),
            ));
        }
        Ok(v)
    }

    /// A string that must equal `only` (a parameter whose other values are not supported).
    pub fn only(&self, name: &str, only: &str) -> Result<(), ConfigError> {
        let v = self.string(name, only)?;
        if v != only {
            return Err(err(
                &self.path(name),
                format!("\"{v}\" is not supported; use {only}"),
            ));
        }
        Ok(())
    }
}
