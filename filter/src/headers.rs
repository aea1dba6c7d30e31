//! Every HTTP header name of the protocol, in one place: what the gateway reads from
//! clients, what it writes for Envoy and the model servers, and what it answers with.
//! Where the reference's two generations differ (Gateway API Inference Extension,
//! `x-gateway-*`; llm-d router, `x-llm-d-*`), both are read, the first found wins.

/// Request header carrying the chosen endpoints (primary, then fallbacks,
/// comma-separated), as the reference protocol defines it. An `override_host` cluster
/// takes its first member.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// Request header carrying the primary endpoint alone: what our `ORIGINAL_DST` cluster
/// routes on (it reads a single `ip:port`, so a fallback list in [`DESTINATION`] would
/// make it fail).
pub const PRIMARY: &str = "x-gateway-destination-endpoint-primary";
/// Request header restricting the candidates (read, then stripped before upstream).
pub const SUBSET: &str = "x-gateway-destination-endpoint-subset";
/// Request header naming the prefill endpoint (P/D disaggregation).
pub const PREFILLER: &str = "x-prefiller-host-port";
/// Response header naming the endpoint that served.
pub const SERVED: &str = "x-gateway-destination-endpoint-served";
/// The request's tenant for fairness (GIE name, router name).
pub const FAIRNESS_ID: [&str; 2] = [
    "x-gateway-inference-fairness-id",
    "x-llm-d-inference-fairness-id",
];
/// The request's objective, which gives its priority (GIE name, router name).
pub const OBJECTIVE: [&str; 2] = [
    "x-gateway-inference-objective",
    "x-llm-d-inference-objective",
];
/// The request's time-to-first-token objective in ms (GIE name, router name).
pub const SLO_TTFT: [&str; 2] = ["x-slo-ttft-ms", "x-llm-d-slo-ttft-ms"];
/// Model rewrite (GIE name, router name).
pub const MODEL_REWRITE: [&str; 2] = ["x-gateway-model-name-rewrite", "x-llm-d-model-name-rewrite"];
/// Session affinity: the client sends back the token the gateway answered with.
pub const SESSION_TOKEN: &str = "x-session-token";
/// On the metrics callouts: the endpoint the `ORIGINAL_DST` scrape cluster connects to.
pub const ORIGINAL_DST_HOST: &str = "x-envoy-original-dst-host";

/// Headers a client must not pass upstream or set itself: the gateway owns them (the
/// subset hint and the rewrite headers are read first).
pub const GATEWAY_OWNED: [&str; 11] = [
    DESTINATION,
    PRIMARY,
    PREFILLER,
    SERVED,
    SUBSET,
    MODEL_REWRITE[0],
    MODEL_REWRITE[1],
    FAIRNESS_ID[0],
    FAIRNESS_ID[1],
    OBJECTIVE[0],
    OBJECTIVE[1],
];
