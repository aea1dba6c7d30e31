//! Every plugin type the configuration may name, in one table: its type name, its roles
//! and its constructor. A plugin's own file owns its type name, its parameters (read
//! with [`Params`](crate::config::Params), which refuses unknown fields) and its tests;
//! adding a plugin is that file plus one line in [`TYPES`].

use crate::config::{ConfigError, Params};
use crate::datalayer::mapping::{self, Mapping};
use crate::datalayer::notifications;
use crate::datalayer::{source, Settings};
use crate::flow_control::config::STATIC_USAGE_LIMIT_POLICY;
use crate::flow_control::fairness::{global_strict, program_aware, round_robin};
use crate::flow_control::ordering::{edf, fcfs, slo_deadline};
use crate::flow_control::saturation::{concurrency, utilization, Detector};
use crate::flow_control::usage_limit::SOFT_REFLECTIVE_CEILING_POLICY;
use crate::latency::{self, producer};
use crate::prefix::{self, PrefixConfig};
use crate::prefix::{burst, token_producer};
use crate::scheduler::filters::label_selector::{self, LabelSelector};
use crate::scheduler::filters::prefix_affinity::{self, PrefixAffinity};
use crate::scheduler::filters::rendezvous_home::{self, RendezvousHome};
use crate::scheduler::filters::roles::{self, Role as PdRole, RoleFilter};
use crate::scheduler::filters::saturation;
use crate::scheduler::filters::session_affinity as session_filter;
use crate::scheduler::filters::slo_tier::{self, PassThrough, SloTier};
use crate::scheduler::filters::topology_affinity;
use crate::scheduler::handlers::{pd, single, slo_aware};
use crate::scheduler::pickers::{max_score, random, weighted_random};
use crate::scheduler::scorers::topology_affinity as topology_scorer;
use crate::scheduler::scorers::{
    active_request, kv_cache, latency as latency_scorer, load_aware, lora_affinity, no_hit_lru,
    precise_prefix_cache, prefix_cache, queue, running_requests, session_affinity, token_load,
};
use crate::scheduler::{Filter, Picker, Scorer};
use crate::{inflight, openai};
use serde_json::Value;
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
    /// An admission check after predictions (`latency-slo-admitter`).
    Admitter,
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
            Role::Admitter => "admitter",
        }
    }
}

/// One configured plugin, built: whatever it contributes to the runtime.
#[derive(Default)]
pub struct Built {
    /// Its filter, when it narrows candidates in a profile.
    pub filter: Option<Rc<dyn Filter>>,
    /// Its scorer.
    pub scorer: Option<Rc<dyn Scorer>>,
    /// Its picker.
    pub picker: Option<Rc<dyn Picker>>,
    /// Its P/D decider.
    pub decider: Option<pd::Decider>,
    /// Its saturation detector (flow control and legacy admission).
    pub detector: Option<Detector>,
    /// Its metrics-source settings.
    pub source: Option<Settings>,
    /// Its metrics mapping.
    pub extractor: Option<Mapping>,
    /// The prefix-index parameters it carries.
    pub prefix: Option<PrefixConfig>,
    /// `precise-prefix-cache-scorer`'s relay settings.
    pub precise: Option<prefix::precise::PreciseConfig>,
    /// Whether it reads prefix match information (the index is kept only if some
    /// plugin does).
    pub reads_prefix: bool,
    /// The latency predictor's settings (a latency producer).
    pub latency: Option<latency::Settings>,
    /// It needs a latency producer (SLO filters, scorers, the admitter).
    pub needs_latency: bool,
    /// It is the SLO admitter.
    pub slo_admitter: bool,
    /// The probabilistic admitter's settings.
    pub probabilistic: Option<crate::flow_control::probabilistic::Probabilistic>,
}

type Build = fn(&Value, &str) -> Result<Built, ConfigError>;

/// A registered plugin type.
pub struct PluginType {
    /// The type name (`plugins[].type`).
    pub name: &'static str,
    /// What it can be used for.
    pub roles: &'static [Role],
    /// Builds one from its `parameters` and their path (for errors).
    pub build: Build,
}

const fn t(name: &'static str, roles: &'static [Role], build: Build) -> PluginType {
    PluginType { name, roles, build }
}

fn filter(f: impl Filter + 'static) -> Built {
    Built {
        filter: Some(Rc::new(f)),
        ..Built::default()
    }
}

fn scorer(s: impl Scorer + 'static) -> Built {
    Built {
        scorer: Some(Rc::new(s)),
        ..Built::default()
    }
}

fn picker(p: impl Picker + 'static) -> Built {
    Built {
        picker: Some(Rc::new(p)),
        ..Built::default()
    }
}

fn decider(d: pd::Decider) -> Built {
    Built {
        reads_prefix: matches!(d, pd::Decider::PrefixBased { .. }),
        decider: Some(d),
        ..Built::default()
    }
}

/// A detector: a flow-control detector that, placed in a profile, also filters.
fn detector(d: Detector) -> Built {
    Built {
        filter: Some(saturation::filter_of(&d)),
        detector: Some(d),
        ..Built::default()
    }
}

/// A type with nothing to build and no parameters.
fn no_parameters(v: &Value, path: &str) -> Result<Built, ConfigError> {
    Params::new(Some(v), path, &[])?;
    Ok(Built::default())
}

fn reading_prefix(mut b: Built) -> Built {
    b.reads_prefix = true;
    b
}

fn needing_latency(mut b: Built) -> Built {
    b.needs_latency = true;
    b
}

fn latency_producer(v: &Value, p: &str, in_profiles: bool) -> Result<Built, ConfigError> {
    let settings = latency::Settings::from_parameters(v, p)?;
    let mut b = if in_profiles {
        filter(PassThrough)
    } else {
        Built::default()
    };
    b.latency = Some(settings);
    Ok(b)
}

fn prefix_scorer(v: &Value, path: &str) -> Result<Built, ConfigError> {
    let (s, config) = prefix_cache::PrefixCache::from_parameters(v, path)?;
    Ok(Built {
        prefix: Some(config),
        ..reading_prefix(scorer(s))
    })
}

fn precise_producer(v: &Value, path: &str) -> Result<Built, ConfigError> {
    Ok(reading_prefix(Built {
        precise: Some(prefix::precise::PreciseConfig::from_parameters(v, path)?),
        ..Built::default()
    }))
}

fn token_producer(v: &Value, path: &str) -> Result<Built, ConfigError> {
    token_producer::check(v, path).map(|()| Built::default())
}

fn precise_scorer(v: &Value, path: &str) -> Result<Built, ConfigError> {
    let (s, config) = precise_prefix_cache::PrecisePrefixCache::from_parameters(v, path)?;
    Ok(Built {
        precise: Some(config),
        ..reading_prefix(scorer(s))
    })
}

use Role::*;

/// Every plugin type, one line each.
#[rustfmt::skip]
pub const TYPES: &[PluginType] = &[
    t(prefix_affinity::TYPE, &[Filter], |v, p| Ok(reading_prefix(filter(PrefixAffinity::from_parameters(v, p)?)))),
    t(rendezvous_home::TYPE, &[Filter], |v, p| Ok(reading_prefix(filter(RendezvousHome::from_parameters(v, p)?)))),
    t(label_selector::TYPE, &[Filter], |v, p| Ok(filter(LabelSelector::from_parameters(v, p)?))),
    t(roles::PREFILL_TYPES[0], &[Filter], |v, p| Ok(filter(RoleFilter::from_parameters(PdRole::Prefill, v, p)?))),
    t(roles::PREFILL_TYPES[1], &[Filter], |v, p| Ok(filter(RoleFilter::from_parameters(PdRole::Prefill, v, p)?))),
    t(roles::DECODE_TYPES[0], &[Filter], |v, p| Ok(filter(RoleFilter::from_parameters(PdRole::Decode, v, p)?))),
    t(roles::DECODE_TYPES[1], &[Filter], |v, p| Ok(filter(RoleFilter::from_parameters(PdRole::Decode, v, p)?))),
    t(roles::ENCODE_TYPE, &[Filter], |v, p| Ok(filter(RoleFilter::from_parameters(PdRole::Encode, v, p)?))),
    t(kv_cache::TYPE, &[Scorer], |v, p| Ok(scorer(kv_cache::KvCache::from_parameters(v, p)?))),
    t(queue::TYPE, &[Scorer], |v, p| Ok(scorer(queue::Queue::from_parameters(v, p)?))),
    t(queue::ALIAS, &[Scorer], |v, p| Ok(scorer(queue::Queue::from_parameters(v, p)?))),
    t(running_requests::TYPE, &[Scorer], |v, p| Ok(scorer(running_requests::RunningRequests::from_parameters(v, p)?))),
    t(load_aware::TYPE, &[Scorer], |v, p| Ok(scorer(load_aware::LoadAware::from_parameters(v, p)?))),
    t(active_request::TYPE, &[Scorer], |v, p| Ok(scorer(active_request::ActiveRequest::from_parameters(v, p)?))),
    t(token_load::TYPE, &[Scorer], |v, p| Ok(scorer(token_load::TokenLoad::from_parameters(v, p)?))),
    t(lora_affinity::TYPE, &[Scorer], |v, p| Ok(scorer(lora_affinity::LoraAffinity::from_parameters(v, p)?))),
    t(prefix_cache::TYPE, &[Scorer], prefix_scorer),
    t(prefix_cache::ALIAS, &[Scorer], prefix_scorer),
    t(precise_prefix_cache::TYPE, &[Scorer], precise_scorer),
    t(session_affinity::TYPE, &[Scorer], |v, p| Ok(scorer(session_affinity::SessionAffinity::from_parameters(v, p)?))),
    t(session_filter::TYPE, &[Filter], |v, p| Ok(filter(session_filter::SessionAffinity::from_parameters(v, p)?))),
    t(topology_affinity::TYPE, &[Filter], |v, p| Ok(filter(topology_affinity::TopologyAffinity::from_parameters(v, p)?))),
    t(topology_scorer::TYPE, &[Scorer], |v, p| Ok(scorer(topology_scorer::TopologyAffinity::from_parameters(v, p)?))),
    t(topology_affinity::EXTRACTOR_TYPE, &[Extractor], |v, p| topology_affinity::Labels::from_parameters(v, p).map(|_| Built::default())),
    t(no_hit_lru::TYPE, &[Scorer], |v, p| Ok(reading_prefix(scorer(no_hit_lru::NoHitLru::from_parameters(v, p)?)))),
    t(max_score::TYPE, &[Picker], |v, p| Ok(picker(max_score::MaxScore::from_parameters(v, p)?))),
    t(random::TYPE, &[Picker], |v, p| Ok(picker(random::Random::from_parameters(v, p)?))),
    t(weighted_random::TYPE, &[Picker], |v, p| Ok(picker(weighted_random::WeightedRandom::from_parameters(v, p)?))),
    t(single::TYPE, &[Handler], no_parameters),
    t(single::DATA_PARALLEL_TYPE, &[Handler], |v, p| single::data_parallel(v, p).map(|()| Built::default())),
    // Built by the runtime, which knows the profiles and deciders; only the fields here.
    t(pd::TYPE, &[Handler], |v, p| Params::new(Some(v), p, pd::PARAMETERS).map(|_| Built::default())),
    t(pd::PREFIX_BASED_DECIDER, &[Decider], |v, p| Ok(decider(pd::Decider::prefix_based(v, p)?))),
    t(pd::ALWAYS_DECIDER, &[Decider], |v, p| Ok(decider(pd::Decider::always(v, p)?))),
    t(pd::MULTIMODAL_DECIDER, &[Decider], |v, p| Ok(decider(pd::Decider::multimodal(v, p)?))),
    t(prefix::PRODUCER_TYPE, &[Producer], |v, p| {
        Ok(reading_prefix(Built { prefix: Some(PrefixConfig::from_parameters(v, p)?), ..Built::default() }))
    }),
    t(burst::TYPE, &[Producer], |v, p| Ok(reading_prefix(Built { prefix: Some(burst::from_parameters(v, p)?), ..Built::default() }))),
    t(prefix::precise::PRODUCER_TYPE, &[Producer, Extractor], precise_producer),
    t(token_producer::TYPE, &[Producer], token_producer),
    t(token_producer::ALIAS, &[Producer], token_producer),
    t(inflight::PRODUCER_TYPE, &[Producer], no_parameters),
    t(source::TYPE, &[DataSource], |v, p| Ok(Built { source: Some(Settings::from_parameters(v, p)?), ..Built::default() })),
    t(notifications::TYPE, &[DataSource], no_parameters),
    t(mapping::EXTRACTOR_TYPE, &[Extractor], |v, p| Ok(Built { extractor: Some(Mapping::from_parameters(v, p)?), ..Built::default() })),
    t(utilization::TYPE, &[Detector, Filter], |v, p| Ok(detector(Detector::Utilization(utilization::Params::parse(v, p)?)))),
    t(concurrency::TYPE, &[Detector, Filter], |v, p| Ok(detector(Detector::Concurrency(concurrency::Params::parse(v, p)?)))),
    t(fcfs::TYPE, &[FlowPolicy], no_parameters),
    t(edf::TYPE, &[FlowPolicy], no_parameters),
    t(slo_deadline::TYPE, &[FlowPolicy], no_parameters),
    t(global_strict::TYPE, &[FlowPolicy], no_parameters),
    t(round_robin::TYPE, &[FlowPolicy], no_parameters),
    t(program_aware::TYPE, &[FlowPolicy], |v, p| program_aware::Las::from_parameters(v, p).map(|_| Built::default())),
    t(SOFT_REFLECTIVE_CEILING_POLICY, &[FlowPolicy], no_parameters),
    t(STATIC_USAGE_LIMIT_POLICY, &[FlowPolicy], |v, p| {
        Params::new(Some(v), p, &["threshold"])?.non_negative("threshold", 1.0).map(|_| Built::default())
    }),
    t(openai::PARSER_TYPE, &[Parser], no_parameters),
    t(producer::TYPE, &[Producer], |v, p| latency_producer(v, p, false)),
    t(producer::TRACKER_TYPE, &[Producer, Filter], |v, p| latency_producer(v, p, true)),
    t(slo_tier::TYPE, &[Filter], |v, p| Ok(needing_latency(filter(SloTier::from_parameters(v, p)?)))),
    t(latency_scorer::TYPE, &[Scorer], |v, p| Ok(needing_latency(scorer(latency_scorer::Latency::from_parameters(v, p)?)))),
    t(latency_scorer::SLO_SCORER, &[Scorer], |v, p| Ok(needing_latency(scorer(latency_scorer::Latency::from_parameters(v, p)?)))),
    t(latency::ADMITTER_TYPE, &[Admitter], |v, p| {
        Params::new(Some(v), p, &[])?;
        Ok(Built { slo_admitter: true, ..needing_latency(Built::default()) })
    }),
    t(crate::flow_control::probabilistic::TYPE, &[Admitter], |v, p| {
        Ok(Built { probabilistic: Some(crate::flow_control::probabilistic::Probabilistic::from_parameters(v, p)?), ..Built::default() })
    }),
    // Built by the runtime, which knows the profiles; only the fields here.
    t(slo_aware::TYPE, &[Handler], |v, p| Params::new(Some(v), p, slo_aware::PARAMETERS).map(|_| Built::default())),
];

/// llm-d-router plugin types that are refused on purpose, each with the reason (named at
/// `plugins[i].type` when a configuration declares one).
pub const REFUSED: &[(&str, &str)] = &[
    ("dcgm-data-source", "GPU metrics from a DCGM exporter are not collected: the filter scrapes each endpoint's engine /metrics only; route on engine metrics (kv-cache-utilization-scorer, utilization-detector) instead"),
    ("dcgm-extractor", "GPU metrics from a DCGM exporter are not collected (see dcgm-data-source)"),
    ("endpoint-attribute-filter", "endpoint attributes come only from the engine's metrics here, and the attributes it filters on (DCGM's) are not collected; use label-selector-filter or a utilization-detector in the profile"),
    ("endpoint-attribute-scorer", "endpoint attributes come only from the engine's metrics here (see endpoint-attribute-filter); use kv-cache-utilization-scorer or queue-scorer"),
    ("mm-embeddings-cache-producer", "the filter keeps no index of the multimodal embeddings each server has cached; multimodal requests are routed on their text prefix"),
    ("mm-embeddings-cache-scorer", "needs mm-embeddings-cache-producer, which is not built (see it)"),
];

/// The reason a known type is refused, if it is.
pub fn refused(name: &str) -> Option<&'static str> {
    REFUSED
        .iter()
        .find(|(t, _)| *t == name)
        .map(|(_, why)| *why)
}

/// The registered type called `name`.
pub fn lookup(name: &str) -> Option<&'static PluginType> {
    TYPES.iter().find(|t| t.name == name)
}

/// The roles of a registered type (`None`: unknown type).
pub fn roles(type_name: &str) -> Option<&'static [Role]> {
    lookup(type_name).map(|t| t.roles)
}

/// Every registered type name.
pub fn type_names() -> Vec<&'static str> {
    TYPES.iter().map(|t| t.name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_name_is_registered_once() {
        let mut names = type_names();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a type name appears twice in TYPES");
    }

    #[test]
    fn every_type_builds_with_its_default_parameters() {
        for t in TYPES {
            // Every plugin has defaults for all its parameters.
            assert!(
                (t.build)(&Value::Null, "plugins[0].parameters").is_ok(),
                "{} does not build with defaults",
                t.name
            );
        }
    }

    #[test]
    fn unknown_parameters_are_refused_by_every_type() {
        let bad = serde_json::json!({"noSuchParameter": 1});
        for t in TYPES {
            let e = (t.build)(&bad, "plugins[3].parameters").err();
            assert_eq!(
                e.map(|e| e.path),
                Some("plugins[3].parameters.noSuchParameter".to_string()),
                "{} accepted an unknown parameter",
                t.name
            );
        }
    }
}
