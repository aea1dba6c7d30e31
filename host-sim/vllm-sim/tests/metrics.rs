//! /metrics text: valid Prometheus exposition format, vLLM's names and
//! labels, and values that follow the engine.

use std::collections::BTreeMap;
use std::time::Duration;
use vllm_sim::engine::latency::LatencyProfile;
use vllm_sim::engine::{Engine, EngineConfig, EngineRequest};
use vllm_sim::metrics::{MetricsOptions, MetricsStyle};
use vllm_sim::sim::{self, Arrival};
use vllm_sim::tokenizer;

/// One sample: metric name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Parses Prometheus text format 0.0.4 strictly enough to catch mistakes:
/// every sample belongs to a family declared by `# TYPE` just before it,
/// names and labels are well-formed, values parse, histograms are cumulative
/// and end with `+Inf` equal to `_count`.
fn parse_prometheus(text: &str) -> Result<Vec<Sample>, String> {
    let mut samples = Vec::new();
    let mut family: Option<(String, String)> = None;
    let mut declared = std::collections::HashSet::new();
    for (n, line) in text.lines().enumerate() {
        let err = |m: &str| format!("line {}: {m}: {line:?}", n + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (kind, name) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            if !valid_name(name) {
                return Err(err("bad name"));
            }
            if kind == "TYPE" {
                let t = parts.next().unwrap_or("");
                if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&t) {
                    return Err(err("bad type"));
                }
                if !declared.insert(name.to_string()) {
                    return Err(err("family declared twice"));
                }
                family = Some((name.to_string(), t.to_string()));
            } else if kind != "HELP" {
                return Err(err("unknown comment"));
            }
            continue;
        }
        let (name_labels, value) = line.rsplit_once(' ').ok_or_else(|| err("no value"))?;
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().map_err(|_| err("bad value"))?,
        };
        let (name, labels) = match name_labels.split_once('{') {
            Some((name, rest)) => (
                name,
                parse_labels(
                    rest.strip_suffix('}')
                        .ok_or_else(|| err("unclosed labels"))?,
                )
                .ok_or_else(|| err("bad labels"))?,
            ),
            None => (name_labels, BTreeMap::new()),
        };
        if !valid_name(name) {
            return Err(err("bad sample name"));
        }
        let (fam, kind) = family.as_ref().ok_or_else(|| err("sample before TYPE"))?;
        let ok = match kind.as_str() {
            "histogram" => [
                format!("{fam}_bucket"),
                format!("{fam}_sum"),
                format!("{fam}_count"),
            ]
            .contains(&name.to_string()),
            _ => name == fam,
        };
        if !ok {
            return Err(err("sample outside its family"));
        }
        samples.push((name.to_string(), labels, value));
    }
    // Histogram checks.
    for s in samples.iter().filter(|s| s.0.ends_with("_count")) {
        let base = s.0.trim_end_matches("_count");
        let buckets: Vec<&Sample> = samples
            .iter()
            .filter(|b| b.0 == format!("{base}_bucket"))
            .collect();
        if buckets.is_empty() {
            continue;
        }
        if !buckets.windows(2).all(|w| w[0].2 <= w[1].2) {
            return Err(format!("{base}: buckets not cumulative"));
        }
        let last = buckets.last().unwrap();
        if last.1.get("le").map(String::as_str) != Some("+Inf") || last.2 != s.2 {
            return Err(format!("{base}: +Inf bucket must equal _count"));
        }
    }
    Ok(samples)
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_labels(s: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut rest = s;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => value.push(match chars.next()?.1 {
                    'n' => '\n',
                    other => other,
                }),
                '"' => break i,
                c => value.push(c),
            }
        };
        if !valid_name(key) || labels.insert(key.to_string(), value).is_some() {
            return None;
        }
        rest = &after[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
    Some(labels)
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.2)
}

fn engine() -> Engine {
    let mut latency = LatencyProfile::h100_llama_8b();
    latency.jitter = 0.0;
    Engine::new(EngineConfig {
        model: "meta-llama/Llama-3.1-8B-Instruct".into(),
        max_num_seqs: 4,
        latency,
        ..EngineConfig::default()
    })
}

#[test]
fn metrics_are_valid_prometheus_text_in_every_style() {
    let mut e = engine();
    let prompt = tokenizer::encode(&"shared system prompt ".repeat(20));
    let arrivals: Vec<Arrival> = (0..6)
        .map(|i| Arrival {
            at: Duration::from_millis(i * 300),
            request: EngineRequest::fixed(prompt.clone(), 8),
        })
        .collect();
    sim::run(&mut e, &arrivals, Duration::from_secs(600));
    for opts in [
        MetricsOptions::default(),
        MetricsOptions {
            legacy_names: true,
            ..Default::default()
        },
        MetricsOptions {
            style: MetricsStyle::Sglang,
            legacy_names: false,
        },
    ] {
        let text = e.render_metrics(&opts, 1_700_000_000.5);
        parse_prometheus(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
    }
    assert!(
        parse_prometheus("# TYPE x gauge\ny 1\n").is_err(),
        "the checker catches strays"
    );
    assert!(parse_prometheus("# TYPE x gauge\nx{a=\"1} 1\n").is_err());
}

#[test]
fn metrics_move_as_the_engine_does() {
    let mut e = engine();
    let model = [("model_name", "meta-llama/Llama-3.1-8B-Instruct")];
    let scrape =
        |e: &Engine| parse_prometheus(&e.render_metrics(&MetricsOptions::default(), 0.0)).unwrap();

    let prompt = tokenizer::encode(&"the same long prefix for every request ".repeat(10));
    for _ in 0..6 {
        e.submit(EngineRequest::fixed(prompt.clone(), 5), Duration::ZERO)
            .unwrap();
    }
    let m = scrape(&e);
    assert_eq!(value(&m, "vllm:num_requests_waiting", &model), Some(6.0));
    assert_eq!(value(&m, "vllm:num_requests_running", &model), Some(0.0));
    assert_eq!(value(&m, "vllm:kv_cache_usage_perc", &model), Some(0.0));

    let step = e.step(Duration::ZERO).unwrap();
    let m = scrape(&e);
    assert_eq!(value(&m, "vllm:num_requests_waiting", &model), Some(2.0));
    assert_eq!(value(&m, "vllm:num_requests_running", &model), Some(4.0));
    assert!(value(&m, "vllm:kv_cache_usage_perc", &model).unwrap() > 0.0);

    let mut now = step.ends_at;
    for _ in 0..200 {
        let Some(t) = e.next_step_at() else { break };
        now = now.max(t);
        e.step(now);
    }
    let m = scrape(&e);
    assert_eq!(value(&m, "vllm:num_requests_running", &model), Some(0.0));
    assert_eq!(value(&m, "vllm:kv_cache_usage_perc", &model), Some(0.0));
    assert_eq!(
        value(&m, "vllm:generation_tokens_total", &model),
        Some(30.0)
    );
    assert_eq!(
        value(&m, "vllm:prompt_tokens_total", &model),
        Some(6.0 * prompt.len() as f64)
    );
    assert_eq!(
        value(&m, "vllm:prefix_cache_queries_total", &model),
        Some(6.0 * prompt.len() as f64)
    );
    // The first four ran together with nothing cached; the last two hit the prefix.
    let block = 16.0;
    let hits = 2.0 * ((prompt.len() - 1) as f64 / block).floor() * block;
    assert_eq!(
        value(&m, "vllm:prefix_cache_hits_total", &model),
        Some(hits)
    );
    assert_eq!(
        value(
            &m,
            "vllm:request_success_total",
            &[("finished_reason", "length")]
        ),
        Some(6.0)
    );
    assert_eq!(
        value(&m, "vllm:time_to_first_token_seconds_count", &model),
        Some(6.0)
    );
    assert_eq!(
        value(&m, "vllm:inter_token_latency_seconds_count", &model),
        Some(24.0)
    );
    assert_eq!(
        value(&m, "vllm:e2e_request_latency_seconds_count", &model),
        Some(6.0)
    );
    assert_eq!(
        value(&m, "vllm:request_queue_time_seconds_count", &model),
        Some(6.0)
    );
    // TTFT of the first batch: 30 ms + 4 × prompt × 250 µs, under the 0.5 s bucket.
    assert_eq!(
        value(
            &m,
            "vllm:time_to_first_token_seconds_bucket",
            &[("le", "0.5")]
        ),
        Some(4.0 + 2.0)
    );
    assert_eq!(
        value(
            &m,
            "vllm:time_to_first_token_seconds_bucket",
            &[("le", "0.1")]
        ),
        Some(0.0)
    );
    assert_eq!(
        value(
            &m,
            "vllm:cache_config_info",
            &[("block_size", "16"), ("num_gpu_blocks", "4096")]
        ),
        Some(1.0)
    );
}

#[test]
fn legacy_and_sglang_names_carry_the_same_values() {
    let mut e = engine();
    e.submit(
        EngineRequest::fixed(tokenizer::encode("hello there"), 50),
        Duration::ZERO,
    )
    .unwrap();
    e.step(Duration::ZERO).unwrap();
    let model = [("model_name", "meta-llama/Llama-3.1-8B-Instruct")];
    let legacy = parse_prometheus(&e.render_metrics(
        &MetricsOptions {
            legacy_names: true,
            ..Default::default()
        },
        0.0,
    ))
    .unwrap();
    let kv = value(&legacy, "vllm:kv_cache_usage_perc", &model).unwrap();
    assert!(kv > 0.0);
    assert_eq!(
        value(&legacy, "vllm:gpu_cache_usage_perc", &model),
        Some(kv)
    );
    let sglang = parse_prometheus(&e.render_metrics(
        &MetricsOptions {
            style: MetricsStyle::Sglang,
            legacy_names: false,
        },
        0.0,
    ))
    .unwrap();
    assert_eq!(value(&sglang, "sglang:token_usage", &model), Some(kv));
    assert_eq!(value(&sglang, "sglang:num_running_reqs", &model), Some(1.0));
    assert_eq!(value(&sglang, "sglang:num_queue_reqs", &model), Some(0.0));
    assert_eq!(
        value(
            &sglang,
            "sglang:cache_config_info",
            &[("page_size", "16"), ("num_pages", "4096")]
        ),
        Some(1.0)
    );
}
