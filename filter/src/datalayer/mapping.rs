//! Which engine metric means what (the reference's `core-metrics-extractor`).
//!
//! | engine | waiting | running | KV usage | LoRA | block size / blocks |
//! |---|---|---|---|---|---|
//! | `vllm` (default) | `vllm:num_requests_waiting` | `vllm:num_requests_running` | `vllm:kv_cache_usage_perc`, legacy `vllm:gpu_cache_usage_perc` | `vllm:lora_requests_info` | `vllm:cache_config_info{block_size,num_gpu_blocks}` |
//! | `sglang` | `sglang:num_queue_reqs` | `sglang:num_running_reqs` | `sglang:token_usage` | — | `sglang:cache_config_info{page_size,num_pages}` |
//! | `trtllm-serve` | `trtllm_num_requests_waiting` | `trtllm_num_requests_running` | `trtllm_kv_cache_utilization` | — | `trtllm_kv_cache_tokens_per_block`, `trtllm_kv_cache_max_blocks` |
//! | `triton-tensorrt-llm` | `nv_trt_llm_request_metrics{request_type=waiting}` | `…{request_type=scheduled}` | `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}` | — | `…{kv_cache_block_type=tokens_per}`, `…{kv_cache_block_type=max}` |
//!
//! The engine of an endpoint comes from its label `inference.networking.k8s.io/engine-type`
//! (or `llm-d.ai/engine-type`), else `defaultEngine`; an unknown engine uses the default's
//! mapping. Among matching series the one with the highest timestamp wins (the first if
//! none has one); for LoRA the series with the largest value.

use super::prometheus::Sample;
use crate::config::validate::{as_array, as_str, err};
use crate::config::{ConfigError, Params};
use crate::endpoint::Metrics;
use serde_json::Value;

/// The GIE engine label.
pub const ENGINE_LABEL: &str = "inference.networking.k8s.io/engine-type";
/// The router's engine label.
pub const ROUTER_ENGINE_LABEL: &str = "llm-d.ai/engine-type";

/// A PromQL-style selector `name{label=value,...}` (only `=` matchers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// Metric name.
    pub name: String,
    /// Required label values.
    pub labels: Vec<(String, String)>,
}

impl Spec {
    /// Parses `name` or `name{l=v,l2="v2"}`.
    pub fn parse(text: &str) -> Result<Spec, String> {
        let text = text.trim();
        let (name, rest) = match text.find('{') {
            Some(i) => (text.get(..i).unwrap_or(""), text.get(i + 1..)),
            None => (text, None),
        };
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        {
            return Err(format!(
                "`{text}` is not a metric selector like name{{label=value}}"
            ));
        }
        let mut labels = Vec::new();
        if let Some(rest) = rest {
            let inner = rest
                .strip_suffix('}')
                .ok_or_else(|| format!("`{text}`: missing `}}`"))?;
            for part in inner.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let (k, v) = part
                    .split_once('=')
                    .ok_or_else(|| format!("`{text}`: `{part}` is not label=value"))?;
                if k.ends_with('!') || v.starts_with('~') {
                    return Err(format!("`{text}`: only `=` matchers are supported"));
                }
                labels.push((k.trim().to_string(), v.trim().trim_matches('"').to_string()));
            }
        }
        Ok(Spec {
            name: name.to_string(),
            labels,
        })
    }

    fn matches(&self, s: &Sample) -> bool {
        s.name == self.name
            && self
                .labels
                .iter()
                .all(|(k, v)| s.label(k) == Some(v.as_str()))
    }

    /// The chosen series' value: highest timestamp among matches, else the first.
    fn value(&self, samples: &[Sample]) -> Option<f64> {
        let mut best: Option<&Sample> = None;
        for s in samples.iter().filter(|s| self.matches(s)) {
            best = match best {
                Some(b) if b.timestamp.unwrap_or(i64::MIN) >= s.timestamp.unwrap_or(i64::MIN) => {
                    Some(b)
                }
                _ => Some(s),
            };
        }
        best.map(|s| s.value).filter(|v| v.is_finite())
    }
}

/// Cache geometry: from labels of an info metric, or from two gauges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheInfo {
    /// `metric{block_label=..., blocks_label=...}`.
    Labels {
        /// The info metric.
        spec: Spec,
        /// Label holding the block size in tokens.
        block_size: String,
        /// Label holding the number of blocks.
        num_blocks: String,
    },
    /// Two gauges.
    Gauges {
        /// Block size in tokens.
        block_size: Spec,
        /// Number of blocks.
        num_blocks: Spec,
    },
}

/// An engine's metric mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engine {
    /// Engine name.
    pub name: String,
    /// Waiting requests.
    pub queued: Option<Spec>,
    /// Running requests.
    pub running: Option<Spec>,
    /// KV usage (first match wins: current name, then legacy names).
    pub kv_usage: Vec<Spec>,
    /// LoRA info metric.
    pub lora: Option<Spec>,
    /// Cache geometry.
    pub cache_info: Option<CacheInfo>,
}

fn spec(name: &str, labels: &[(&str, &str)]) -> Spec {
    Spec {
        name: name.to_string(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

/// The built-in engines.
pub fn builtin_engines() -> Vec<Engine> {
    vec![
        Engine {
            name: "vllm".into(),
            queued: Some(spec("vllm:num_requests_waiting", &[])),
            running: Some(spec("vllm:num_requests_running", &[])),
            kv_usage: vec![
                spec("vllm:kv_cache_usage_perc", &[]),
                spec("vllm:gpu_cache_usage_perc", &[]),
            ],
            lora: Some(spec("vllm:lora_requests_info", &[])),
            cache_info: Some(CacheInfo::Labels {
                spec: spec("vllm:cache_config_info", &[]),
                block_size: "block_size".into(),
                num_blocks: "num_gpu_blocks".into(),
            }),
        },
        Engine {
            name: "sglang".into(),
            queued: Some(spec("sglang:num_queue_reqs", &[])),
            running: Some(spec("sglang:num_running_reqs", &[])),
            kv_usage: vec![spec("sglang:token_usage", &[])],
            lora: None,
            cache_info: Some(CacheInfo::Labels {
                spec: spec("sglang:cache_config_info", &[]),
                block_size: "page_size".into(),
                num_blocks: "num_pages".into(),
            }),
        },
        Engine {
            name: "trtllm-serve".into(),
            queued: Some(spec("trtllm_num_requests_waiting", &[])),
            running: Some(spec("trtllm_num_requests_running", &[])),
            kv_usage: vec![spec("trtllm_kv_cache_utilization", &[])],
            lora: None,
            cache_info: Some(CacheInfo::Gauges {
                block_size: spec("trtllm_kv_cache_tokens_per_block", &[]),
                num_blocks: spec("trtllm_kv_cache_max_blocks", &[]),
            }),
        },
        Engine {
            name: "triton-tensorrt-llm".into(),
            queued: Some(spec(
                "nv_trt_llm_request_metrics",
                &[("request_type", "waiting")],
            )),
            running: Some(spec(
                "nv_trt_llm_request_metrics",
                &[("request_type", "scheduled")],
            )),
            kv_usage: vec![spec(
                "nv_trt_llm_kv_cache_block_metrics",
                &[("kv_cache_block_type", "fraction")],
            )],
            lora: None,
            cache_info: Some(CacheInfo::Gauges {
                block_size: spec(
                    "nv_trt_llm_kv_cache_block_metrics",
                    &[("kv_cache_block_type", "tokens_per")],
                ),
                num_blocks: spec(
                    "nv_trt_llm_kv_cache_block_metrics",
                    &[("kv_cache_block_type", "max")],
                ),
            }),
        },
    ]
}

/// The mapping in force: engines by name and how an endpoint's engine is chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// Label naming an endpoint's engine.
    pub engine_label: String,
    /// Engine of endpoints without the label (and of unknown engines).
    pub default_engine: String,
    /// Every engine (configured ones replace built-ins of the same name).
    pub engines: Vec<Engine>,
}

impl Default for Mapping {
    fn default() -> Self {
        Self {
            engine_label: ENGINE_LABEL.to_string(),
            default_engine: "vllm".to_string(),
            engines: builtin_engines(),
        }
    }
}

impl Mapping {
    /// The engine for an endpoint with `labels`.
    pub fn engine_for(
        &self,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Option<&Engine> {
        let wanted = labels
            .get(&self.engine_label)
            .or_else(|| labels.get(ROUTER_ENGINE_LABEL))
            .map(String::as_str)
            .unwrap_or(&self.default_engine);
        self.engines
            .iter()
            .find(|e| e.name == wanted)
            .or_else(|| self.engines.iter().find(|e| e.name == self.default_engine))
    }
}

fn count(v: f64) -> u64 {
    if v.is_finite() && v > 0.0 {
        // Counts are small non-negative numbers; saturate beyond u64.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = v.round() as u64;
        n
    } else {
        0
    }
}

/// LoRA adapter names kept per list of a scrape, and their longest length in bytes: the
/// lists go into the snapshot record every worker reads, so a server cannot make it large.
/// (vLLM's `max_loras` is a handful; a longer name is left out, not cut, as a cut name
/// would match no request.)
pub const MAX_LORA_NAMES: usize = 64;
/// See [`MAX_LORA_NAMES`].
pub const MAX_LORA_NAME_BYTES: usize = 256;

fn csv(s: Option<&str>) -> Vec<String> {
    s.unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty() && x.len() <= MAX_LORA_NAME_BYTES)
        .take(MAX_LORA_NAMES)
        .map(str::to_string)
        .collect()
}

/// Extracts an endpoint's metrics. `None` when not one metric was found (the scrape then
/// does not count as fresh, as the reference sets `UpdateTime` only on a success).
pub fn extract(engine: &Engine, samples: &[Sample], now_ms: i64) -> Option<Metrics> {
    let mut m = Metrics::default();
    let mut found = false;
    if let Some(v) = engine.queued.as_ref().and_then(|s| s.value(samples)) {
        m.waiting = count(v);
        found = true;
    }
    if let Some(v) = engine.running.as_ref().and_then(|s| s.value(samples)) {
        m.running = count(v);
        found = true;
    }
    if let Some(v) = engine.kv_usage.iter().find_map(|s| s.value(samples)) {
        m.kv_usage = v.clamp(0.0, 1.0);
        found = true;
    }
    if let Some(spec) = &engine.lora {
        let best = samples
            .iter()
            .filter(|s| spec.matches(s))
            .max_by(|a, b| a.value.total_cmp(&b.value));
        if let Some(s) = best {
            m.active_models = csv(s.label("running_lora_adapters"));
            m.waiting_models = csv(s.label("waiting_lora_adapters"));
            m.max_lora = s.label("max_lora").and_then(|v| v.trim().parse().ok());
            found = true;
        }
    }
    match &engine.cache_info {
        Some(CacheInfo::Labels {
            spec,
            block_size,
            num_blocks,
        }) => {
            if let Some(s) = samples.iter().find(|s| spec.matches(s)) {
                m.block_size = s.label(block_size).and_then(|v| v.parse().ok());
                m.num_blocks = s.label(num_blocks).and_then(|v| v.parse().ok());
            }
        }
        Some(CacheInfo::Gauges {
            block_size,
            num_blocks,
        }) => {
            m.block_size = block_size.value(samples).map(count);
            m.num_blocks = num_blocks.value(samples).map(count);
        }
        None => {}
    }
    if !found {
        return None;
    }
    m.updated_ms = Some(now_ms);
    Some(m)
}

/// The extractor's type name in `EndpointPickerConfig`.
pub const EXTRACTOR_TYPE: &str = "core-metrics-extractor";

impl Mapping {
    /// `core-metrics-extractor`'s mapping from its `parameters`: `engineLabelKey`,
    /// `defaultEngine` and `engineConfigs` (each engine's metric specs); the built-in
    /// engines fill in what is not configured.
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let params = Params::new(
            Some(v),
            path,
            &["engineLabelKey", "defaultEngine", "engineConfigs"],
        )?;
        let mut m = Mapping {
            engine_label: params.string("engineLabelKey", ENGINE_LABEL)?,
            default_engine: params.string("defaultEngine", "vllm")?,
            engines: Vec::new(),
        };
        if let Some(list) = params.get("engineConfigs") {
            let path = params.path("engineConfigs");
            for (i, e) in as_array(list, &path)?.iter().enumerate() {
                let engine = Engine::from_parameters(e, &format!("{path}[{i}]"))?;
                if m.engines.iter().any(|x| x.name == engine.name) {
                    return Err(err(
                        &format!("{path}[{i}].name"),
                        format!("duplicate engine \"{}\"", engine.name),
                    ));
                }
                m.engines.push(engine);
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
}

impl Engine {
    /// One `engineConfigs` entry.
    fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let ep = Params::new(
            Some(v),
            path,
            &[
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
            ],
        )?;
        let name = ep.string("name", "")?;
        if name.is_empty() || name == "default" {
            return Err(err(&ep.path("name"), "must be set and not \"default\""));
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
        Ok(Engine {
            name,
            queued: spec("queuedRequestsSpec")?,
            running: spec("runningRequestsSpec")?,
            kv_usage: spec("kvUsageSpec")?.into_iter().collect(),
            lora: spec("loraSpec")?,
            cache_info,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datalayer::prometheus::parse;
    use std::collections::BTreeMap;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn engine(name: &str) -> Engine {
        builtin_engines()
            .into_iter()
            .find(|e| e.name == name)
            .unwrap()
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn vllm_current_and_legacy_names() {
        let text = "vllm:num_requests_waiting{model_name=\"m\"} 4\n\
                    vllm:num_requests_running{model_name=\"m\"} 7\n\
                    vllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\n\
                    vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"2000\"} 1\n\
                    vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"a, b\",waiting_lora_adapters=\"\"} 100\n\
                    vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"old\",waiting_lora_adapters=\"\"} 50\n";
        let m = extract(&engine("vllm"), &parse(text).samples, 42).unwrap();
        assert_eq!((m.waiting, m.running, m.kv_usage), (4, 7, 0.5));
        assert_eq!((m.block_size, m.num_blocks), (Some(16), Some(2000)));
        assert_eq!(
            m.active_models,
            vec!["a", "b"],
            "the newest lora series wins"
        );
        assert_eq!(m.max_lora, Some(4));
        assert_eq!(m.updated_ms, Some(42));
        let legacy = "vllm:gpu_cache_usage_perc 0.25\n";
        let m = extract(&engine("vllm"), &parse(legacy).samples, 0).unwrap();
        assert_eq!(m.kv_usage, 0.25);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_servers_lora_lists_are_bounded() {
        let names: Vec<String> = (0..200).map(|i| format!("lora-{i}")).collect();
        let text = format!(
            "vllm:lora_requests_info{{max_lora=\"4\",running_lora_adapters=\"{},{}\",waiting_lora_adapters=\"\"}} 1\n",
            "x".repeat(MAX_LORA_NAME_BYTES + 1),
            names.join(",")
        );
        let m = extract(&engine("vllm"), &parse(&text).samples, 0).unwrap();
        assert_eq!(m.active_models.len(), MAX_LORA_NAMES);
        assert_eq!(
            m.active_models[0], "lora-0",
            "an oversized name is left out"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn sglang_trtllm_and_triton() {
        let s = "sglang:num_queue_reqs 2\nsglang:num_running_reqs 3\nsglang:token_usage 0.1\n\
                 sglang:cache_config_info{page_size=\"32\",num_pages=\"100\"} 1\n";
        let m = extract(&engine("sglang"), &parse(s).samples, 0).unwrap();
        assert_eq!((m.waiting, m.running, m.block_size), (2, 3, Some(32)));
        let t = "trtllm_num_requests_waiting 1\ntrtllm_num_requests_running 5\n\
                 trtllm_kv_cache_utilization 0.9\ntrtllm_kv_cache_tokens_per_block 64\n\
                 trtllm_kv_cache_max_blocks 512\n";
        let m = extract(&engine("trtllm-serve"), &parse(t).samples, 0).unwrap();
        assert_eq!((m.waiting, m.running, m.kv_usage), (1, 5, 0.9));
        assert_eq!((m.block_size, m.num_blocks), (Some(64), Some(512)));
        let n = "nv_trt_llm_request_metrics{request_type=\"waiting\"} 6\n\
                 nv_trt_llm_request_metrics{request_type=\"scheduled\"} 8\n\
                 nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"fraction\"} 0.3\n";
        let m = extract(&engine("triton-tensorrt-llm"), &parse(n).samples, 0).unwrap();
        assert_eq!((m.waiting, m.running, m.kv_usage), (6, 8, 0.3));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn absent_metrics_and_nan_do_not_count_as_fresh() {
        assert_eq!(
            extract(&engine("vllm"), &parse("other 1\n").samples, 0),
            None
        );
        assert_eq!(
            extract(
                &engine("vllm"),
                &parse("vllm:num_requests_waiting NaN\n").samples,
                0
            ),
            None
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_highest_timestamp_wins() {
        let s = "vllm:num_requests_waiting 1 100\nvllm:num_requests_waiting 9 200\n";
        assert_eq!(
            extract(&engine("vllm"), &parse(s).samples, 0)
                .unwrap()
                .waiting,
            9
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn engines_come_from_labels_with_the_default_as_fallback() {
        let map = Mapping::default();
        let mut labels = BTreeMap::new();
        assert_eq!(map.engine_for(&labels).unwrap().name, "vllm");
        labels.insert(ENGINE_LABEL.to_string(), "sglang".to_string());
        assert_eq!(map.engine_for(&labels).unwrap().name, "sglang");
        labels.insert(ENGINE_LABEL.to_string(), "unknown".to_string());
        assert_eq!(map.engine_for(&labels).unwrap().name, "vllm");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn selectors_parse_like_promql() {
        let s = Spec::parse("nv_x{request_type=waiting, b=\"c\"}").unwrap();
        assert_eq!(s.name, "nv_x");
        assert_eq!(
            s.labels,
            vec![
                ("request_type".into(), "waiting".into()),
                ("b".into(), "c".into())
            ]
        );
        assert!(Spec::parse("x{a!=b}").is_err());
        assert!(Spec::parse("bad name").is_err());
    }
}
