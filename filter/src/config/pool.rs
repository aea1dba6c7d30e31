//! The `pool` section: what the reference keeps in Kubernetes objects (the
//! `InferencePool`'s endpoints, `InferenceObjective`s, `InferenceModelRewrite`s) and the
//! gateway-side choices (fail-open, body limit, discovery from Envoy's cluster membership,
//! where a request's fairness id and objective may come from: [`super::classification`]).

use super::classification::{parse_classification, Classification};
use super::health::{parse_passive_health, PassiveHealth};
use super::quantity::parse_duration_ms;
use super::trust::{parse_trust_headers, TrustHeaders};
use super::validate::{as_array, as_object, as_str, err, only_fields, ConfigError};
use crate::endpoint::Endpoint;
use crate::metrics::recorder::IDLE_MS;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// Default request-body limit: 4 MiB, as vLLM's simulator (`max-request-body-size-mb`).
pub const DEFAULT_MAX_REQUEST_BODY_BYTES: usize = 4 * 1024 * 1024;
/// Default pool name, used as the `name` label of pool metrics.
pub const DEFAULT_POOL_NAME: &str = "default-pool";
/// Default period of the Envoy admin `/clusters` callout.
pub const DEFAULT_DISCOVERY_REFRESH_MS: u64 = 1_000;
/// Default name of the bootstrap cluster that reaches Envoy's own admin API.
pub const DEFAULT_ADMIN_CLUSTER: &str = "epp-admin";

/// An `InferenceObjective`: a name clients send in `x-gateway-inference-objective`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Objective {
    /// The objective's name.
    pub name: String,
    /// Its priority (higher is more important; negative is sheddable).
    pub priority: i32,
}

/// One target of a model rewrite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RewriteTarget {
    /// The model the request is sent as.
    pub model_name: String,
    /// Relative weight (all 0 means uniform).
    pub weight: u32,
}

/// An `InferenceModelRewrite` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRewrite {
    /// Rule name (metric label `model_rewrite_name`).
    pub name: String,
    /// The incoming model it matches; `None` matches every model (a generic rule).
    pub model_name: Option<String>,
    /// Weighted targets.
    pub targets: Vec<RewriteTarget>,
}

/// Endpoints from Envoy's own cluster membership (the admin `/clusters?format=json`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    /// The Envoy cluster whose healthy hosts are the pool (e.g. an Istio `outbound|...` cluster).
    pub cluster: String,
    /// The bootstrap cluster that reaches Envoy's admin listener.
    pub admin_cluster: String,
    /// How often membership is read.
    pub refresh_ms: u64,
}

/// Where the filter answers Prometheus scrapes of its own metrics (in the reference's
/// names and units, merged over every Envoy worker).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsEndpoint {
    /// The local port requests must arrive on (a listener of their own: the inference
    /// listener never serves metrics).
    pub port: u16,
    /// The path (default `/metrics`).
    pub path: String,
    /// A series with a client-chosen label value (a fairness id, a model name) that
    /// nobody updated for this long leaves the exposition, then each VM's memory (ms;
    /// `idleSeriesSeconds`, default 600).
    pub idle_series_ms: i64,
}

/// Default path of [`MetricsEndpoint`].
pub const DEFAULT_METRICS_PATH: &str = "/metrics";
/// Bounds of `pool.metricsEndpoint.idleSeriesSeconds`: a series must outlive a few
/// scrape intervals, and a week is longer than any retention window needs.
const MIN_IDLE_SERIES_SECONDS: u64 = 60;
const MAX_IDLE_SERIES_SECONDS: u64 = 7 * 24 * 3600;

/// The pool of model servers the filter picks from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// Pool name (metric label `name`).
    pub name: String,
    /// Static endpoints, in configuration order.
    pub endpoints: Vec<Endpoint>,
    /// Largest request body accepted; larger bodies get 413.
    pub max_request_body_bytes: usize,
    /// Objectives by name.
    pub objectives: Vec<Objective>,
    /// Model rewrite rules.
    pub model_rewrites: Vec<ModelRewrite>,
    /// Discovery from Envoy's cluster membership, if configured.
    pub discovery: Option<Discovery>,
    /// When no endpoint can be chosen, send the request to any healthy endpoint instead of 503.
    pub fail_open: bool,
    /// Where a request's fairness id and objective come from (`classification`).
    pub classification: Classification,
    /// Outlier detection in the picker (`passiveHealth`).
    pub passive_health: PassiveHealth,
    /// The filter's own metrics endpoint, if configured.
    pub metrics_endpoint: Option<MetricsEndpoint>,
    /// Which behaviour-changing request headers are obeyed (`trustHeaders`).
    pub trust_headers: TrustHeaders,
}

impl Default for Pool {
    fn default() -> Self {
        Self {
            name: DEFAULT_POOL_NAME.to_string(),
            endpoints: Vec::new(),
            max_request_body_bytes: DEFAULT_MAX_REQUEST_BODY_BYTES,
            objectives: Vec::new(),
            model_rewrites: Vec::new(),
            discovery: None,
            fail_open: false,
            classification: Classification::default(),
            passive_health: PassiveHealth::default(),
            metrics_endpoint: None,
            trust_headers: TrustHeaders::default(),
        }
    }
}

const POOL_FIELDS: &[&str] = &[
    "name",
    "endpoints",
    "maxRequestBodyBytes",
    "objectives",
    "modelRewrites",
    "discovery",
    "failOpen",
    "classification",
    "passiveHealth",
    "metricsEndpoint",
    "trustHeaders",
];

/// Parses and validates the `pool` section.
pub fn parse_pool(v: &Value) -> Result<Pool, ConfigError> {
    let obj = as_object(v, "pool")?;
    only_fields(obj, "pool", POOL_FIELDS)?;
    let mut pool = Pool::default();
    if let Some(name) = obj.get("name") {
        let name = as_str(name, "pool.name")?;
        if name.is_empty() {
            return Err(err("pool.name", "must not be empty"));
        }
        pool.name = name.to_string();
    }
    if let Some(limit) = obj.get("maxRequestBodyBytes") {
        let n = limit
            .as_u64()
            .filter(|n| *n > 0)
            .ok_or_else(|| err("pool.maxRequestBodyBytes", "must be a positive integer"))?;
        pool.max_request_body_bytes = usize::try_from(n)
            .map_err(|_| err("pool.maxRequestBodyBytes", "is too large for this platform"))?;
    }
    if let Some(list) = obj.get("endpoints") {
        for (i, item) in as_array(list, "pool.endpoints")?.iter().enumerate() {
            let path = format!("pool.endpoints[{i}]");
            let endpoint = parse_endpoint(item, &path)?;
            if pool.endpoints.iter().any(|e| e.address == endpoint.address) {
                return Err(err(
                    &path,
                    format!("duplicate endpoint `{}`", endpoint.address),
                ));
            }
            pool.endpoints.push(endpoint);
        }
    }
    if let Some(v) = obj.get("failOpen") {
        pool.fail_open = v
            .as_bool()
            .ok_or_else(|| err("pool.failOpen", "must be true or false"))?;
    }
    if let Some(list) = obj.get("objectives") {
        for (i, item) in as_array(list, "pool.objectives")?.iter().enumerate() {
            let path = format!("pool.objectives[{i}]");
            let o = as_object(item, &path)?;
            only_fields(o, &path, &["name", "priority"])?;
            let name = o
                .get("name")
                .ok_or_else(|| err(&path, "missing field `name`"))?;
            let name = as_str(name, &format!("{path}.name"))?.to_string();
            if name.is_empty() {
                return Err(err(&format!("{path}.name"), "must not be empty"));
            }
            if pool.objectives.iter().any(|x| x.name == name) {
                return Err(err(
                    &format!("{path}.name"),
                    format!("duplicate objective `{name}`"),
                ));
            }
            let priority = match o.get("priority") {
                None => 0,
                Some(p) => p
                    .as_i64()
                    .and_then(|p| i32::try_from(p).ok())
                    .ok_or_else(|| err(&format!("{path}.priority"), "must be an integer"))?,
            };
            pool.objectives.push(Objective { name, priority });
        }
    }
    if let Some(c) = obj.get("classification") {
        pool.classification = parse_classification(c, &pool.objectives)?;
    }
    if let Some(t) = obj.get("trustHeaders") {
        pool.trust_headers = parse_trust_headers(t)?;
    }
    if let Some(h) = obj.get("passiveHealth") {
        pool.passive_health = parse_passive_health(h)?;
    }
    if let Some(list) = obj.get("modelRewrites") {
        for (i, item) in as_array(list, "pool.modelRewrites")?.iter().enumerate() {
            let path = format!("pool.modelRewrites[{i}]");
            let rule = parse_rewrite(item, &path, i)?;
            if pool.model_rewrites.iter().any(|r| r.name == rule.name) {
                return Err(err(
                    &format!("{path}.name"),
                    format!("duplicate rule `{}`", rule.name),
                ));
            }
            pool.model_rewrites.push(rule);
        }
    }
    if let Some(d) = obj.get("discovery") {
        let o = as_object(d, "pool.discovery")?;
        only_fields(
            o,
            "pool.discovery",
            &["cluster", "adminCluster", "refreshInterval"],
        )?;
        let cluster = o
            .get("cluster")
            .ok_or_else(|| err("pool.discovery", "missing field `cluster`"))?;
        let cluster = as_str(cluster, "pool.discovery.cluster")?.to_string();
        if cluster.is_empty() {
            return Err(err("pool.discovery.cluster", "must not be empty"));
        }
        let admin_cluster = match o.get("adminCluster") {
            Some(v) => as_str(v, "pool.discovery.adminCluster")?.to_string(),
            None => DEFAULT_ADMIN_CLUSTER.to_string(),
        };
        let refresh_ms = match o.get("refreshInterval") {
            Some(v) => {
                let p = "pool.discovery.refreshInterval";
                let ms = parse_duration_ms(as_str(v, p)?).map_err(|e| err(p, e))?;
                if ms == 0 {
                    return Err(err(p, "must be positive"));
                }
                ms
            }
            None => DEFAULT_DISCOVERY_REFRESH_MS,
        };
        pool.discovery = Some(Discovery {
            cluster,
            admin_cluster,
            refresh_ms,
        });
    }
    if let Some(m) = obj.get("metricsEndpoint") {
        pool.metrics_endpoint = Some(parse_metrics_endpoint(m)?);
    }
    Ok(pool)
}

fn parse_metrics_endpoint(v: &Value) -> Result<MetricsEndpoint, ConfigError> {
    let path = "pool.metricsEndpoint";
    let o = as_object(v, path)?;
    only_fields(o, path, &["port", "path", "idleSeriesSeconds"])?;
    let port = o
        .get("port")
        .ok_or_else(|| err(path, "missing field `port`"))?
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| err(&format!("{path}.port"), "must be a port number (1-65535)"))?;
    let url_path = match o.get("path") {
        Some(p) => as_str(p, &format!("{path}.path"))?.to_string(),
        None => DEFAULT_METRICS_PATH.to_string(),
    };
    if !url_path.starts_with('/') {
        return Err(err(&format!("{path}.path"), "must start with `/`"));
    }
    let idle_series_ms = match o.get("idleSeriesSeconds") {
        None => IDLE_MS,
        Some(v) => v
            .as_u64()
            .filter(|s| (MIN_IDLE_SERIES_SECONDS..=MAX_IDLE_SERIES_SECONDS).contains(s))
            .map(|s| (s * 1_000) as i64)
            .ok_or_else(|| {
                err(
                    &format!("{path}.idleSeriesSeconds"),
                    format!(
                        "must be a whole number of seconds from {MIN_IDLE_SERIES_SECONDS} to \
                         {MAX_IDLE_SERIES_SECONDS}"
                    ),
                )
            })?,
    };
    Ok(MetricsEndpoint {
        port,
        path: url_path,
        idle_series_ms,
    })
}

fn parse_rewrite(v: &Value, path: &str, index: usize) -> Result<ModelRewrite, ConfigError> {
    let o = as_object(v, path)?;
    only_fields(o, path, &["name", "modelName", "targets"])?;
    let name = match o.get("name") {
        Some(n) => as_str(n, &format!("{path}.name"))?.to_string(),
        None => format!("rewrite-{index}"),
    };
    let model_name = match o.get("modelName") {
        Some(m) => Some(as_str(m, &format!("{path}.modelName"))?.to_string()),
        None => None,
    };
    let tpath = format!("{path}.targets");
    let list = o
        .get("targets")
        .ok_or_else(|| err(path, "missing field `targets`"))?;
    let list = as_array(list, &tpath)?;
    if list.is_empty() {
        return Err(err(&tpath, "must hold at least one target"));
    }
    let mut targets = Vec::new();
    for (j, t) in list.iter().enumerate() {
        let p = format!("{tpath}[{j}]");
        let t = as_object(t, &p)?;
        only_fields(t, &p, &["modelName", "weight"])?;
        let model = t
            .get("modelName")
            .ok_or_else(|| err(&p, "missing field `modelName`"))?;
        let model_name = as_str(model, &format!("{p}.modelName"))?.to_string();
        if model_name.is_empty() {
            return Err(err(&format!("{p}.modelName"), "must not be empty"));
        }
        let weight = match t.get("weight") {
            None => 1,
            Some(w) => w
                .as_u64()
                .and_then(|w| u32::try_from(w).ok())
                .ok_or_else(|| {
                    err(
                        &format!("{p}.weight"),
                        "must be a non-negative integer below 2^32",
                    )
                })?,
        };
        targets.push(RewriteTarget { model_name, weight });
    }
    Ok(ModelRewrite {
        name,
        model_name,
        targets,
    })
}

/// Parses one endpoint: `"ip:port"` or `{address, labels}`.
pub fn parse_endpoint(v: &Value, path: &str) -> Result<Endpoint, ConfigError> {
    let (address, labels) = match v {
        Value::String(s) => (s.as_str(), BTreeMap::new()),
        Value::Object(obj) => {
            only_fields(obj, path, &["address", "labels"])?;
            let address = obj
                .get("address")
                .ok_or_else(|| err(path, "missing field `address`"))?;
            let address = as_str(address, &format!("{path}.address"))?;
            let mut labels = BTreeMap::new();
            if let Some(l) = obj.get("labels") {
                let lpath = format!("{path}.labels");
                for (k, v) in as_object(l, &lpath)? {
                    let s = as_str(v, &format!("{lpath}.{k}"))?;
                    labels.insert(k.clone(), s.to_string());
                }
            }
            (address, labels)
        }
        _ => {
            return Err(err(
                path,
                "must be an `ip:port` string or an object with `address`",
            ))
        }
    };
    let parsed: SocketAddr = address
        .parse()
        .map_err(|_| err(path, format!("`{address}` is not an `ip:port` address")))?;
    if parsed.port() == 0 {
        return Err(err(path, format!("`{address}` has port 0")));
    }
    Ok(Endpoint {
        address: parsed.to_string(),
        labels,
    })
}

impl Pool {
    /// How long a client-labelled metric series may stay idle before it expires (ms).
    pub fn idle_series_ms(&self) -> i64 {
        self.metrics_endpoint
            .as_ref()
            .map_or(IDLE_MS, |m| m.idle_series_ms)
    }

    /// The priority of objective `name` (0 for an unknown or absent objective, as the reference).
    pub fn priority_of(&self, objective: Option<&str>) -> i32 {
        self.priority(objective)
    }

    /// Same as [`Pool::priority_of`].
    pub fn priority(&self, objective: Option<&str>) -> i32 {
        objective
            .and_then(|n| self.objectives.iter().find(|o| o.name == n))
            .map_or(0, |o| o.priority)
    }

    /// The model to send for `model`: the exact-match rule first, then a generic rule,
    /// with a weighted choice among its targets (`draw` uniform in [0,1)). Returns the
    /// rule name and the target, or `None` when no rule applies.
    pub fn rewrite(&self, model: &str, draw: f64) -> Option<(&str, &str)> {
        let rule = self
            .model_rewrites
            .iter()
            .find(|r| r.model_name.as_deref() == Some(model))
            .or_else(|| self.model_rewrites.iter().find(|r| r.model_name.is_none()))?;
        let total: u64 = rule.targets.iter().map(|t| u64::from(t.weight)).sum();
        let n = rule.targets.len();
        let chosen = if total == 0 {
            let idx = ((draw * n as f64) as usize).min(n.saturating_sub(1));
            rule.targets.get(idx)
        } else {
            let mut point = draw * total as f64;
            let mut pick = rule.targets.last();
            for t in &rule.targets {
                let w = f64::from(t.weight);
                if point < w {
                    pick = Some(t);
                    break;
                }
                point -= w;
            }
            pick
        }?;
        Some((rule.name.as_str(), chosen.model_name.as_str()))
    }
}
