//! One request's path through the filter.
//!
//! Headers: classify the flow (fairness id, objective → priority, SLO), strip the
//! headers only the gateway may set, pause for the body. Body: buffer to the end,
//! enforce the size limit (413), parse (400), pass flow control (go, park or 429),
//! route. Response: name the endpoint that served. End of stream, however it ends:
//! release what the request held.

use super::flow::{self, Admit, RequestMeta};
use super::vm::{self, Running};
use super::{host, host::Map, route, stats};
use crate::config::Config;
use crate::errors::ApiError;
use crate::flow_control::ordering::slo_deadline;
use crate::metrics;
use crate::openai::{parse_request, Api};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::rc::Rc;

/// Response header naming the endpoint that served.
pub const SERVED: &str = "x-gateway-destination-endpoint-served";
/// Fairness id header, and the router's alias.
const FAIRNESS_ID: [&str; 2] = [
    "x-gateway-inference-fairness-id",
    "x-llm-d-inference-fairness-id",
];
/// Objective header, and the router's alias.
const OBJECTIVE: [&str; 2] = [
    "x-gateway-inference-objective",
    "x-llm-d-inference-objective",
];
/// TTFT SLO header, and the router's name.
const SLO_TTFT: [&str; 2] = [slo_deadline::HEADER, "x-llm-d-slo-ttft-ms"];
/// The flow of requests without a fairness id.
pub const DEFAULT_FAIRNESS_ID: &str = "default-flow";
/// Headers a client must not pass upstream or set itself: the gateway owns them.
const SYSTEM_OWNED: [&str; 8] = [
    route::DESTINATION,
    SERVED,
    "x-gateway-destination-endpoint-subset",
    "x-gateway-model-name-rewrite",
    FAIRNESS_ID[0],
    FAIRNESS_ID[1],
    OBJECTIVE[0],
    OBJECTIVE[1],
];

pub struct Http {
    id: u32,
    config: Rc<Config>,
    path: String,
    fairness_id: String,
    objective: Option<String>,
    slo_ttft_ms: Option<u64>,
    received_us: u64,
}

fn first_header(names: &[&str]) -> Option<String> {
    names
        .iter()
        .find_map(|n| host::header(Map::RequestHeaders, n).ok().flatten())
        .filter(|v| !v.is_empty())
}

impl Http {
    pub fn new(id: u32, config: Rc<Config>) -> Self {
        Self {
            id,
            config,
            path: String::new(),
            fairness_id: DEFAULT_FAIRNESS_ID.to_string(),
            objective: None,
            slo_ttft_ms: None,
            received_us: 0,
        }
    }

    /// Answers with an error and stops the request.
    fn reject(&self, error: &ApiError, model: &str) -> Action {
        if route::reply(error, model, &[]) {
            Action::Pause
        } else {
            // Nothing routes a request without a destination: Envoy answers 503.
            Action::Continue
        }
    }

    /// Routes the request now and remembers it as running.
    fn go(&self, model: &str, flow_controlled: bool, tokens: u64) -> Action {
        let vm_id = vm::id();
        match route::route(vm_id, self.id, &self.config, model) {
            Ok(endpoint) => {
                vm::with(|vm| {
                    vm.running.insert(
                        self.id,
                        Running {
                            endpoint,
                            model: model.to_string(),
                            tokens,
                            flow_controlled,
                        },
                    )
                });
                Action::Continue
            }
            Err(e) => {
                if flow_controlled {
                    // Give the flow-control slot back.
                    let held = Running {
                        endpoint: String::new(),
                        model: model.to_string(),
                        tokens,
                        flow_controlled,
                    };
                    flow::finished(&held, self.id);
                }
                self.reject(&e, model)
            }
        }
    }

    /// Releases whatever the request held, once.
    fn release(&mut self) {
        if flow::cancelled(self.id, self.id) {
            return;
        }
        let Some(Some(done)) = vm::with(|vm| vm.running.remove(&self.id)) else {
            return;
        };
        route::release(vm::id(), &done.endpoint);
        stats::add(&metrics::OBJECTIVE_RUNNING_REQUESTS, &[&done.model], -1);
        flow::finished(&done, self.id);
    }
}

impl Context for Http {
    fn on_done(&mut self) -> bool {
        self.release();
        true
    }
}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.received_us = host::now_us().unwrap_or(0);
        self.path = host::header(Map::RequestHeaders, ":path")
            .ok()
            .flatten()
            .unwrap_or_default();
        if let Some(id) = first_header(&FAIRNESS_ID) {
            self.fairness_id = id;
        }
        self.objective = first_header(&OBJECTIVE);
        self.slo_ttft_ms = slo_deadline::parse_header(first_header(&SLO_TTFT).as_deref());
        for name in SYSTEM_OWNED {
            if let Err(status) = host::remove_header(Map::RequestHeaders, name) {
                log::warn!("cannot strip {name}: status {status}");
            }
        }
        if end_of_stream {
            // No body (GET /v1/models and the like): any endpoint will do.
            return self.go("", false, 0);
        }
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let limit = self.config.pool.max_request_body_bytes;
        if body_size > limit {
            return self.reject(&ApiError::body_too_large(body_size, limit), "");
        }
        if !end_of_stream {
            return Action::Pause;
        }
        let body = match host::request_body(body_size) {
            Ok(b) => b,
            Err(status) => {
                let e =
                    ApiError::internal(format!("cannot read the request body (status {status})"));
                return self.reject(&e, "");
            }
        };
        let request = match parse_request(Api::from_path(&self.path), &body) {
            Ok(r) => r,
            Err(e) => return self.reject(&e, ""),
        };
        let meta = RequestMeta {
            fairness_id: &self.fairness_id,
            priority: self.config.pool.priority_of(self.objective.as_deref()),
            model: &request.model,
            bytes: u64::try_from(body.len()).unwrap_or(u64::MAX),
            received_us: self.received_us,
            slo_ttft_ms: self.slo_ttft_ms,
        };
        match flow::admit(self.id, &meta) {
            Admit::Go {
                flow_controlled,
                tokens,
            } => self.go(&request.model, flow_controlled, tokens),
            Admit::Parked => {
                // Envoy holds the body in the 16 KiB read slice it arrived in; a copy of
                // the exact size makes a parked stream much cheaper to hold.
                if let Err(status) = host::replace_request_body(body_size, &body) {
                    log::debug!("cannot compact the parked body: status {status}");
                }
                Action::Pause
            }
            Admit::Reject(e) => self.reject(&e, &request.model),
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Some(Some(endpoint)) =
            vm::with(|vm| vm.running.get(&self.id).map(|r| r.endpoint.clone()))
        else {
            return Action::Continue;
        };
        // The address Envoy actually connected to (after any retry); our pick otherwise.
        let served = host::property(&["upstream", "address"])
            .ok()
            .flatten()
            .and_then(|b| String::from_utf8(b).ok())
            .filter(|s| !s.is_empty())
            .unwrap_or(endpoint);
        if let Err(status) = host::set_header(Map::ResponseHeaders, SERVED, &served) {
            log::warn!("cannot set {SERVED}: status {status}");
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        self.release();
    }
}
