//! One request's path through the filter.
//!
//! Headers: strip the headers only the gateway may set, pause for the body.
//! Body: buffer to the end, enforce the size limit (413), parse (400), pick the
//! endpoint with the fewest requests in flight across workers, write
//! `x-gateway-destination-endpoint`, continue. Response: name the endpoint that served.
//! End of stream, however it ends: release the in-flight count.

use super::{host, host::Map, stats, store::HostStore};
use crate::config::Config;
use crate::errors::ApiError;
use crate::inflight;
use crate::metrics;
use crate::openai::{parse_request, Api};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::rc::Rc;

/// Request header carrying the chosen endpoint to the ORIGINAL_DST cluster.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// Response header naming the endpoint that served.
pub const SERVED: &str = "x-gateway-destination-endpoint-served";
/// Headers a client must not set: the gateway owns them.
const SYSTEM_OWNED: [&str; 2] = [DESTINATION, SERVED];

/// A request scheduled to an endpoint and not yet finished.
struct InFlight {
    endpoint: String,
    model: String,
}

pub struct Http {
    id: u32,
    vm: u64,
    config: Rc<Config>,
    path: String,
    in_flight: Option<InFlight>,
}

impl Http {
    pub fn new(id: u32, config: Rc<Config>, vm: u64) -> Self {
        Self {
            id,
            vm,
            config,
            path: String::new(),
            in_flight: None,
        }
    }

    /// Answers the request with an OpenAI-style error and stops it.
    fn reject(&mut self, error: &ApiError, model: &str) -> Action {
        stats::add(
            &metrics::OBJECTIVE_REQUEST_ERROR_TOTAL,
            &[model, model, metrics::error_code(error.status)],
            1,
        );
        let body = error.body();
        let headers = [("content-type", "application/json")];
        match host::send_local_response(error.status, &headers, body.as_bytes()) {
            Ok(()) => Action::Pause,
            Err(status) => {
                // Nothing routes a request without a destination: Envoy answers 503.
                log::error!(
                    "cannot send a local {} reply: status {status}",
                    error.status
                );
                Action::Continue
            }
        }
    }

    /// Picks the endpoint, writes the destination header, counts the request in flight.
    fn schedule(&mut self, model: &str) -> Action {
        let candidates: Vec<&str> = self
            .config
            .pool
            .endpoints
            .iter()
            .map(|e| e.address.as_str())
            .collect();
        let now = host::now_ms().unwrap_or(0);
        let seed = u64::from(self.id) ^ self.vm.rotate_left(32);
        let picked = match inflight::acquire(&HostStore, self.vm, &candidates, now, seed) {
            Ok(p) => p,
            Err(e) => {
                log::error!("in-flight ledger unavailable: {e:?}");
                return self.fail_schedule(model, "the gateway's endpoint state is unavailable");
            }
        };
        let Some(endpoint) = picked else {
            return self.fail_schedule(model, "no model server endpoint is available");
        };
        if let Err(status) = host::set_header(Map::RequestHeaders, DESTINATION, &endpoint) {
            log::error!("cannot set {DESTINATION}: status {status}");
            if let Err(e) = inflight::release(&HostStore, self.vm, &endpoint, now) {
                log::warn!("in-flight release failed: {e:?}");
            }
            return self.fail_schedule(model, "the gateway could not route the request");
        }
        stats::add(&metrics::SCHEDULER_ATTEMPTS, &["success", model], 1);
        stats::add(&metrics::OBJECTIVE_REQUEST_TOTAL, &[model, model], 1);
        stats::add(&metrics::OBJECTIVE_RUNNING_REQUESTS, &[model], 1);
        self.in_flight = Some(InFlight {
            endpoint,
            model: model.to_string(),
        });
        Action::Continue
    }

    fn fail_schedule(&mut self, model: &str, why: &str) -> Action {
        stats::add(&metrics::SCHEDULER_ATTEMPTS, &["failure", model], 1);
        self.reject(&ApiError::unavailable(why), model)
    }

    /// Releases the in-flight count, once.
    fn release(&mut self) {
        if let Some(done) = self.in_flight.take() {
            let now = host::now_ms().unwrap_or(0);
            if let Err(e) = inflight::release(&HostStore, self.vm, &done.endpoint, now) {
                log::warn!("in-flight release of {} failed: {e:?}", done.endpoint);
            }
            stats::add(&metrics::OBJECTIVE_RUNNING_REQUESTS, &[&done.model], -1);
        }
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
        for name in SYSTEM_OWNED {
            if let Err(status) = host::remove_header(Map::RequestHeaders, name) {
                log::warn!("cannot strip {name}: status {status}");
            }
        }
        self.path = host::header(Map::RequestHeaders, ":path")
            .ok()
            .flatten()
            .unwrap_or_default();
        if end_of_stream {
            // No body (GET /v1/models and the like): any endpoint will do.
            return self.schedule("");
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
        match parse_request(Api::from_path(&self.path), &body) {
            Ok(request) => self.schedule(&request.model),
            Err(e) => self.reject(&e, ""),
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Some(in_flight) = &self.in_flight else {
            return Action::Continue;
        };
        // The address Envoy actually connected to (after any retry); our pick otherwise.
        let served = host::property(&["upstream", "address"])
            .ok()
            .flatten()
            .and_then(|b| String::from_utf8(b).ok())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| in_flight.endpoint.clone());
        if let Err(status) = host::set_header(Map::ResponseHeaders, SERVED, &served) {
            log::warn!("cannot set {SERVED}: status {status}");
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        self.release();
    }
}
