//! Plugin types by name: their roles, and the constructors that check their parameters
//! and build the [`Scheduler`] and the data-layer [`Settings`] from a [`Config`].

use crate::config::validate::{as_array, as_object, as_str, err, ConfigError, Params};
use crate::config::{quantity::parse_duration_ms, Config, PluginSpec};
use crate::datalayer::mapping::{builtin_engines, CacheInfo, Engine, Mapping, Spec};
use crate::datalayer::Settings;
use crate::prefix::PrefixConfig;
use crate::scheduler::filters::label_selector::{LabelSelector, Operator, Selector};
use crate::scheduler::filters::prefix_affinity::{PrefixAffinity, DEFAULT_PEAK_PREFILL_THROUGHPUT};
use crate::scheduler::filters::roles::{Role as PdRole, RoleFilter};
use crate::scheduler::filters::saturation::{Concurrency, Utilization};
use crate::scheduler::handlers::pd::{Decider, Disagg};
use crate::scheduler::handlers::single::Single;
use crate::scheduler::handlers::Handler;
use crate::scheduler::pickers::{
    max_endpoints, max_score::MaxScore, random::Random, weighted_random::WeightedRandom,
};
use crate::scheduler::profile::{Named, WeightedScorer};
use crate::scheduler::scorers::{
    kv_cache::KvCache, lora_affinity::LoraAffinity, no_hit_lru::NoHitLru,
    prefix_cache::PrefixCache, queue::Queue, running_requests::RunningRequests,
    session_affinity::SessionAffinity, token_load::TokenLoad,
};
use crate::scheduler::{Filter, Picker, Profile, Scheduler, Scorer};
use std::collections::BTreeMap;
use std::rc::Rc;

/// What a plugin type is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Narrows candidates.
    Filter,
    /// Scores candidates.
    Scorer,
    /// Picks among scored candidates.
    Picker,
    /// Chooses and combines profiles.
    Handler,
    /// Decides P/D disaggregation.
    Decider,
    /// Produces request data (prefix index, in-flight load).
    Producer,
    /// A metrics source.
    DataSource,
    /// A metrics extractor.
    Extractor,
    /// A saturation detector.
    Detector,
    /// A flow-control policy.
    FlowPolicy,
    /// A request parser.
    Parser,
}

impl Role {
    /// How an error message names the role.
    pub fn describe(self) -> &'static str {
        match self {
            Role::Filter => "filter",
            Role::Scorer => "scorer",
            Role::Picker => "picker",
            Role::Handler => "profile handler",
            Role::Decider => "P/D decider",
            Role::Producer => "data producer",
            Role::DataSource => "data source",
            Role::Extractor => "metrics extractor",
            Role::Detector => "saturation detector",
            Role::FlowPolicy => "flow-control policy",
            Role::Parser => "request parser",
        }
    }
}

use Role::*;

const TYPES: &[(&str, &[Role])] = &[
    ("prefix-cache-affinity-filter", &[Filter]),
    ("label-selector-filter", &[Filter]),
    ("prefill-endpoints-filter", &[Filter]),
    ("prefill-filter", &[Filter]),
    ("decode-endpoints-filter", &[Filter]),
    ("decode-filter", &[Filter]),
    ("kv-cache-utilization-scorer", &[Scorer]),
    ("queue-scorer", &[Scorer]),
    ("queue-depth-scorer", &[Scorer]),
    ("running-requests-size-scorer", &[Scorer]),
    ("token-load-scorer", &[Scorer]),
    ("lora-affinity-scorer", &[Scorer]),
    ("prefix-cache-scorer", &[Scorer]),
    ("session-affinity-scorer", &[Scorer]),
    ("no-hit-lru-scorer", &[Scorer]),
    ("max-score-picker", &[Picker]),
    ("random-picker", &[Picker]),
    ("weighted-random-picker", &[Picker]),
    ("single-profile-handler", &[Handler]),
    ("disagg-profile-handler", &[Handler]),
    ("prefix-based-pd-decider", &[Decider]),
    ("always-disagg-pd-decider", &[Decider]),
    ("approx-prefix-cache-producer", &[Producer]),
    ("inflight-load-producer", &[Producer]),
    ("metrics-data-source", &[DataSource]),
    ("core-metrics-extractor", &[Extractor]),
    ("utilization-detector", &[Detector, Filter]),
    ("concurrency-detector", &[Detector, Filter]),
    ("fcfs-ordering-policy", &[FlowPolicy]),
    ("edf-ordering-policy", &[FlowPolicy]),
    ("slo-deadline-ordering-policy", &[FlowPolicy]),
    ("global-strict-fairness-policy", &[FlowPolicy]),
    ("round-robin-fairness-policy", &[FlowPolicy]),
    ("static-usage-limit-policy", &[FlowPolicy]),
    ("openai-parser", &[Parser]),
];

/// The roles of a registered type (`None`: unknown type).
pub fn roles(type_name: &str) -> Option<&'static [Role]> {
    TYPES.iter().find(|(t, _)| *t == type_name).map(|(_, r)| *r)
}

/// Every registered type name.
pub fn type_names() -> Vec<&'static str> {
    TYPES.iter().map(|(t, _)| *t).collect()
}

/// Types whose plugins need prefix match information.
const PREFIX_CONSUMERS: &[&str] = &[
    "prefix-cache-scorer",
    "prefix-cache-affinity-filter",
    "no-hit-lru-scorer",
    "prefix-based-pd-decider",
    "approx-prefix-cache-producer",
];

#[derive(Default)]
struct Built {
    filter: Option<Rc<dyn Filter>>,
    scorer: Option<Rc<dyn Scorer>>,
    picker: Option<Rc<dyn Picker>>,
    decider: Option<Decider>,
}

fn params_path(p: &PluginSpec, i: usize) -> String {
    format!("plugins[{}].parameters", p.index.unwrap_or(i))
}

fn positive(params: &Params<'_>, name: &str, default: i64) -> Result<i64, ConfigError> {
    let v = params.i64(name, default)?;
    if v <= 0 {
        return Err(err(
            &params.path(name),
            format!("must be positive, got {v}"),
        ));
    }
    Ok(v)
}

fn unit(params: &Params<'_>, name: &str, default: f64) -> Result<f64, ConfigError> {
    let v = params.f64(name, default)?;
    if !(0.0..=1.0).contains(&v) {
        return Err(err(
            &params.path(name),
            format!("must be between 0 and 1, got {v}"),
        ));
    }
    Ok(v)
}

fn non_negative(params: &Params<'_>, name: &str, default: f64) -> Result<f64, ConfigError> {
    let v = params.f64(name, default)?;
    if v < 0.0 {
        return Err(err(
            &params.path(name),
            format!("must not be negative, got {v}"),
        ));
    }
    Ok(v)
}

const PREFIX_PARAMS: &[&str] = &[
    "autoTune",
    "blockSizeTokens",
    "blockSize",
    "maxPrefixBlocksToMatch",
    "maxPrefixTokensToMatch",
    "lruCapacityPerServer",
];

/// Parses the prefix parameters (accepted on the producer and, as in v1.4, on the scorer).
pub fn prefix_config(params: &Params<'_>) -> Result<PrefixConfig, ConfigError> {
    let d = PrefixConfig::default();
    let auto_tune = params.bool("autoTune", d.auto_tune)?;
    let block_size_tokens = match (params.get("blockSizeTokens"), params.get("blockSize")) {
        (None, Some(_)) => {
            return Err(err(
                &params.path("blockSize"),
                "is deprecated (characters); set blockSizeTokens instead",
            ))
        }
        (Some(_), _) => {
            let v = params.i64("blockSizeTokens", 16)?;
            if v <= 0 {
                return Err(err(
                    &params.path("blockSizeTokens"),
                    format!("must be positive, got {v}"),
                ));
            }
            v.unsigned_abs()
        }
        (None, None) => d.block_size_tokens,
    };
    let mut max_blocks = positive(params, "maxPrefixBlocksToMatch", 256)?.unsigned_abs();
    let max_tokens = params.i64("maxPrefixTokensToMatch", 0)?;
    if max_tokens < 0 {
        return Err(err(
            &params.path("maxPrefixTokensToMatch"),
            "must not be negative",
        ));
    }
    if max_tokens > 0 {
        max_blocks = (max_tokens.unsigned_abs() / block_size_tokens).max(1);
    }
    let lru = positive(params, "lruCapacityPerServer", 31_250)?.unsigned_abs();
    Ok(PrefixConfig {
        auto_tune,
        block_size_tokens,
        max_prefix_blocks: max_blocks,
        lru_capacity_per_server: lru,
    })
}

fn selector(params: &Params<'_>) -> Result<Selector, ConfigError> {
    let mut sel = Selector::default();
    if let Some(v) = params.get("matchLabels") {
        let path = params.path("matchLabels");
        for (k, v) in as_object(v, &path)? {
            sel.match_labels
                .insert(k.clone(), as_str(v, &format!("{path}.{k}"))?.to_string());
        }
    }
    if let Some(v) = params.get("matchExpressions") {
        let path = params.path("matchExpressions");
        for (i, e) in as_array(v, &path)?.iter().enumerate() {
            let p = format!("{path}[{i}]");
            let e = Params::new(Some(e), &p)?;
            e.finish(&["key", "operator", "values"])?;
            let key = e.string("key", "")?;
            if key.is_empty() {
                return Err(err(&e.path("key"), "missing"));
            }
            let values: Vec<String> = match e.get("values") {
                Some(v) => as_array(v, &e.path("values"))?
                    .iter()
                    .enumerate()
                    .map(|(j, x)| as_str(x, &format!("{p}.values[{j}]")).map(str::to_string))
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
                        format!(
                            "unknown operator \"{other}\"; use In, NotIn, Exists or DoesNotExist"
                        ),
                    ))
                }
            };
            sel.match_expressions.push((key, op));
        }
    }
    Ok(sel)
}

fn build_plugin(p: &PluginSpec, path: &str) -> Result<Built, ConfigError> {
    let params = Params::new(Some(&p.parameters), path)?;
    let mut b = Built::default();
    match p.type_name.as_str() {
        "prefix-cache-affinity-filter" => {
            params.finish(&[
                "affinityThreshold",
                "explorationProbability",
                "maxTTFTPenaltyMs",
                "ttftSource",
                "peakPrefillThroughput",
            ])?;
            let threshold = params.f64("affinityThreshold", 0.80)?;
            if threshold > 1.0 {
                return Err(err(
                    &params.path("affinityThreshold"),
                    format!("must be at most 1.0, got {threshold}"),
                ));
            }
            let source = params.string("ttftSource", "prefillThroughput")?;
            if source != "prefillThroughput" {
                return Err(err(
                    &params.path("ttftSource"),
                    format!("\"{source}\" is not supported; use prefillThroughput"),
                ));
            }
            let peak = params.f64("peakPrefillThroughput", DEFAULT_PEAK_PREFILL_THROUGHPUT)?;
            if peak <= 0.0 {
                return Err(err(
                    &params.path("peakPrefillThroughput"),
                    "must be positive",
                ));
            }
            b.filter = Some(Rc::new(PrefixAffinity {
                threshold,
                exploration: unit(&params, "explorationProbability", 0.01)?,
                max_ttft_penalty_ms: non_negative(&params, "maxTTFTPenaltyMs", 5000.0)?,
                peak_prefill_throughput: peak,
            }));
        }
        "label-selector-filter" => {
            params.finish(&["matchLabels", "matchExpressions"])?;
            b.filter = Some(Rc::new(LabelSelector {
                selector: selector(&params)?,
            }));
        }
        "prefill-endpoints-filter" | "prefill-filter" => {
            params.finish(&[])?;
            b.filter = Some(Rc::new(RoleFilter {
                role: PdRole::Prefill,
            }));
        }
        "decode-endpoints-filter" | "decode-filter" => {
            params.finish(&[])?;
            b.filter = Some(Rc::new(RoleFilter {
                role: PdRole::Decode,
            }));
        }
        "utilization-detector" | "concurrency-detector" => {
            // One parameter set and one formula for both roles: the flow-control
            // layer's detector (`flow_control::saturation`), placed here as a filter.
            match crate::flow_control::saturation::Detector::from_plugin(
                &p.type_name,
                &p.parameters,
                path,
            )? {
                Some(crate::flow_control::saturation::Detector::Utilization(d)) => {
                    b.filter = Some(Rc::new(Utilization(d)));
                }
                Some(crate::flow_control::saturation::Detector::Concurrency(d)) => {
                    b.filter = Some(Rc::new(Concurrency(d)));
                }
                None => {}
            }
        }
        "kv-cache-utilization-scorer" => {
            params.finish(&[])?;
            b.scorer = Some(Rc::new(KvCache));
        }
        "queue-scorer" | "queue-depth-scorer" => {
            params.finish(&[])?;
            b.scorer = Some(Rc::new(Queue));
        }
        "running-requests-size-scorer" => {
            params.finish(&[])?;
            b.scorer = Some(Rc::new(RunningRequests));
        }
        "token-load-scorer" => {
            params.finish(&["queueThresholdTokens"])?;
            b.scorer = Some(Rc::new(TokenLoad::new(
                params.i64("queueThresholdTokens", 0)?,
            )));
        }
        "lora-affinity-scorer" => {
            params.finish(&[])?;
            b.scorer = Some(Rc::new(LoraAffinity));
        }
        "prefix-cache-scorer" => {
            // v1.5+ ignores the scorer's parameters; v1.4 configs put the prefix ones here.
            params.finish(PREFIX_PARAMS)?;
            prefix_config(&params)?;
            b.scorer = Some(Rc::new(PrefixCache));
        }
        "approx-prefix-cache-producer" => {
            params.finish(PREFIX_PARAMS)?;
            prefix_config(&params)?;
        }
        "session-affinity-scorer" => {
            params.finish(&["strategy"])?;
            let s = params.string("strategy", "encoded_endpoint_header")?;
            if s != "encoded_endpoint_header" {
                return Err(err(
                    &params.path("strategy"),
                    format!("\"{s}\" is not supported; use encoded_endpoint_header"),
                ));
            }
            b.scorer = Some(Rc::new(SessionAffinity));
        }
        "no-hit-lru-scorer" => {
            params.finish(&["prefixPluginType", "prefixPluginName", "lruSize"])?;
            params.string("prefixPluginType", "prefix-cache-scorer")?;
            params.string("prefixPluginName", "prefix-cache-scorer")?;
            let size = positive(&params, "lruSize", 1024)?;
            b.scorer = Some(Rc::new(NoHitLru::new(
                usize::try_from(size).unwrap_or(1024),
            )));
        }
        "max-score-picker" | "random-picker" | "weighted-random-picker" => {
            params.finish(&["maxNumOfEndpoints"])?;
            let n = max_endpoints(params.i64("maxNumOfEndpoints", 1)?);
            b.picker = Some(match p.type_name.as_str() {
                "max-score-picker" => Rc::new(MaxScore { max_endpoints: n }) as Rc<dyn Picker>,
                "random-picker" => Rc::new(Random { max_endpoints: n }),
                _ => Rc::new(WeightedRandom { max_endpoints: n }),
            });
        }
        "single-profile-handler" => params.finish(&[])?,
        "disagg-profile-handler" => params.finish(&["profiles", "deciders", "stageOrder"])?,
        "prefix-based-pd-decider" => {
            params.finish(&["nonCachedTokens", "promptTokens"])?;
            let nc = params.i64("nonCachedTokens", 0)?;
            let pt = params.i64("promptTokens", 0)?;
            if nc < 0 || pt < 0 {
                let f = if nc < 0 {
                    "nonCachedTokens"
                } else {
                    "promptTokens"
                };
                return Err(err(&params.path(f), "must not be negative"));
            }
            b.decider = Some(Decider::PrefixBased {
                non_cached_tokens: nc.unsigned_abs(),
                prompt_tokens: pt.unsigned_abs(),
            });
        }
        "always-disagg-pd-decider" => {
            params.finish(&[])?;
            b.decider = Some(Decider::Always);
        }
        "inflight-load-producer" | "openai-parser" => params.finish(&[])?,
        "metrics-data-source" => {
            data_source(&params)?;
        }
        "core-metrics-extractor" => {
            extractor(&params)?;
        }
        "static-usage-limit-policy" => {
            params.finish(&["threshold"])?;
            non_negative(&params, "threshold", 1.0)?;
        }
        // Flow-control policies without parameters.
        _ => params.finish(&[])?,
    }
    Ok(b)
}

fn data_source(params: &Params<'_>) -> Result<Settings, ConfigError> {
    params.finish(&[
        "scheme",
        "path",
        "insecureSkipVerify",
        "refreshInterval",
        "timeout",
        "cluster",
    ])?;
    let mut s = Settings::default();
    let scheme = params.string("scheme", "http")?;
    if scheme != "http" {
        return Err(err(
            &params.path("scheme"),
            format!("\"{scheme}\" is not supported: scrapes go through an Envoy cluster over http"),
        ));
    }
    params.bool("insecureSkipVerify", true)?;
    s.path = params.string("path", "/metrics")?;
    if !s.path.starts_with('/') {
        return Err(err(&params.path("path"), "must start with /"));
    }
    let dur = |name: &str, default: &str| -> Result<u64, ConfigError> {
        let v = params.string(name, default)?;
        let ms = parse_duration_ms(&v).map_err(|e| err(&params.path(name), e))?;
        if ms == 0 {
            return Err(err(&params.path(name), "must be positive"));
        }
        Ok(ms)
    };
    s.interval_ms = dur("refreshInterval", "50ms")?;
    s.timeout_ms = dur("timeout", "1s")?;
    s.cluster = params.string("cluster", crate::datalayer::DEFAULT_CLUSTER)?;
    Ok(s)
}

fn extractor(params: &Params<'_>) -> Result<Mapping, ConfigError> {
    params.finish(&["engineLabelKey", "defaultEngine", "engineConfigs"])?;
    let mut m = Mapping {
        engine_label: params.string("engineLabelKey", crate::datalayer::mapping::ENGINE_LABEL)?,
        default_engine: params.string("defaultEngine", "vllm")?,
        engines: Vec::new(),
    };
    if let Some(list) = params.get("engineConfigs") {
        let path = params.path("engineConfigs");
        for (i, e) in as_array(list, &path)?.iter().enumerate() {
            let ep = Params::new(Some(e), &format!("{path}[{i}]"))?;
            ep.finish(&[
                "name",
                "queuedRequestsSpec",
                "runningRequestsSpec",
                "kvUsageSpec",
                "loraSpec",
                "cacheInfoSpec",
                "cacheBlockSizeLabelName",
                "cacheNumBlocksLabelName",
                "cacheBlockSizeSpec",
                "cacheNumBlocksSpec",
            ])?;
            let name = ep.string("name", "")?;
            if name.is_empty() || name == "default" {
                return Err(err(&ep.path("name"), "must be set and not \"default\""));
            }
            if m.engines.iter().any(|x| x.name == name) {
                return Err(err(
                    &ep.path("name"),
                    format!("duplicate engine \"{name}\""),
                ));
            }
            let spec = |f: &str| -> Result<Option<Spec>, ConfigError> {
                match ep.get(f) {
                    None => Ok(None),
                    Some(v) => {
                        let s = as_str(v, &ep.path(f))?;
                        if s.is_empty() {
                            return Ok(None); // an empty spec disables the metric
                        }
                        Spec::parse(s).map(Some).map_err(|e| err(&ep.path(f), e))
                    }
                }
            };
            let cache_info = match (
                spec("cacheInfoSpec")?,
                spec("cacheBlockSizeSpec")?,
                spec("cacheNumBlocksSpec")?,
            ) {
                (Some(s), _, _) => Some(CacheInfo::Labels {
                    spec: s,
                    block_size: ep.string("cacheBlockSizeLabelName", "block_size")?,
                    num_blocks: ep.string("cacheNumBlocksLabelName", "num_gpu_blocks")?,
                }),
                (None, Some(b), Some(n)) => Some(CacheInfo::Gauges {
                    block_size: b,
                    num_blocks: n,
                }),
                _ => None,
            };
            m.engines.push(Engine {
                name,
                queued: spec("queuedRequestsSpec")?,
                running: spec("runningRequestsSpec")?,
                kv_usage: spec("kvUsageSpec")?.into_iter().collect(),
                lora: spec("loraSpec")?,
                cache_info,
            });
        }
    }
    for b in builtin_engines() {
        if !m.engines.iter().any(|e| e.name == b.name) {
            m.engines.push(b);
        }
    }
    if !m.engines.iter().any(|e| e.name == m.default_engine) {
        return Err(err(
            &params.path("defaultEngine"),
            format!("unknown engine \"{}\"", m.default_engine),
        ));
    }
    Ok(m)
}

/// The data-layer settings of a validated configuration.
pub fn data_layer(config: &Config) -> Result<Settings, ConfigError> {
    let Some(source) = config.data_sources.first() else {
        return Ok(Settings {
            enabled: false,
            ..Settings::default()
        });
    };
    let mut settings = Settings::default();
    if let Some((i, p)) = config
        .plugins
        .iter()
        .enumerate()
        .find(|(_, p)| p.name == source.plugin_ref)
    {
        let path = params_path(p, i);
        settings = data_source(&Params::new(Some(&p.parameters), &path)?)?;
    }
    if let Some(e) = source.extractors.first() {
        if let Some((i, p)) = config
            .plugins
            .iter()
            .enumerate()
            .find(|(_, p)| &p.name == e)
        {
            let path = params_path(p, i);
            settings.mapping = extractor(&Params::new(Some(&p.parameters), &path)?)?;
        }
    }
    Ok(settings)
}

/// Builds the scheduler of a configuration (every plugin's parameters are checked).
pub fn build(config: &Config) -> Result<Scheduler, ConfigError> {
    let mut built: BTreeMap<&str, Built> = BTreeMap::new();
    for (i, p) in config.plugins.iter().enumerate() {
        built.insert(p.name.as_str(), build_plugin(p, &params_path(p, i))?);
    }
    let mut profiles = Vec::new();
    for (pi, spec) in config.profiles.iter().enumerate() {
        let mut filters = Vec::new();
        let mut scorers = Vec::new();
        let mut picker = None;
        for (j, r) in spec.plugins.iter().enumerate() {
            let path = format!("schedulingProfiles[{pi}].plugins[{j}].pluginRef");
            let (Some(p), Some(b)) = (
                config.plugin(&r.plugin_ref),
                built.get(r.plugin_ref.as_str()),
            ) else {
                return Err(err(
                    &path,
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
    let handler = build_handler(config, &built)?;
    // Prefix parameters: the producer's, else the first prefix-cache-scorer's, else defaults.
    let prefix = if config
        .plugins
        .iter()
        .any(|p| PREFIX_CONSUMERS.contains(&p.type_name.as_str()))
    {
        let source = config
            .plugins
            .iter()
            .enumerate()
            .find(|(_, p)| p.type_name == "approx-prefix-cache-producer")
            .or_else(|| {
                config
                    .plugins
                    .iter()
                    .enumerate()
                    .find(|(_, p)| p.type_name == "prefix-cache-scorer")
            });
        Some(match source {
            Some((i, p)) => prefix_config(&Params::new(Some(&p.parameters), &params_path(p, i))?)?,
            None => PrefixConfig::default(),
        })
    } else {
        None
    };
    data_layer(config)?;
    Ok(Scheduler {
        profiles,
        handler,
        prefix,
    })
}

fn build_handler(config: &Config, built: &BTreeMap<&str, Built>) -> Result<Handler, ConfigError> {
    let Some((i, h)) = config
        .plugins
        .iter()
        .enumerate()
        .find(|(_, p)| roles(&p.type_name).is_some_and(|r| r.contains(&Handler)))
    else {
        return Ok(Handler::Single(Single));
    };
    if h.type_name == "single-profile-handler" {
        return Ok(Handler::Single(Single));
    }
    let path = params_path(h, i);
    let params = Params::new(Some(&h.parameters), &path)?;
    let mut decode = "decode".to_string();
    let mut prefill = "prefill".to_string();
    if let Some(v) = params.get("profiles") {
        let pp = Params::new(Some(v), &params.path("profiles"))?;
        pp.finish(&["decode", "prefill", "encode"])?;
        decode = pp.string("decode", "decode")?;
        prefill = pp.string("prefill", "prefill")?;
        for (field, name) in [("decode", &decode), ("prefill", &prefill)] {
            if !config.profiles.iter().any(|p| &p.name == name) {
                return Err(err(
                    &pp.path(field),
                    format!("no scheduling profile is named \"{name}\""),
                ));
            }
        }
    } else {
        for name in [&decode, &prefill] {
            if !config.profiles.iter().any(|p| &p.name == name) {
                return Err(err(
                    &path,
                    format!("disagg-profile-handler needs a scheduling profile named \"{name}\" (or set profiles.{name})"),
                ));
            }
        }
    }
    let order = params.string("stageOrder", "decode-first")?;
    if order != "decode-first" {
        return Err(err(
            &params.path("stageOrder"),
            format!("\"{order}\" is not supported; use decode-first"),
        ));
    }
    let mut decider = Decider::Always;
    if let Some(v) = params.get("deciders") {
        let dp = Params::new(Some(v), &params.path("deciders"))?;
        dp.finish(&["prefill", "encode"])?;
        if let Some(r) = dp.get("prefill") {
            let rp = dp.path("prefill");
            let name = as_str(r, &rp)?;
            decider = built
                .get(name)
                .and_then(|b| b.decider.clone())
                .ok_or_else(|| {
                    err(
                        &rp,
                        format!("\"{name}\" is not a declared P/D decider plugin"),
                    )
                })?;
        }
    }
    Ok(Handler::Disagg(Disagg {
        decode,
        prefill,
        decider,
    }))
}
