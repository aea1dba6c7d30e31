//! The metrics the filter exports, and how their labels are encoded in Envoy stat names.
//!
//! Proxy-Wasm metrics have no labels. Envoy recovers them from the stat name with
//! the `stats_tags` rules in `envoy/stats-tags.yaml`: each label is written as
//! `;<label>=.=<value>;.;` after the metric name, and the rule for `<label>` cuts that
//! piece out and makes it a tag. So `/stats/prometheus` shows
//! `inference_extension_scheduler_attempts_total{status="success"} 3`.
//! The leading `;` keeps `model_name` from matching inside `target_model_name`.
//!
//! Envoy stats are integers, so three values are scaled (the names stay the reference's):
//! * `inference_pool_average_kv_cache_utilization` is in **percent** (0–100), rounded;
//! * `inference_extension_prefix_indexer_hit_ratio` observes **percent** (0–100);
//! * the `*_duration_seconds` histograms observe **microseconds** (bucket bounds in
//!   `envoy/bootstrap.yaml.in` are the reference's SCHED buckets × 10⁶).
//!
//! Gauges that describe the pool (`inference_pool_*`, `inference_extension_prefix_indexer_size`,
//! `inference_extension_info`) are *set* (`record_metric`) by the VM holding the scrape
//! lease; per-request metrics are incremented by the worker that owns the request.

/// Prometheus metric type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down (workers add and subtract; nobody sets).
    Gauge,
    /// Observations in buckets (bucket bounds come from the Envoy bootstrap).
    Histogram,
}

/// A metric: its reference name, type, and label names in encoding order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    /// The name users see in Prometheus.
    pub name: &'static str,
    /// Its type.
    pub kind: Kind,
    /// Its labels, in the order values are passed to [`Metric::stat_name`].
    pub labels: &'static [&'static str],
}

/// Scheduling attempts by outcome (`success` or `failure`) and the model targeted.
pub const SCHEDULER_ATTEMPTS: Metric = Metric {
    name: "inference_extension_scheduler_attempts_total",
    kind: Kind::Counter,
    labels: &[
        "status",
        "target_model_name",
        "pod_name",
        "namespace",
        "port",
    ],
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
};

/// Requests that passed parsing, by model.
pub const OBJECTIVE_REQUEST_TOTAL: Metric = Metric {
    name: "inference_objective_request_total",
    kind: Kind::Counter,
    labels: &["model_name", "target_model_name"],
};

/// Requests the gateway answered with an error, by model and error code.
pub const OBJECTIVE_REQUEST_ERROR_TOTAL: Metric = Metric {
    name: "inference_objective_request_error_total",
    kind: Kind::Counter,
    labels: &["model_name", "target_model_name", "error_code"],
};

/// Endpoints with fresh metrics (≤ 2 s), by pool.
pub const POOL_READY_PODS: Metric = Metric {
    name: "inference_pool_ready_pods",
    kind: Kind::Gauge,
    labels: &["name"],
};

/// Mean KV-cache utilization over fresh endpoints, in percent.
pub const POOL_AVERAGE_KV: Metric = Metric {
    name: "inference_pool_average_kv_cache_utilization",
    kind: Kind::Gauge,
    labels: &["name"],
};

/// Mean waiting queue over fresh endpoints (rounded).
pub const POOL_AVERAGE_QUEUE: Metric = Metric {
    name: "inference_pool_average_queue_size",
    kind: Kind::Gauge,
    labels: &["name"],
};

/// Waiting queue of each endpoint.
pub const POOL_PER_POD_QUEUE: Metric = Metric {
    name: "inference_pool_per_pod_queue_size",
    kind: Kind::Gauge,
    labels: &["name", "model_server_pod"],
};

/// Mean running requests over fresh endpoints (rounded).
pub const POOL_AVERAGE_RUNNING: Metric = Metric {
    name: "inference_pool_average_running_requests",
    kind: Kind::Gauge,
    labels: &["name"],
};

/// End-to-end scheduling latency (microseconds).
pub const SCHEDULER_E2E_DURATION: Metric = Metric {
    name: "inference_extension_scheduler_e2e_duration_seconds",
    kind: Kind::Histogram,
    labels: &[],
};

/// Per-plugin latency (microseconds).
pub const PLUGIN_DURATION: Metric = Metric {
    name: "inference_extension_plugin_duration_seconds",
    kind: Kind::Histogram,
    labels: &["extension_point", "plugin_type", "plugin_name"],
};

/// Entries in the prefix index.
pub const PREFIX_INDEXER_SIZE: Metric = Metric {
    name: "inference_extension_prefix_indexer_size",
    kind: Kind::Gauge,
    labels: &[],
};

/// Matched share of a request's blocks on the chosen endpoint (percent).
pub const PREFIX_INDEXER_HIT_RATIO: Metric = Metric {
    name: "inference_extension_prefix_indexer_hit_ratio",
    kind: Kind::Histogram,
    labels: &[],
};

/// Bytes of prompt matched on the chosen endpoint (`matched × blockSize × 4`).
pub const PREFIX_INDEXER_HIT_BYTES: Metric = Metric {
    name: "inference_extension_prefix_indexer_hit_bytes",
    kind: Kind::Histogram,
    labels: &[],
};

/// Build information, always 1.
pub const INFO: Metric = Metric {
    name: "inference_extension_info",
    kind: Kind::Gauge,
    labels: &["commit", "build_ref"],
};

/// The build's version (metric label `commit`).
pub const COMMIT: &str = env!("CARGO_PKG_VERSION");
/// The build reference (metric label `build_ref`).
pub const BUILD_REF: &str = concat!("epp-filter-", env!("CARGO_PKG_VERSION"));

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
};

/// Body bytes of the requests parked by flow control, by flow.
pub const FLOW_QUEUE_BYTES: Metric = Metric {
    name: "inference_extension_flow_control_queue_bytes",
    kind: Kind::Gauge,
    labels: QUEUE_LABELS,
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
};

/// Time the admission decision took (recorded in microseconds).
pub const FLOW_ENQUEUE_DURATION: Metric = Metric {
    name: "inference_extension_flow_control_request_enqueue_duration_seconds",
    kind: Kind::Histogram,
    labels: &["fairness_id", "priority", "outcome"],
};

/// Time one dispatch cycle took (recorded in microseconds).
pub const FLOW_DISPATCH_CYCLE_DURATION: Metric = Metric {
    name: "inference_extension_flow_control_dispatch_cycle_duration_seconds",
    kind: Kind::Histogram,
    labels: &[],
};

/// The saturation detector's value at the last dispatch cycle (recorded in thousandths).
pub const FLOW_POOL_SATURATION: Metric = Metric {
    name: "inference_extension_flow_control_pool_saturation",
    kind: Kind::Gauge,
    labels: &["inference_pool"],
};

// --- SLO-aware routing and the latency predictor -------------------------------------
// Per request (recorded by the worker that served it, at the end of the stream, for
// requests routed with a latency producer configured); durations in microseconds.

/// Labels of the per-request latency metrics.
const OBJECTIVE_LABELS: &[&str] = &["model_name", "target_model_name"];

/// Observed time to first token (dispatch → first body chunk; → end when not streamed).
pub const OBJECTIVE_TTFT: Metric = Metric {
    name: "inference_objective_request_ttft_seconds",
    kind: Kind::Histogram,
    labels: OBJECTIVE_LABELS,
};

/// TTFT predicted at pick time for the endpoint chosen.
pub const OBJECTIVE_PREDICTED_TTFT: Metric = Metric {
    name: "inference_objective_request_predicted_ttft_seconds",
    kind: Kind::Histogram,
    labels: OBJECTIVE_LABELS,
};

/// Observed time per output token (streamed responses).
pub const OBJECTIVE_TPOT: Metric = Metric {
    name: "inference_objective_request_tpot_seconds",
    kind: Kind::Histogram,
    labels: OBJECTIVE_LABELS,
};

/// TPOT predicted at pick time for the endpoint chosen.
pub const OBJECTIVE_PREDICTED_TPOT: Metric = Metric {
    name: "inference_objective_request_predicted_tpot_seconds",
    kind: Kind::Histogram,
    labels: OBJECTIVE_LABELS,
};

/// Requests whose observed TTFT exceeded their `x-llm-d-slo-ttft-ms`.
pub const OBJECTIVE_TTFT_SLO_VIOLATION: Metric = Metric {
    name: "inference_objective_request_ttft_slo_violation_total",
    kind: Kind::Counter,
    labels: OBJECTIVE_LABELS,
};

/// Requests whose observed TPOT exceeded their `x-llm-d-slo-tpot-ms`.
pub const OBJECTIVE_TPOT_SLO_VIOLATION: Metric = Metric {
    name: "inference_objective_request_tpot_slo_violation_total",
    kind: Kind::Counter,
    labels: OBJECTIVE_LABELS,
};

// The predictor's health: set by the VM that trains, after each training tick;
// `prediction` is `ttft` or `tpot`.

/// Samples the model has been trained on.
pub const PREDICTOR_SAMPLES: Metric = Metric {
    name: "inference_extension_latency_predictor_samples",
    kind: Kind::Gauge,
    labels: &["prediction"],
};

/// The running mean absolute percentage error of the predictions used, in thousandths
/// (50 = 5 %).
pub const PREDICTOR_ERROR: Metric = Metric {
    name: "inference_extension_latency_predictor_error_permille",
    kind: Kind::Gauge,
    labels: &["prediction"],
};

/// When the model was last trained (ms since the Unix epoch, host clock).
pub const PREDICTOR_TRAINED: Metric = Metric {
    name: "inference_extension_latency_predictor_last_train_timestamp_ms",
    kind: Kind::Gauge,
    labels: &[],
};

/// Every metric the filter defines.
pub const ALL: &[Metric] = &[
    SCHEDULER_ATTEMPTS,
    OBJECTIVE_RUNNING_REQUESTS,
    OBJECTIVE_REQUEST_TOTAL,
    OBJECTIVE_REQUEST_ERROR_TOTAL,
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
    INFO,
    FLOW_QUEUE_SIZE,
    FLOW_QUEUE_BYTES,
    FLOW_QUEUE_DURATION,
    FLOW_ENQUEUE_DURATION,
    FLOW_DISPATCH_CYCLE_DURATION,
    FLOW_POOL_SATURATION,
    OBJECTIVE_TTFT,
    OBJECTIVE_PREDICTED_TTFT,
    OBJECTIVE_TPOT,
    OBJECTIVE_PREDICTED_TPOT,
    OBJECTIVE_TTFT_SLO_VIOLATION,
    OBJECTIVE_TPOT_SLO_VIOLATION,
    PREDICTOR_SAMPLES,
    PREDICTOR_ERROR,
    PREDICTOR_TRAINED,
];

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
        let rules = include_str!("../../envoy/stats-tags.yaml");
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
