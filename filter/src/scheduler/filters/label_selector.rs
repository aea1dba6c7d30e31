//! `label-selector-filter`: keeps endpoints whose labels match a Kubernetes label selector:
//! every `matchLabels` pair, and every `matchExpressions` entry (`In`, `NotIn`, `Exists`,
//! `DoesNotExist`; as in Kubernetes, `NotIn` matches an endpoint without the label).

use crate::config::validate::{as_array, as_object, as_str, err};
use crate::config::{ConfigError, Params};
use crate::rng::Rng;
use crate::scheduler::{Cycle, Filter};
use serde_json::Value;
use std::collections::BTreeMap;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "label-selector-filter";

/// A selector operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operator {
    /// The label's value is one of the values.
    In(Vec<String>),
    /// The label is absent or its value is none of the values.
    NotIn(Vec<String>),
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

/// A label selector.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector {
    /// Exact label values.
    pub match_labels: BTreeMap<String, String>,
    /// Expressions on label keys.
    pub match_expressions: Vec<(String, Operator)>,
}

impl Selector {
    /// Whether `labels` match.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|(k, op)| {
                let value = labels.get(k);
                match op {
                    Operator::In(vs) => value.is_some_and(|v| vs.contains(v)),
                    Operator::NotIn(vs) => value.is_none_or(|v| !vs.contains(v)),
                    Operator::Exists => value.is_some(),
                    Operator::DoesNotExist => value.is_none(),
                }
            })
    }
}

/// The label-selector filter.
#[derive(Debug)]
pub struct LabelSelector {
    /// The selector.
    pub selector: Selector,
}

impl Filter for LabelSelector {
    fn filter(&self, cx: &Cycle<'_>, endpoints: Vec<usize>, _rng: &mut Rng) -> Vec<usize> {
        endpoints
            .into_iter()
            .filter(|&i| {
                cx.candidate(i)
                    .is_some_and(|c| self.selector.matches(&c.labels))
            })
            .collect()
    }
}

impl LabelSelector {
    /// Builds the filter from its `parameters`: `matchLabels` and `matchExpressions`.
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(Some(v), path, &["matchLabels", "matchExpressions"])?;
        let mut selector = Selector::default();
        if let Some(v) = p.get("matchLabels") {
            let path = p.path("matchLabels");
            for (k, v) in as_object(v, &path)? {
                selector
                    .match_labels
                    .insert(k.clone(), as_str(v, &format!("{path}.{k}"))?.to_string());
            }
        }
        if let Some(v) = p.get("matchExpressions") {
            let path = p.path("matchExpressions");
            for (i, e) in as_array(v, &path)?.iter().enumerate() {
                selector
                    .match_expressions
                    .push(expression(e, &format!("{path}[{i}]"))?);
            }
        }
        Ok(Self { selector })
    }
}

/// One `matchExpressions` entry: `{key, operator, values}`.
fn expression(v: &Value, path: &str) -> Result<(String, Operator), ConfigError> {
    let e = Params::new(Some(v), path, &["key", "operator", "values"])?;
    let key = e.string("key", "")?;
    if key.is_empty() {
        return Err(err(&e.path("key"), "missing"));
    }
    let values: Vec<String> = match e.get("values") {
        Some(v) => as_array(v, &e.path("values"))?
            .iter()
            .enumerate()
            .map(|(j, x)| as_str(x, &format!("{path}.values[{j}]")).map(str::to_string))
            .collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    let op = match e.string("operator", "")?.as_str() {
        "In" => Operator::In(values),
        "NotIn" => Operator::NotIn(values),
        "Exists" => Operator::Exists,
        "DoesNotExist" => Operator::DoesNotExist,
        other => {
            return Err(err(
                &e.path("operator"),
                format!("unknown operator \"{other}\"; use In, NotIn, Exists or DoesNotExist"),
            ))
        }
    };
    Ok((key, op))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn match_labels_and_expressions() {
        let mut c = candidates(&[(0, 0, 0.0); 4]);
        let set = |c: &mut crate::scheduler::Candidate, k: &str, v: &str| {
            c.labels.insert(k.into(), v.into());
        };
        set(&mut c[0], "zone", "a");
        set(&mut c[0], "gpu", "h100");
        set(&mut c[1], "zone", "b");
        set(&mut c[1], "gpu", "h100");
        set(&mut c[2], "zone", "a");
        let f = LabelSelector {
            selector: Selector {
                match_labels: [("zone".to_string(), "a".to_string())].into(),
                match_expressions: vec![("gpu".into(), Operator::Exists)],
            },
        };
        let mut rng = Rng::new(0);
        assert_eq!(
            with_cycle(&c, &[], |cx| f.filter(cx, all(&c), &mut rng)),
            vec![0]
        );
        let f = LabelSelector {
            selector: Selector {
                match_labels: BTreeMap::new(),
                match_expressions: vec![("zone".into(), Operator::NotIn(vec!["a".into()]))],
            },
        };
        assert_eq!(
            with_cycle(&c, &[], |cx| f.filter(cx, all(&c), &mut rng)),
            vec![1, 3],
            "NotIn keeps endpoints without the label"
        );
        let f = LabelSelector {
            selector: Selector {
                match_labels: BTreeMap::new(),
                match_expressions: vec![
                    ("zone".into(), Operator::In(vec!["a".into(), "b".into()])),
                    ("gpu".into(), Operator::DoesNotExist),
                ],
            },
        };
        assert_eq!(
            with_cycle(&c, &[], |cx| f.filter(cx, all(&c), &mut rng)),
            vec![2]
        );
    }
}
