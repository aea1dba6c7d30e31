//! The metrics the filter exports: names, types, labels, units, buckets.
//!
//! Every metric is exported twice, from the same recording:
//!
//! * **The filter's own Prometheus endpoint** (`pool.metricsEndpoint`, [`exposition`]):
//!   the reference's names (`inference_*`, and the llm-d router's `llm_d_epp_*` twins),
//!   units (seconds, fractions) and bucket bounds, one series per pool aggregated over every
//!   Envoy worker (each VM's [`recorder::Recorder`] is published to shared data).
//! * **Envoy's stats** (`/stats/prometheus`), integers only (all but the per-request
//!   size and duration histograms, [`Metric::envoy`]). Proxy-Wasm metrics have no
//!   labels: Envoy recovers them from the stat name with the `stats_tags` rules in
//!   `envoy/stats-tags.yaml`; each label is written as `;<label>=.=<value>;.;` after the
//!   metric name, and the rule for `<label>` cuts that piece out and makes it a tag. The
//!   leading `;` keeps `model_name` from matching inside `target_model_name`. Values keep
//!   their recorded integer unit ([`Unit`]): `*_duration_seconds` histograms hold
//!   **microseconds**, `inference_pool_average_kv_cache_utilization` and the prefix hit
//!   ratio **percent**, `pool_saturation` **thousandths**, averages are rounded.
//!
//! Gauges that describe the pool (`inference_pool_*`, pool saturation, stale endpoints) are
//! *set* by the VM holding the scrape lease, the prefix indexer's size by every VM that
//! routes ([`Kind::Level`]: the latest setting is the value);
//! per-request metrics are added to by the worker that owns the request.
//!
//! Label values a client chooses (`model_name`, `target_model_name`, `fairness_id`) are
//! capped per VM ([`recorder::LABEL_CAP`] distinct values each); later values are
//! reported as `other`, in both exports, so a flood of names cannot grow Envoy's stats.

pub mod exposition;
pub mod recorder;

/// Prometheus metric type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down: workers add and subtract; the sum over workers is the value.
    Gauge,
    /// A gauge one VM sets (the scrape-lease holder); the latest setting is the value.
    Level,
    /// Observations in buckets.
    Histogram,
}

/// What a recorded integer means, and how it becomes the reference's unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A count or a number of bytes: exported as is.
    Plain,
    /// Microseconds, exported as seconds.
    Micros,
    /// Percent, exported as a fraction (0–1).
    Percent,
    /// Thousandths, exported as a fraction.
    Thousandths,
}

impl Unit {
    /// The factor from the recorded integer to the reference's unit.
    pub fn scale(self) -> f64 {
        match self {
            Self::Plain => 1.0,
            Self::Micros => 1e-6,
            Self::Percent => 0.01,
            Self::Thousandths => 0.001,
        }
    }
}

/// The llm-d router's name for a metric (`llm_d_epp_*`), with its label names when they
/// differ and constant labels it adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Twin {
    /// The name.
    pub name: &'static str,
    /// Label names in the same order as [`Metric::labels`]; empty: the same names.
    pub labels: &'static [&'static str],
    /// Labels with a constant value, written after the others.
    pub constant: &'static [(&'static str, &'static str)],
}

const fn twin(name: &'static str) -> Option<Twin> {
    Some(Twin {
        name,
        labels: &[],
        constant: &[],
    })
}

/// A metric: its reference name, type, labels in encoding order, unit and buckets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metric {
    /// The name users see in Prometheus (the Gateway API Inference Extension's).
    pub name: &'static str,
    /// Its type.
    pub kind: Kind,
    /// Its labels, in the order values are passed when recording.
    pub labels: &'static [&'static str],
    /// The `# HELP` text.
    pub help: &'static str,
    /// What the recorded integers are.
    pub unit: Unit,
    /// Histogram bucket upper bounds, in the exported unit (seconds, fractions, counts).
    pub buckets: &'static [f64],
    /// The llm-d router's name, exported beside this one.
    pub twin: Option<Twin>,
    /// Whether it is also an Envoy stat. The per-request size and duration histograms are
    /// on the filter's endpoint only: each would cost a host call per request.
    pub envoy: bool,
}

const BASE: Metric = Metric {
    name: "",
    kind: Kind::Counter,
    labels: &[],
    help: "",
    unit: Unit::Plain,
    buckets: &[],
    twin: None,
    envoy: true,
};

/// The reference's scheduling-latency buckets (seconds), with finer ones below 100 µs
/// where the filter's work lands.
pub const SCHED_BUCKETS: &[f64] = &[
    0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02,
    0.05, 0.1,
];
/// The reference's flow-control queue-duration buckets (seconds).
pub const FCQ_BUCKETS: &[f64] = &[
    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];
/// The reference's general latency buckets (seconds).
pub const GEN_BUCKETS: &[f64] = &[
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0,
    1200.0, 1800.0, 2700.0, 3600.0,
];
/// The reference's request-size buckets (bytes): 64 B … 1 GiB in doublings.
pub const REQUEST_SIZE_BUCKETS: &[f64] = &[
    64.0,
    128.0,
    256.0,
    512.0,
    1024.0,
    2048.0,
    4096.0,
    8192.0,
    16384.0,
    32768.0,
    65536.0,
    131072.0,
    262144.0,
    524288.0,
    1048576.0,
    2097152.0,
    4194304.0,
    8388608.0,
    16777216.0,
    33554432.0,
    67108864.0,
    134217728.0,
    268435456.0,
    536870912.0,
    1073741824.0,
];
/// The reference's response-size buckets (bytes).
pub const RESPONSE_SIZE_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
    32778.0, 65536.0,
];
const RATIO_BUCKETS: &[f64] = &[0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];
const HIT_BYTES_BUCKETS: &[f64] = &[
    0.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0,
    65536.0,
];

/// Scheduling attempts by outcome (`success` or `failure`) and the model targeted.
pub const SCHEDULER_ATTEMPTS: Metric = Metric {
    name: "inference_extension_scheduler_attempts_total",
    labels: &[
        "status",
        "target_model_name",
        "pod_name",
        "namespace",
        "port",
    ],
    help: "Scheduling attempts by status and chosen endpoint.",
    twin: Some(Twin {
        name: "llm_d_epp_scheduler_attempts_total",
        labels: &[
            "status",
            "target_model_name",
            "endpoint_name",
            "namespace",
            "port",
        ],
        constant: &[],
    }),
    ..BASE
};

/// The reference's pod labels of an endpoint `ip:port` for
/// [`SCHEDULER_ATTEMPTS`]: (`pod_name`, `namespace`, `port`). Outside Kubernetes the pod
/// is named by its address and the namespace is empty, as the reference leaves them on
/// failure.
pub fn pod_labels(endpoint: &str) -> (&str, &str, &str) {
    match endpoint.rsplit_once(':') {
        Some((host, port)) => (host.trim_start_matches('[').trim_end_matches(']'), "", port),
        None => (endpoint, "", ""),
    }
}

/// Requests sent upstream and not yet finished, by model.
pub const OBJECTIVE_RUNNING_REQUESTS: Metric = Metric {
    name: "inference_objective_running_requests",
    kind: Kind::Gauge,
    labels: &["model_name"],
    help: "Requests sent to a model server and not yet finished, by model.",
    ..BASE
};

/// Requests in flight with the llm-d router's labels (no GIE twin).
pub const REQUEST_RUNNING: Metric = Metric {
    name: "llm_d_epp_request_running",
    kind: Kind::Gauge,
    labels: &["model_name", "target_model_name", "fairness_id", "priority"],
    help: "Requests sent to a model server and not yet finished.",
    ..BASE
};

/// Requests that passed parsing and were sent upstream, by model.
pub const OBJECTIVE_REQUEST_TOTAL: Metric = Metric {
    name: "inference_objective_request_total",
    labels: &["model_name", "target_model_name"],
    help: "Requests routed to a model server, by model.",
    twin: twin("llm_d_epp_request_total"),
    ..BASE
};

/// Requests the gateway answered with an error, by model and error code.
pub const OBJECTIVE_REQUEST_ERROR_TOTAL: Metric = Metric {
    name: "inference_objective_request_error_total",
    labels: &["model_name", "target_model_name", "error_code"],
    help: "Requests the gateway answered with an error, by model and error code.",
    twin: twin("llm_d_epp_request_error_total"),
    ..BASE
};

/// Time from the request's arrival at the filter to the end of its response (recorded in
/// microseconds).
pub const OBJECTIVE_REQUEST_DURATION: Metric = Metric {
    name: "inference_objective_request_duration_seconds",
    kind: Kind::Histogram,
    labels: &["model_name", "target_model_name"],
    help: "Time from a request's arrival at the gateway to the end of its response.",
    unit: Unit::Micros,
    buckets: GEN_BUCKETS,
    twin: twin("llm_d_epp_request_duration_seconds"),
    envoy: false,
};

/// Request body sizes (bytes).
pub const OBJECTIVE_REQUEST_SIZES: Metric = Metric {
    name: "inference_objective_request_sizes",
    kind: Kind::Histogram,
    labels: &["model_name", "target_model_name"],
    help: "Request body sizes in bytes.",
    buckets: REQUEST_SIZE_BUCKETS,
    twin: twin("llm_d_epp_request_size_bytes"),
    envoy: false,
    ..BASE
};

/// Response body sizes (bytes).
pub const OBJECTIVE_RESPONSE_SIZES: Metric = Metric {
    name: "inference_objective_response_sizes",
    kind: Kind::Histogram,
    labels: &["model_name", "target_model_name"],
    help: "Response body sizes in bytes.",
    buckets: RESPONSE_SIZE_BUCKETS,
    twin: twin("llm_d_epp_response_size_bytes"),
    envoy: false,
    ..BASE
};

const POOL_LABELS: &[&str] = &["name"];

/// Endpoints with fresh metrics (≤ 2 s), by pool.
pub const POOL_READY_PODS: Metric = Metric {
    name: "inference_pool_ready_pods",
    kind: Kind::Level,
    labels: POOL_LABELS,
    help: "Endpoints of the pool with fresh metrics.",
    twin: twin("llm_d_epp_ready_endpoints"),
    ..BASE
};

/// Mean KV-cache utilization over fresh endpoints (recorded in percent).
pub const POOL_AVERAGE_KV: Metric = Metric {
    name: "inference_pool_average_kv_cache_utilization",
    kind: Kind::Level,
    labels: POOL_LABELS,
    help: "Mean KV-cache utilization (0-1) over endpoints with fresh metrics.",
    unit: Unit::Percent,
    twin: twin("llm_d_epp_average_kv_cache_utilization"),
    ..BASE
};

/// Mean waiting queue over fresh endpoints.
pub const POOL_AVERAGE_QUEUE: Metric = Metric {
    name: "inference_pool_average_queue_size",
    kind: Kind::Level,
    labels: POOL_LABELS,
    help: "Mean waiting queue over endpoints with fresh metrics.",
    twin: twin("llm_d_epp_average_queue_size"),
    ..BASE
};

/// Waiting queue of each endpoint.
pub const POOL_PER_POD_QUEUE: Metric = Metric {
    name: "inference_pool_per_pod_queue_size",
    kind: Kind::Level,
    labels: &["name", "model_server_pod"],
    help: "Waiting queue of each endpoint.",
    twin: Some(Twin {
        name: "llm_d_epp_per_endpoint_queue_size",
        labels: &["name", "model_server_endpoint"],
        constant: &[],
    }),
    ..BASE
};

/// Mean running requests over fresh endpoints.
pub const POOL_AVERAGE_RUNNING: Metric = Metric {
    name: "inference_pool_average_running_requests",
    kind: Kind::Level,
    labels: POOL_LABELS,
    help: "Mean running requests over endpoints with fresh metrics.",
    twin: twin("llm_d_epp_average_running_requests"),
    ..BASE
};

/// End-to-end scheduling latency (recorded in microseconds).
pub const SCHEDULER_E2E_DURATION: Metric = Metric {
    name: "inference_extension_scheduler_e2e_duration_seconds",
    kind: Kind::Histogram,
    help: "Time one scheduling decision took.",
    unit: Unit::Micros,
    buckets: SCHED_BUCKETS,
    twin: twin("llm_d_epp_scheduler_e2e_duration_seconds"),
    ..BASE
};

/// Per-plugin latency (recorded in microseconds).
pub const PLUGIN_DURATION: Metric = Metric {
    name: "inference_extension_plugin_duration_seconds",
    kind: Kind::Histogram,
    labels: &["extension_point", "plugin_type", "plugin_name"],
    help: "Time each plugin took, by extension point.",
    unit: Unit::Micros,
    buckets: SCHED_BUCKETS,
    twin: twin("llm_d_epp_plugin_duration_seconds"),
    ..BASE
};

/// Entries in the prefix index.
pub const PREFIX_INDEXER_SIZE: Metric = Metric {
    name: "inference_extension_prefix_indexer_size",
    kind: Kind::Level,
    help: "Entries in the approximate prefix-cache index.",
    twin: twin("llm_d_epp_prefix_indexer_size"),
    ..BASE
};

/// Matched share of a request's blocks on the chosen endpoint (recorded in percent).
pub const PREFIX_INDEXER_HIT_RATIO: Metric = Metric {
    name: "inference_extension_prefix_indexer_hit_ratio",
    kind: Kind::Histogram,
    help: "Share of a request's prompt blocks found on the chosen endpoint.",
    unit: Unit::Percent,
    buckets: RATIO_BUCKETS,
    twin: twin("llm_d_epp_prefix_indexer_hit_ratio"),
    ..BASE
};

/// Bytes of prompt matched on the chosen endpoint (`matched × blockSize × 4`).
pub const PREFIX_INDEXER_HIT_BYTES: Metric = Metric {
    name: "inference_extension_prefix_indexer_hit_bytes",
    kind: Kind::Histogram,
    help: "Bytes of prompt matched on the chosen endpoint.",
    buckets: HIT_BYTES_BUCKETS,
    twin: twin("llm_d_epp_prefix_indexer_hit_bytes"),
    ..BASE
};

/// Prompt tokens the prefix index predicted cached on the chosen endpoint, over requests
/// whose server reported `cached_tokens` (cached-token feedback).
pub const PREFIX_PREDICTED_HIT_TOKENS: Metric = Metric {
    name: "inference_extension_prefix_cache_predicted_hit_tokens_total",
    help: "Prompt tokens the prefix index predicted cached on the chosen endpoint (requests whose server reported cached tokens).",
    ..BASE
};

/// Prompt tokens the chosen servers reported cached (`usage.prompt_tokens_details.cached_tokens`).
pub const PREFIX_REPORTED_HIT_TOKENS: Metric = Metric {
    name: "inference_extension_prefix_cache_reported_hit_tokens_total",
    help: "Prompt tokens the chosen servers reported cached (usage.prompt_tokens_details.cached_tokens).",
    ..BASE
};

/// Prompt tokens of the requests counted in the two above (the reported hit rate's base).
pub const PREFIX_REPORTED_PROMPT_TOKENS: Metric = Metric {
    name: "inference_extension_prefix_cache_reported_prompt_tokens_total",
    help: "Prompt tokens of the requests whose server reported cached tokens.",
    ..BASE
};

/// Cached-token feedback by outcome: `confirmed` (the prediction held), `evicted` (the
/// server missed credited blocks: dropped from the index), `unsettled` (it missed blocks
/// that requests in flight there may still be computing: nothing corrected), `grown` (it
/// held more than credited: its capacity grew).
pub const PREFIX_FEEDBACK: Metric = Metric {
    name: "inference_extension_prefix_cache_feedback_total",
    labels: &["outcome"],
    help: "Cached-token reports compared with the prefix index, by outcome (confirmed, evicted, unsettled, grown).",
    ..BASE
};

/// Build information, always 1.
pub const INFO: Metric = Metric {
    name: "inference_extension_info",
    kind: Kind::Level,
    labels: &["commit", "build_ref"],
    help: "Build information.",
    twin: twin("llm_d_epp_info"),
    ..BASE
};

/// The build's version (metric label `commit`).
pub const COMMIT: &str = env!("CARGO_PKG_VERSION");
/// The build reference (metric label `build_ref`).
pub const BUILD_REF: &str = concat!("epp-filter-", env!("CARGO_PKG_VERSION"));

/// Model rewrites applied, by rule.
pub const MODEL_REWRITE_DECISIONS: Metric = Metric {
    name: "inference_extension_model_rewrite_decisions_total",
    labels: &["model_rewrite_name", "model_name", "target_model"],
    help: "Model rewrites applied, by rule, incoming model and target.",
    twin: twin("llm_d_epp_model_rewrite_decisions_total"),
    ..BASE
};

/// Labels of the flow-control queue gauges.
const QUEUE_LABELS: &[&str] = &[
    "fairness_id",
    "priority",
    "inference_pool",
    "model_name",
    "target_model_name",
];

/// Requests parked by flow control, by flow.
pub const FLOW_QUEUE_SIZE: Metric = Metric {
    name: "inference_extension_flow_control_queue_size",
    kind: Kind::Gauge,
    labels: QUEUE_LABELS,
    help: "Requests held in the flow-control queues.",
    twin: twin("llm_d_epp_flow_control_queue_size"),
    ..BASE
};

/// Body bytes of the requests parked by flow control, by flow.
pub const FLOW_QUEUE_BYTES: Metric = Metric {
    name: "inference_extension_flow_control_queue_bytes",
    kind: Kind::Gauge,
    labels: QUEUE_LABELS,
    help: "Body bytes of the requests held in the flow-control queues.",
    twin: twin("llm_d_epp_flow_control_queue_bytes"),
    ..BASE
};

/// Time from entering flow control to the final outcome (recorded in microseconds).
pub const FLOW_QUEUE_DURATION: Metric = Metric {
    name: "inference_extension_flow_control_request_queue_duration_seconds",
    kind: Kind::Histogram,
    labels: &[
        "fairness_id",
        "priority",
        "outcome",
        "inference_pool",
        "model_name",
        "target_model_name",
    ],
    help: "Time from entering flow control to the request's final outcome.",
    unit: Unit::Micros,
    buckets: FCQ_BUCKETS,
    twin: twin("llm_d_epp_flow_control_request_queue_duration_seconds"),
    ..BASE
};

/// Requests by final flow-control outcome (llm-d router only).
pub const FLOW_REQUESTS: Metric = Metric {
    name: "llm_d_epp_flow_control_requests_total",
    labels: &["outcome", "priority", "inference_pool"],
    help: "Requests that left flow control, by outcome.",
    ..BASE
};

/// Time the admission decision took (recorded in microseconds).
pub const FLOW_ENQUEUE_DURATION: Metric = Metric {
    name: "inference_extension_flow_control_request_enqueue_duration_seconds",
    kind: Kind::Histogram,
    labels: &["fairness_id", "priority", "outcome"],
    help: "Time the flow-control admission decision took.",
    unit: Unit::Micros,
    buckets: SCHED_BUCKETS,
    twin: twin("llm_d_epp_flow_control_request_enqueue_duration_seconds"),
    ..BASE
};

/// Time one dispatch cycle took (recorded in microseconds).
pub const FLOW_DISPATCH_CYCLE_DURATION: Metric = Metric {
    name: "inference_extension_flow_control_dispatch_cycle_duration_seconds",
    kind: Kind::Histogram,
    help: "Time one flow-control dispatch cycle took.",
    unit: Unit::Micros,
    buckets: SCHED_BUCKETS,
    twin: twin("llm_d_epp_flow_control_dispatch_cycle_duration_seconds"),
    ..BASE
};

/// The saturation detector's value (recorded in thousandths; it can exceed 1).
pub const FLOW_POOL_SATURATION: Metric = Metric {
    name: "inference_extension_flow_control_pool_saturation",
    kind: Kind::Level,
    labels: &["inference_pool"],
    help: "The saturation detector's value; 1 is the gating set point.",
    unit: Unit::Thousandths,
    twin: Some(Twin {
        name: "llm_d_epp_flow_control_pool_saturation",
        labels: &[],
        constant: &[("stage", "effective")],
    }),
    ..BASE
};

/// Endpoints whose metrics are missing or stale for the detector (llm-d router only).
pub const FLOW_STALE_ENDPOINTS: Metric = Metric {
    name: "llm_d_epp_flow_control_stale_endpoints",
    kind: Kind::Level,
    labels: &["detector"],
    help: "Endpoints whose metrics are missing or older than the detector's staleness threshold.",
    ..BASE
};

/// Endpoints ejected by passive health (`pool.passiveHealth`), per endpoint (labels as
/// [`SCHEDULER_ATTEMPTS`]'s). Not a reference metric.
pub const PASSIVE_HEALTH_EJECTIONS: Metric = Metric {
    name: "inference_extension_passive_health_ejections_total",
    labels: &["pod_name", "namespace", "port"],
    help:
        "Endpoints ejected by passive health after consecutive 5xx answers or connection failures.",
    ..BASE
};

// --- SLO-aware routing and the latency predictor -------------------------------------
// Per request (recorded by the worker that served it, at the end of the stream, for
// requests routed with a latency producer configured); durations in microseconds. The
// predicted latencies have the llm-d router's twins; its one
// `llm_d_epp_request_slo_violation_total` (TTFT and TPOT in one family) is not exported
// yet: two metrics cannot share a twin family here. They are Envoy stats too (a host call
// per request each), but only with a latency producer configured.

/// Labels of the per-request latency metrics.
const OBJECTIVE_LABELS: &[&str] = &["model_name", "target_model_name"];

/// TTFT buckets (seconds): the reference's general latency buckets below 10 s, finer
/// where interactive objectives sit.
const TTFT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0,
];
/// TPOT buckets (seconds).
const TPOT_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0,
];

/// Observed time to first token (dispatch → first body chunk; → end when not streamed).
pub const OBJECTIVE_TTFT: Metric = Metric {
    name: "inference_objective_request_ttft_seconds",
    kind: Kind::Histogram,
    labels: OBJECTIVE_LABELS,
    help: "Observed time to first token (to the end of the response when not streamed).",
    unit: Unit::Micros,
    buckets: TTFT_BUCKETS,
    twin: None,
    envoy: true,
};

/// TTFT predicted at pick time for the endpoint chosen.
pub const OBJECTIVE_PREDICTED_TTFT: Metric = Metric {
    name: "inference_objective_request_predicted_ttft_seconds",
    kind: Kind::Histogram,
    labels: OBJECTIVE_LABELS,
    help: "Time to first token the latency predictor expected on the endpoint chosen.",
    unit: Unit::Micros,
    buckets: TTFT_BUCKETS,
    twin: twin("llm_d_epp_request_predicted_ttft_seconds"),
    envoy: true,
};

/// Observed time per output token (streamed responses).
pub const OBJECTIVE_TPOT: Metric = Metric {
    name: "inference_objective_request_tpot_seconds",
    kind: Kind::Histogram,
    labels: OBJECTIVE_LABELS,
    help: "Observed time per output token of streamed responses.",
    unit: Unit::Micros,
    buckets: TPOT_BUCKETS,
    twin: None,
    envoy: true,
};

/// TPOT predicted at pick time for the endpoint chosen.
pub const OBJECTIVE_PREDICTED_TPOT: Metric = Metric {
    name: "inference_objective_request_predicted_tpot_seconds",
    kind: Kind::Histogram,
    labels: OBJECTIVE_LABELS,
    help: "Time per output token the latency predictor expected on the endpoint chosen.",
    unit: Unit::Micros,
    buckets: TPOT_BUCKETS,
    twin: twin("llm_d_epp_request_predicted_tpot_seconds"),
    envoy: true,
};

/// The last observed TTFT per model (the reference's `_gauge` variant of
/// [`OBJECTIVE_TTFT`]; set by the worker that served the request).
pub const OBJECTIVE_TTFT_GAUGE: Metric = Metric {
    name: "inference_objective_request_ttft_seconds_gauge",
    kind: Kind::Level,
    labels: OBJECTIVE_LABELS,
    help: "Time to first token of the last request observed.",
    unit: Unit::Micros,
    ..BASE
};

/// The TTFT predicted for the last request observed ([`OBJECTIVE_PREDICTED_TTFT`]'s gauge).
pub const OBJECTIVE_PREDICTED_TTFT_GAUGE: Metric = Metric {
    name: "inference_objective_request_predicted_ttft_seconds_gauge",
    kind: Kind::Level,
    labels: OBJECTIVE_LABELS,
    help: "Time to first token the latency predictor expected for the last request observed.",
    unit: Unit::Micros,
    ..BASE
};

/// The last observed TPOT per model ([`OBJECTIVE_TPOT`]'s gauge).
pub const OBJECTIVE_TPOT_GAUGE: Metric = Metric {
    name: "inference_objective_request_tpot_seconds_gauge",
    kind: Kind::Level,
    labels: OBJECTIVE_LABELS,
    help: "Time per output token of the last streamed request observed.",
    unit: Unit::Micros,
    ..BASE
};

/// The TPOT predicted for the last request observed ([`OBJECTIVE_PREDICTED_TPOT`]'s gauge).
pub const OBJECTIVE_PREDICTED_TPOT_GAUGE: Metric = Metric {
    name: "inference_objective_request_predicted_tpot_seconds_gauge",
    kind: Kind::Level,
    labels: OBJECTIVE_LABELS,
    help: "Time per output token the latency predictor expected for the last streamed request observed.",
    unit: Unit::Micros,
    ..BASE
};

/// Prediction buckets (seconds): an in-filter prediction over a pool takes microseconds.
const PREDICTION_BUCKETS: &[f64] = &[
    0.000_001, 0.000_002, 0.000_005, 0.000_01, 0.000_02, 0.000_05, 0.000_1, 0.000_2, 0.000_5,
    0.001, 0.01,
];

/// Time to predict a request's TTFT over all its candidate endpoints (recorded in
/// microseconds, on the decisions whose plugins are timed). TTFT and TPOT are predicted
/// in one pass; both histograms record that pass.
pub const OBJECTIVE_TTFT_PREDICTION_DURATION: Metric = Metric {
    name: "inference_objective_request_ttft_prediction_duration_seconds",
    kind: Kind::Histogram,
    labels: OBJECTIVE_LABELS,
    help: "Time the in-filter latency predictor took for one request over all its candidate endpoints (TTFT and TPOT in one pass).",
    unit: Unit::Micros,
    buckets: PREDICTION_BUCKETS,
    twin: twin("llm_d_epp_request_ttft_prediction_duration_seconds"),
    ..BASE
};

/// [`OBJECTIVE_TTFT_PREDICTION_DURATION`] for TPOT (the same pass).
pub const OBJECTIVE_TPOT_PREDICTION_DURATION: Metric = Metric {
    name: "inference_objective_request_tpot_prediction_duration_seconds",
    kind: Kind::Histogram,
    labels: OBJECTIVE_LABELS,
    help: "Time the in-filter latency predictor took for one request over all its candidate endpoints (TTFT and TPOT in one pass).",
    unit: Unit::Micros,
    buckets: PREDICTION_BUCKETS,
    twin: twin("llm_d_epp_request_tpot_prediction_duration_seconds"),
    ..BASE
};

/// The last prediction's duration ([`OBJECTIVE_TTFT_PREDICTION_DURATION`]'s gauge).
pub const OBJECTIVE_TTFT_PREDICTION_DURATION_GAUGE: Metric = Metric {
    name: "inference_objective_request_ttft_prediction_duration_seconds_gauge",
    kind: Kind::Level,
    labels: OBJECTIVE_LABELS,
    help: "Time the last timed in-filter prediction took (TTFT and TPOT in one pass).",
    unit: Unit::Micros,
    ..BASE
};

/// The last prediction's duration ([`OBJECTIVE_TPOT_PREDICTION_DURATION`]'s gauge).
pub const OBJECTIVE_TPOT_PREDICTION_DURATION_GAUGE: Metric = Metric {
    name: "inference_objective_request_tpot_prediction_duration_seconds_gauge",
    kind: Kind::Level,
    labels: OBJECTIVE_LABELS,
    help: "Time the last timed in-filter prediction took (TTFT and TPOT in one pass).",
    unit: Unit::Micros,
    ..BASE
};

/// Requests whose observed latency exceeded their SLO, by `type` (`ttft` or `tpot`): the
/// reference's one family (and the router's twin).
pub const OBJECTIVE_SLO_VIOLATION: Metric = Metric {
    name: "inference_objective_request_slo_violation_total",
    labels: &["model_name", "target_model_name", "type"],
    help: "Requests whose observed latency exceeded their SLO, by type (ttft, tpot).",
    twin: twin("llm_d_epp_request_slo_violation_total"),
    ..BASE
};

/// Requests whose observed TTFT exceeded their `x-llm-d-slo-ttft-ms`.
pub const OBJECTIVE_TTFT_SLO_VIOLATION: Metric = Metric {
    name: "inference_objective_request_ttft_slo_violation_total",
    labels: OBJECTIVE_LABELS,
    help: "Requests whose observed time to first token exceeded their TTFT SLO.",
    ..BASE
};

/// Requests whose observed TPOT exceeded their `x-llm-d-slo-tpot-ms`.
pub const OBJECTIVE_TPOT_SLO_VIOLATION: Metric = Metric {
    name: "inference_objective_request_tpot_slo_violation_total",
    labels: OBJECTIVE_LABELS,
    help: "Requests whose observed time per output token exceeded their TPOT SLO.",
    ..BASE
};

// The predictor's health: set by the VM that trains, after each training tick;
// `prediction` is `ttft` or `tpot`.

/// Samples the model has been trained on.
pub const PREDICTOR_SAMPLES: Metric = Metric {
    name: "inference_extension_latency_predictor_samples",
    kind: Kind::Level,
    labels: &["prediction"],
    help: "Samples the latency predictor has been trained on.",
    ..BASE
};

/// The running mean absolute percentage error of the predictions used, in thousandths
/// (exported as a fraction: 0.05 = 5 %).
pub const PREDICTOR_ERROR: Metric = Metric {
    name: "inference_extension_latency_predictor_error",
    kind: Kind::Level,
    labels: &["prediction"],
    help: "Running mean absolute percentage error of the predictions routing used (fraction).",
    unit: Unit::Thousandths,
    ..BASE
};

/// The absolute percentage errors of the predictions routing used, summed, in
/// thousandths (exported as a fraction): with [`PREDICTOR_SCORED`], the mean absolute
/// percentage error over any window (Δ sum ÷ Δ count).
pub const PREDICTOR_ABS_ERROR: Metric = Metric {
    name: "inference_extension_latency_predictor_absolute_percentage_error_total",
    labels: &["prediction"],
    help: "Sum of |predicted - observed| / observed over the predictions routing used (fraction); divide its increase by the increase of inference_extension_latency_predictor_scored_total for the MAPE over a window.",
    unit: Unit::Thousandths,
    ..BASE
};

/// Predictions routing used whose outcome was observed.
pub const PREDICTOR_SCORED: Metric = Metric {
    name: "inference_extension_latency_predictor_scored_total",
    labels: &["prediction"],
    help: "Predictions routing used whose observed latency came back.",
    ..BASE
};

/// When the model was last trained (ms since the Unix epoch, host clock).
pub const PREDICTOR_TRAINED: Metric = Metric {
    name: "inference_extension_latency_predictor_last_train_timestamp_ms",
    kind: Kind::Level,
    labels: &[],
    help: "When the latency predictor was last trained (ms since the Unix epoch).",
    ..BASE
};

/// Training ticks' buckets (seconds): a tick trains on at most a few hundred samples.
const TRAIN_BUCKETS: &[f64] = &[
    0.000_01, 0.000_02, 0.000_05, 0.000_1, 0.000_2, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.05,
];

/// One training tick of the VM that trains (recorded in microseconds): taking the
/// pending samples from shared data, training on them, publishing the model.
pub const PREDICTOR_TRAIN_DURATION: Metric = Metric {
    name: "inference_extension_latency_predictor_train_duration_seconds",
    kind: Kind::Histogram,
    labels: &[],
    help: "Time one training tick of the latency predictor took on the worker that trains (take the samples, train, publish).",
    unit: Unit::Micros,
    buckets: TRAIN_BUCKETS,
    ..BASE
};

/// Every metric the filter defines.
pub const ALL: &[Metric] = &[
    SCHEDULER_ATTEMPTS,
    OBJECTIVE_RUNNING_REQUESTS,
    REQUEST_RUNNING,
    OBJECTIVE_REQUEST_TOTAL,
    OBJECTIVE_REQUEST_ERROR_TOTAL,
    OBJECTIVE_REQUEST_DURATION,
    OBJECTIVE_REQUEST_SIZES,
    OBJECTIVE_RESPONSE_SIZES,
    POOL_READY_PODS,
    POOL_AVERAGE_KV,
    POOL_AVERAGE_QUEUE,
    POOL_PER_POD_QUEUE,
    POOL_AVERAGE_RUNNING,
    SCHEDULER_E2E_DURATION,
    PLUGIN_DURATION,
    PREFIX_INDEXER_SIZE,
    PREFIX_INDEXER_HIT_RATIO,
    PREFIX_INDEXER_HIT_BYTES,
    PREFIX_PREDICTED_HIT_TOKENS,
    PREFIX_REPORTED_HIT_TOKENS,
    PREFIX_REPORTED_PROMPT_TOKENS,
    PREFIX_FEEDBACK,
    INFO,
    MODEL_REWRITE_DECISIONS,
    FLOW_QUEUE_SIZE,
    FLOW_QUEUE_BYTES,
    FLOW_QUEUE_DURATION,
    FLOW_REQUESTS,
    FLOW_ENQUEUE_DURATION,
    FLOW_DISPATCH_CYCLE_DURATION,
    FLOW_POOL_SATURATION,
    FLOW_STALE_ENDPOINTS,
    PASSIVE_HEALTH_EJECTIONS,
    OBJECTIVE_TTFT,
    OBJECTIVE_PREDICTED_TTFT,
    OBJECTIVE_TPOT,
    OBJECTIVE_PREDICTED_TPOT,
    OBJECTIVE_TTFT_GAUGE,
    OBJECTIVE_PREDICTED_TTFT_GAUGE,
    OBJECTIVE_TPOT_GAUGE,
    OBJECTIVE_PREDICTED_TPOT_GAUGE,
    OBJECTIVE_TTFT_PREDICTION_DURATION,
    OBJECTIVE_TPOT_PREDICTION_DURATION,
    OBJECTIVE_TTFT_PREDICTION_DURATION_GAUGE,
    OBJECTIVE_TPOT_PREDICTION_DURATION_GAUGE,
    OBJECTIVE_SLO_VIOLATION,
    OBJECTIVE_TTFT_SLO_VIOLATION,
    OBJECTIVE_TPOT_SLO_VIOLATION,
    PREDICTOR_SAMPLES,
    PREDICTOR_ERROR,
    PREDICTOR_ABS_ERROR,
    PREDICTOR_SCORED,
    PREDICTOR_TRAINED,
    PREDICTOR_TRAIN_DURATION,
];

/// The metric of that name, if the filter defines it.
pub fn by_name(name: &str) -> Option<&'static Metric> {
    ALL.iter().find(|m| m.name == name)
}

impl Metric {
    /// The Envoy stat name for one label combination. Missing values are empty;
    /// `;` in a value becomes `_` so a value cannot break the encoding.
    pub fn stat_name(&self, values: &[&str]) -> String {
        let mut out = String::from(self.name);
        for (i, label) in self.labels.iter().enumerate() {
            let value = values.get(i).copied().unwrap_or("");
            out.push(';');
            out.push_str(label);
            out.push_str("=.=");
            out.extend(value.chars().map(|c| if c == ';' { '_' } else { c }));
            out.push_str(";.;");
        }
        out
    }
}

/// The reference's error codes for `inference_objective_request_error_total`.
pub fn error_code(status: u16) -> &'static str {
    match status {
        400 | 413 => "BadRequest",
        429 => "ResourceExhausted",
        503 => "ServiceUnavailable",
        500 => "Internal",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn labels_are_encoded_in_order() {
        assert_eq!(
            SCHEDULER_ATTEMPTS.stat_name(&["success", "llama", "10.0.0.1", "", "8000"]),
            "inference_extension_scheduler_attempts_total;status=.=success;.;;target_model_name=.=llama;.;\
             ;pod_name=.=10.0.0.1;.;;namespace=.=;.;;port=.=8000;.;"
        );
        assert_eq!(pod_labels("10.0.0.1:8000"), ("10.0.0.1", "", "8000"));
        assert_eq!(pod_labels("[::1]:8000"), ("::1", "", "8000"));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_value_cannot_break_out_of_its_label() {
        let name = OBJECTIVE_RUNNING_REQUESTS.stat_name(&["a;.;b"]);
        assert_eq!(
            name,
            "inference_objective_running_requests;model_name=.=a_._b;.;"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn every_label_has_a_stats_tags_rule_in_the_envoy_bootstrap() {
        let rules = include_str!("../../../envoy/stats-tags.yaml");
        for metric in ALL {
            for label in metric.labels {
                let rule = format!("tag_name: {label}\n");
                assert!(rules.contains(&rule), "no stats_tags rule for `{label}`");
                let regex = format!("regex: '(;{label}=\\.=(.*?);\\.;)'");
                assert!(
                    rules.contains(&regex),
                    "rule for `{label}` is not `{regex}`"
                );
            }
        }
    }
}
