//! Prometheus metrics: the counters and histograms the engine updates, and a
//! text-format (0.0.4) renderer with vLLM's names, labels and buckets, plus
//! switches for the legacy vLLM names and for sglang-style names.

use std::collections::BTreeMap;
use std::fmt::Write;

/// Buckets of `vllm:time_to_first_token_seconds` (vLLM v1 / llm-d-inference-sim).
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// Buckets of `vllm:inter_token_latency_seconds` and the TPOT histograms.
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// Buckets of the per-request latency histograms (e2e, queue, inference, prefill, decode).
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// vLLM's 1-2-5 token-count buckets up to `max`.
pub fn token_buckets(max: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1usize;
    'outer: loop {
        for m in [1, 2, 5] {
            let v = m * scale;
            if v > max {
                break 'outer;
            }
            out.push(v as f64);
        }
        scale = match scale.checked_mul(10) {
            Some(s) => s,
            None => break,
        };
    }
    out
}

/// A cumulative-bucket histogram.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    bounds: Vec<f64>,
    /// Per-bucket (not cumulative) counts; the last one is +Inf.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub fn new(bounds: &[f64]) -> Self {
        Histogram {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, value: f64) {
        let i = self.bounds.partition_point(|b| *b < value);
        self.counts[i] += 1;
        self.sum += value;
        self.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// `(upper bound, cumulative count)` pairs, ending with `+Inf`.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut acc = 0;
        self.counts
            .iter()
            .enumerate()
            .map(|(i, c)| {
                acc += c;
                (self.bounds.get(i).copied().unwrap_or(f64::INFINITY), acc)
            })
            .collect()
    }
}

/// Everything the engine counts.
#[derive(Clone, Debug, PartialEq)]
pub struct Metrics {
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub preemptions: u64,
    /// Finished requests by finish reason (`stop`, `length`, `abort`, `remote_decode`).
    pub request_success: BTreeMap<&'static str, u64>,
    pub ttft: Histogram,
    pub inter_token_latency: Histogram,
    pub request_time_per_output_token: Histogram,
    pub e2e_latency: Histogram,
    pub queue_time: Histogram,
    pub inference_time: Histogram,
    pub prefill_time: Histogram,
    pub decode_time: Histogram,
    pub request_prompt_tokens: Histogram,
    pub request_generation_tokens: Histogram,
    pub request_params_max_tokens: Histogram,
}

impl Metrics {
    pub fn new(max_model_len: usize) -> Self {
        let tokens = token_buckets(max_model_len);
        Metrics {
            prompt_tokens: 0,
            generation_tokens: 0,
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            preemptions: 0,
            request_success: BTreeMap::new(),
            ttft: Histogram::new(TTFT_BUCKETS),
            inter_token_latency: Histogram::new(ITL_BUCKETS),
            request_time_per_output_token: Histogram::new(ITL_BUCKETS),
            e2e_latency: Histogram::new(REQUEST_LATENCY_BUCKETS),
            queue_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            inference_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            prefill_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            decode_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            request_prompt_tokens: Histogram::new(&tokens),
            request_generation_tokens: Histogram::new(&tokens),
            request_params_max_tokens: Histogram::new(&tokens),
        }
    }
}

/// The engine's state at one moment, for gauges.
#[derive(Clone, Debug, PartialEq)]
pub struct Gauges {
    pub running: usize,
    pub waiting: usize,
    /// 0..1
    pub kv_usage: f64,
    pub block_size: usize,
    pub num_gpu_blocks: usize,
    pub max_loras: usize,
    pub running_loras: Vec<String>,
    pub waiting_loras: Vec<String>,
}

/// Which metric names to expose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MetricsStyle {
    /// vLLM's current names (`vllm:kv_cache_usage_perc`, ...).
    #[default]
    Vllm,
    /// sglang's names (`sglang:num_running_reqs`, `sglang:token_usage`, ...).
    Sglang,
}

impl MetricsStyle {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "vllm" => Some(MetricsStyle::Vllm),
            "sglang" => Some(MetricsStyle::Sglang),
            _ => None,
        }
    }
}

/// Rendering switches.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsOptions {
    pub style: MetricsStyle,
    /// Also expose names vLLM has removed (`vllm:gpu_cache_usage_perc`,
    /// `vllm:gpu_prefix_cache_*`, `vllm:time_per_output_token_seconds`).
    pub legacy_names: bool,
}

/// Renders Prometheus text. `unix_time` is the value of `vllm:lora_requests_info`.
pub fn render(
    model: &str,
    metrics: &Metrics,
    gauges: &Gauges,
    opts: &MetricsOptions,
    unix_time: f64,
) -> String {
    let mut out = Writer {
        buf: String::with_capacity(16 * 1024),
        label: format!("model_name=\"{}\"", escape_label(model)),
    };
    match opts.style {
        MetricsStyle::Vllm => render_vllm(&mut out, metrics, gauges, opts, unix_time),
        MetricsStyle::Sglang => render_sglang(&mut out, metrics, gauges),
    }
    out.buf
}

fn render_vllm(out: &mut Writer, m: &Metrics, g: &Gauges, opts: &MetricsOptions, unix_time: f64) {
    out.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        g.running as f64,
    );
    out.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        g.waiting as f64,
    );
    out.gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        g.kv_usage,
    );
    if opts.legacy_names {
        out.gauge(
            "vllm:gpu_cache_usage_perc",
            "GPU KV-cache usage. 1 means 100 percent usage (deprecated name).",
            g.kv_usage,
        );
    }
    out.header(
        "vllm:lora_requests_info",
        "Running stats on lora requests.",
        "gauge",
    );
    let _ = writeln!(
        out.buf,
        "vllm:lora_requests_info{{max_lora=\"{}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"}} {}",
        g.max_loras,
        escape_label(&g.running_loras.join(",")),
        escape_label(&g.waiting_loras.join(",")),
        fmt_f64(unix_time)
    );
    out.header(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        "gauge",
    );
    let _ = writeln!(
        out.buf,
        "vllm:cache_config_info{{block_size=\"{}\",num_gpu_blocks=\"{}\"}} 1",
        g.block_size, g.num_gpu_blocks
    );

    out.counter(
        "vllm:prompt_tokens_total",
        "Number of prefill tokens processed.",
        m.prompt_tokens,
    );
    out.counter(
        "vllm:generation_tokens_total",
        "Number of generation tokens processed.",
        m.generation_tokens,
    );
    out.counter(
        "vllm:prefix_cache_queries_total",
        "Prefix cache queries, in terms of number of queried tokens.",
        m.prefix_cache_queries,
    );
    out.counter(
        "vllm:prefix_cache_hits_total",
        "Prefix cache hits, in terms of number of cached tokens.",
        m.prefix_cache_hits,
    );
    if opts.legacy_names {
        out.counter(
            "vllm:gpu_prefix_cache_queries_total",
            "GPU prefix cache queries (deprecated name).",
            m.prefix_cache_queries,
        );
        out.counter(
            "vllm:gpu_prefix_cache_hits_total",
            "GPU prefix cache hits (deprecated name).",
            m.prefix_cache_hits,
        );
    }
    out.counter(
        "vllm:num_preemptions_total",
        "Cumulative number of preemption from the engine.",
        m.preemptions,
    );
    out.header(
        "vllm:request_success_total",
        "Count of successfully processed requests.",
        "counter",
    );
    for reason in ["stop", "length", "abort", "remote_decode"] {
        let n = m.request_success.get(reason).copied().unwrap_or(0);
        let _ = writeln!(
            out.buf,
            "vllm:request_success_total{{finished_reason=\"{reason}\",{}}} {n}",
            out.label
        );
    }

    let histograms: [(&str, &str, &Histogram); 12] = [
        (
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &m.ttft,
        ),
        (
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &m.inter_token_latency,
        ),
        (
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            &m.request_time_per_output_token,
        ),
        (
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            &m.e2e_latency,
        ),
        (
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            &m.queue_time,
        ),
        (
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            &m.inference_time,
        ),
        (
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            &m.prefill_time,
        ),
        (
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            &m.decode_time,
        ),
        (
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            &m.request_prompt_tokens,
        ),
        (
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            &m.request_generation_tokens,
        ),
        (
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            &m.request_params_max_tokens,
        ),
        (
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            &m.request_generation_tokens,
        ),
    ];
    for (name, help, h) in histograms {
        out.histogram(name, help, h);
    }
    if opts.legacy_names {
        out.histogram(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds (deprecated name).",
            &m.inter_token_latency,
        );
    }
}

fn render_sglang(out: &mut Writer, m: &Metrics, g: &Gauges) {
    out.gauge(
        "sglang:num_running_reqs",
        "The number of running requests.",
        g.running as f64,
    );
    out.gauge(
        "sglang:num_queue_reqs",
        "The number of requests in the waiting queue.",
        g.waiting as f64,
    );
    out.gauge("sglang:token_usage", "The token usage.", g.kv_usage);
    let hit_rate = if m.prefix_cache_queries == 0 {
        0.0
    } else {
        m.prefix_cache_hits as f64 / m.prefix_cache_queries as f64
    };
    out.gauge(
        "sglang:cache_hit_rate",
        "The prefix cache hit rate.",
        hit_rate,
    );
    out.header(
        "sglang:cache_config_info",
        "Information of the cache config.",
        "gauge",
    );
    let _ = writeln!(
        out.buf,
        "sglang:cache_config_info{{num_pages=\"{}\",page_size=\"{}\"}} 1",
        g.num_gpu_blocks, g.block_size
    );
    out.counter(
        "sglang:prompt_tokens_total",
        "Number of prefill tokens processed.",
        m.prompt_tokens,
    );
    out.counter(
        "sglang:generation_tokens_total",
        "Number of generation tokens processed.",
        m.generation_tokens,
    );
    out.counter(
        "sglang:cached_tokens_total",
        "Number of cached prompt tokens.",
        m.prefix_cache_hits,
    );
    out.counter(
        "sglang:num_requests_total",
        "Number of requests processed.",
        m.request_success.values().sum(),
    );
    out.histogram(
        "sglang:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &m.ttft,
    );
    out.histogram(
        "sglang:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        &m.inter_token_latency,
    );
    out.histogram(
        "sglang:e2e_request_latency_seconds",
        "Histogram of End-to-end request latency in seconds",
        &m.e2e_latency,
    );
}

struct Writer {
    buf: String,
    /// `model_name="..."`
    label: String,
}

impl Writer {
    fn header(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.buf, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.header(name, help, "gauge");
        let _ = writeln!(self.buf, "{name}{{{}}} {}", self.label, fmt_f64(value));
    }

    fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.header(name, help, "counter");
        let _ = writeln!(self.buf, "{name}{{{}}} {value}", self.label);
    }

    fn histogram(&mut self, name: &str, help: &str, h: &Histogram) {
        self.header(name, help, "histogram");
        for (le, n) in h.cumulative() {
            let le = if le.is_infinite() {
                "+Inf".to_string()
            } else {
                fmt_f64(le)
            };
            let _ = writeln!(self.buf, "{name}_bucket{{le=\"{le}\",{}}} {n}", self.label);
        }
        let _ = writeln!(
            self.buf,
            "{name}_sum{{{}}} {}",
            self.label,
            fmt_f64(h.sum())
        );
        let _ = writeln!(self.buf, "{name}_count{{{}}} {}", self.label, h.count());
    }
}

/// Prometheus float formatting: always with a decimal point, like Python's client.
fn fmt_f64(v: f64) -> String {
    if v.is_finite() && v == v.trunc() && v.abs() < 1e15 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_with_le_semantics() {
        let mut h = Histogram::new(&[0.1, 1.0]);
        h.observe(0.1);
        h.observe(0.5);
        h.observe(3.0);
        assert_eq!(h.cumulative(), vec![(0.1, 1), (1.0, 2), (f64::INFINITY, 3)]);
        assert_eq!(h.count(), 3);
        assert!((h.sum() - 3.6).abs() < 1e-12);
    }

    #[test]
    fn token_buckets_follow_1_2_5() {
        assert_eq!(
            token_buckets(1024),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]
        );
    }

    #[test]
    fn styles_switch_names() {
        let m = Metrics::new(100);
        let g = Gauges {
            running: 2,
            waiting: 1,
            kv_usage: 0.25,
            block_size: 16,
            num_gpu_blocks: 64,
            max_loras: 1,
            running_loras: vec!["a".into()],
            waiting_loras: vec![],
        };
        let vllm = render("m\"x", &m, &g, &MetricsOptions::default(), 5.0);
        assert!(vllm.contains("vllm:num_requests_running{model_name=\"m\\\"x\"} 2.0\n"));
        assert!(vllm.contains("vllm:kv_cache_usage_perc{model_name=\"m\\\"x\"} 0.25\n"));
        assert!(!vllm.contains("gpu_cache_usage_perc"));
        assert!(vllm.contains("running_lora_adapters=\"a\""));
        let legacy = render(
            "m",
            &m,
            &g,
            &MetricsOptions {
                legacy_names: true,
                ..Default::default()
            },
            5.0,
        );
        assert!(legacy.contains("vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.25\n"));
        let sglang = render(
            "m",
            &m,
            &g,
            &MetricsOptions {
                style: MetricsStyle::Sglang,
                legacy_names: false,
            },
            5.0,
        );
        assert!(sglang.contains("sglang:num_queue_reqs{model_name=\"m\"} 1.0\n"));
        assert!(sglang.contains("sglang:cache_config_info{num_pages=\"64\",page_size=\"16\"} 1\n"));
        assert!(!sglang.contains("vllm:"));
    }
}
