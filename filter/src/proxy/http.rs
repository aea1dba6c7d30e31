//! One request's path through the filter.
//!
//! Headers: classify the flow (fairness id, objective → priority, SLO), read the subset
//! hint, the model-rewrite header and the session token, strip the headers only the
//! gateway may set, pause for the body. Body: buffer to the end, enforce the size limit
//! (413), parse (400), apply the model rewrite, pass flow control (go, park or 429),
//! route (`route.rs`: the scheduler). Response: name the endpoint that served (and the
//! session token), put the client's model name back. End of stream, however it ends:
//! release what the request held.

use super::abi::{Action, Context, HttpContext};
use super::flow::{self, Admit, RequestMeta};
use super::route::RouteInput;
use super::vm::{self, Running};
use super::{feedback, host, host::Map, latency, route, stats};
use crate::classify::classify;
use crate::datalayer::parse_subset;
use crate::errors::ApiError;
use crate::flow_control::ordering::slo_deadline;
use crate::headers::{
    HeaderMap, GATEWAY_OWNED, MODEL_REWRITE, PREDICTION_BASED, PREDICTION_BASED_OFF, REQUEST_ID,
    SERVED, SESSION_TOKEN, SLO_TPOT, SLO_TTFT, SUBSET,
};
use crate::health::Outcome;
use crate::latency::Slo;
use crate::metrics;
use crate::model_rewrite;
use crate::openai::{parse_request, Api, InferenceRequest};
use crate::rng::Rng;
use crate::runtime::Runtime;
use crate::scheduler::handlers::slo_aware;
use crate::scheduler::scorers::session_affinity;
use crate::scheduler::session::Strategy;
use std::rc::Rc;

pub struct Http {
    id: u32,
    rt: Rc<Runtime>,
    /// The API, from the request's path.
    api: Api,
    fairness_id: String,
    objective: Option<String>,
    slo_ttft_ms: Option<u64>,
    slo: Slo,
    prediction_based: Option<bool>,
    received_us: u64,
    subset: Option<Vec<String>>,
    rewrite_header: Option<String>,
    session: Option<String>,
    /// A model rewrite to undo in the response.
    rewritten: Option<model_rewrite::Restorer>,
    response_bytes: u64,
}

impl Http {
    pub fn new(id: u32, rt: Rc<Runtime>) -> Self {
        Self {
            id,
            rt,
            api: Api::Completions,
            // Set by the request headers' classification (no allocation before).
            fairness_id: String::new(),
            objective: None,
            slo_ttft_ms: None,
            slo: Slo::default(),
            prediction_based: None,
            received_us: 0,
            subset: None,
            rewrite_header: None,
            session: None,
            rewritten: None,
            response_bytes: 0,
        }
    }

    /// The model to send ([`model_rewrite::target`]).
    fn target_model(&self, model: &str) -> String {
        let draw = Rng::new(u64::from(self.id) ^ vm::id()).next_f64();
        let (target, rule) =
            model_rewrite::target(model, self.rewrite_header.as_deref(), &self.rt.pool, draw);
        if let Some(rule) = rule {
            stats::add(
                &metrics::MODEL_REWRITE_DECISIONS,
                &[rule, model, &target],
                1,
            );
        }
        target
    }

    /// What routing needs, moved out of the request's headers (read once, routed once)
    /// and its parsed body (`model` is taken: read it from the input after this).
    fn route_input(
        &mut self,
        request: Option<&mut InferenceRequest<'_>>,
        target: String,
        body_bytes: usize,
    ) -> RouteInput {
        let streaming = request.as_ref().is_some_and(|r| r.stream);
        let api = request.as_ref().map(|r| r.api);
        RouteInput {
            model: request.map_or(String::new(), |r| std::mem::take(&mut r.model)),
            target,
            fairness_id: std::mem::take(&mut self.fairness_id),
            priority: self.rt.pool.priority_of(self.objective.as_deref()),
            api,
            body_bytes,
            subset: self.subset.take(),
            session: self.session.take(),
            slo: self.slo,
            prediction_based: self.prediction_based,
            streaming,
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
    fn go(
        &self,
        input: RouteInput,
        request: Option<&InferenceRequest<'_>>,
        flow_controlled: bool,
        tokens: u64,
        dispatched_ms: u64,
    ) -> Action {
        let vm_id = vm::id();
        match route::route(vm_id, self.id, &self.rt, &input, request, tokens) {
            Ok(sent) => {
                let running = Running {
                    dispatched_ms,
                    ..Running::from_input(sent, input, tokens, flow_controlled, self.received_us)
                };
                vm::with(|vm| vm.running.insert(self.id, running));
                Action::Continue
            }
            Err(e) => {
                if flow_controlled {
                    // Give the flow-control slot back.
                    let held = Running {
                        dispatched_ms,
                        ..Running::new(String::new(), &input, tokens, flow_controlled, 0)
                    };
                    flow::finished(&held, self.id);
                }
                self.reject(&e, &input.model)
            }
        }
    }

    /// `ladder-parse` builds: the next configured endpoint by turns, nothing counted.
    fn ladder_route(&self) -> Action {
        let n = self.rt.pool.endpoints.len().max(1);
        let i = usize::try_from(self.id).unwrap_or(0) % n;
        if let Some(e) = self.rt.pool.endpoints.get(i) {
            let _ = host::set_header(Map::RequestHeaders, crate::headers::PRIMARY, &e.address);
        }
        Action::Continue
    }

    /// Releases whatever the request held, once.
    fn release(&mut self) {
        if flow::cancelled(self.id, self.id) {
            return;
        }
        let Some(Some(done)) = vm::with(|vm| vm.running.remove(&self.id)) else {
            return;
        };
        let now_us = host::clock_us();
        let health = &self.rt.pool.passive_health;
        let outcome = Outcome::of_status(done.status).filter(|_| health.enabled());
        route::release(
            vm::id(),
            &done.endpoint,
            done.tokens,
            now_us,
            outcome.map(|o| (o, health)),
        );
        route::finished(&done, self.response_bytes, now_us);
        feedback::finished(self.id, vm::id());
        if self.rt.scheduler.latency.is_some() {
            latency::finished(self.id, &done.model, &done.target);
        }
        flow::finished(&done, self.id);
    }
}

/// Whether the current request arrived on local port `port`.
fn on_port(port: u16) -> bool {
    match host::property_at("destination\0port") {
        Ok(Some(bytes)) => <[u8; 8]>::try_from(bytes.as_slice())
            .map(i64::from_le_bytes)
            .is_ok_and(|p| p == i64::from(port)),
        _ => false,
    }
}

/// Answers a scrape of the filter's own metrics (`pool.metricsEndpoint`).
fn serve_metrics(idle_series_ms: i64) -> Action {
    let text = stats::exposition(vm::id(), host::clock_ms(), idle_series_ms);
    let headers = [("content-type", crate::metrics::exposition::CONTENT_TYPE)];
    match host::send_local_response(200, &headers, text.as_bytes()) {
        Ok(()) => Action::Pause,
        Err(status) => {
            log::warn!("cannot answer the metrics scrape: status {status}");
            Action::Continue
        }
    }
}

impl Context for Http {
    /// The end of the stream however it ended (Envoy calls it right after the access log).
    fn on_done(&mut self) -> bool {
        if cfg!(feature = "ladder-continue") {
            return true;
        }
        self.release();
        // Counter and gauge updates reach Envoy's stats summed (a request's running
        // gauges' +1 and -1 cancel out: no host call for them): now when this VM holds no
        // other request, so Envoy's stats are exact whenever it is idle; else with the
        // updates of the requests still in hand, at the next one that leaves the VM idle
        // or the next tick, whichever comes first.
        if vm::with(|vm| vm.running.is_empty() && vm.parked.is_empty()).unwrap_or(true) {
            stats::flush();
        }
        true
    }
}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if cfg!(feature = "ladder-continue") {
            return Action::Continue;
        }
        self.received_us = host::clock_us();
        // One host call for every header; then only the gateway-owned ones present are
        // removed (a call each).
        let bytes = host::header_pairs(Map::RequestHeaders).unwrap_or_else(|status| {
            log::warn!("cannot read the request headers: status {status}");
            Vec::new()
        });
        let headers = HeaderMap::decode(&bytes);
        let path = headers.get(":path").unwrap_or_default();
        if let Some(m) = &self.rt.pool.metrics_endpoint {
            if path.split('?').next() == Some(m.path.as_str()) && on_port(m.port) {
                return serve_metrics(m.idle_series_ms);
            }
        }
        self.api = Api::from_path(path);
        // The flow, from the source `pool.classification` trusts (a host call only for
        // a metadata / filter-state source).
        let classified = classify(&self.rt.pool.classification, &headers, &mut |path| {
            let path: Vec<&str> = path.iter().map(String::as_str).collect();
            host::property(&path)
                .ok()
                .flatten()
                .and_then(|b| String::from_utf8(b).ok())
        });
        if classified.refused_objective {
            log::debug!("an objective outside pool.classification.objective.allowed was refused");
        }
        self.fairness_id = classified.fairness_id;
        self.objective = classified.objective;
        let ttft = headers.first(&SLO_TTFT);
        self.slo_ttft_ms = slo_deadline::parse_header(ttft);
        self.slo = Slo {
            ttft_ms: Slo::parse(ttft),
            tpot_ms: Slo::parse(headers.first(&SLO_TPOT)),
        };
        self.prediction_based = slo_aware::parse_headers(
            headers.get(PREDICTION_BASED),
            headers.get(PREDICTION_BASED_OFF),
        );
        self.subset = headers.get(SUBSET).map(parse_subset);
        self.rewrite_header = headers.first(&MODEL_REWRITE).map(str::to_string);
        if let Some(s) = &self.rt.session {
            self.session = s
                .headers
                .iter()
                .find_map(|h| headers.get(h).filter(|v| !v.is_empty()))
                .map(str::to_string);
        }
        if !headers.is_empty() && headers.get(REQUEST_ID).is_none() {
            // Envoy generates one for edge requests; behind another proxy it may not.
            let id = Rng::new(u64::from(self.id) ^ vm::id().rotate_left(32) ^ self.received_us)
                .uuid_v4();
            if let Err(status) = host::set_header(Map::RequestHeaders, REQUEST_ID, &id) {
                log::warn!("cannot set {REQUEST_ID}: status {status}");
            }
        }
        let present: Vec<&str> = headers.gateway_owned().collect();
        let strip: &[&str] = if headers.is_empty() {
            // The read failed: strip blindly rather than pass a client's value on.
            &GATEWAY_OWNED
        } else {
            &present
        };
        for name in strip {
            if let Err(status) = host::remove_header(Map::RequestHeaders, name) {
                log::warn!("cannot strip {name}: status {status}");
            }
        }
        if end_of_stream {
            // No body (GET /v1/models and the like): any endpoint will do.
            let input = self.route_input(None, String::new(), 0);
            return self.go(input, None, false, 0, 0);
        }
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if cfg!(feature = "ladder-continue") {
            return Action::Continue;
        }
        let limit = self.rt.pool.max_request_body_bytes;
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
        let mut request = match parse_request(self.api, &body) {
            Ok(r) => r,
            Err(e) => return self.reject(&e, ""),
        };
        // A multipart body (audio) cannot be rewritten; a request naming no model is left
        // to the server's default unless the client asked for a rewrite.
        let rewritable = request.api != Api::Audio
            && (!request.model.is_empty() || self.rewrite_header.is_some());
        let target = if rewritable {
            self.target_model(&request.model)
        } else {
            request.model.clone()
        };
        // The body as sent: the one read (which the parsed request borrows), or its rewrite.
        let mut rewritten_body = None;
        if target != request.model {
            let Some(new_body) = model_rewrite::rewrite_body(&body, &target) else {
                let e = ApiError::internal("cannot rewrite the model of the request");
                return self.reject(&e, &request.model);
            };
            let ok = host::replace_request_body(body_size, &new_body).is_ok()
                && host::set_header(
                    Map::RequestHeaders,
                    "content-length",
                    &new_body.len().to_string(),
                )
                .is_ok();
            if !ok {
                let e = ApiError::internal("cannot rewrite the model of the request");
                return self.reject(&e, &request.model);
            }
            rewritten_body = Some(new_body);
            self.rewritten = Some(model_rewrite::Restorer::new(&target, &request.model));
        }
        if cfg!(feature = "ladder-parse") {
            return self.ladder_route();
        }
        let replaced = rewritten_body.is_some();
        let body: &[u8] = rewritten_body.as_deref().unwrap_or(&body);
        let input = self.route_input(Some(&mut request), target, body.len());
        let meta = RequestMeta {
            fairness_id: &input.fairness_id,
            priority: input.priority,
            model: &input.model,
            bytes: u64::try_from(body.len()).unwrap_or(u64::MAX),
            received_us: self.received_us,
            slo_ttft_ms: self.slo_ttft_ms,
            route: &input,
        };
        match flow::admit(self.id, &meta) {
            Admit::Go {
                dispatched_ms,
                flow_controlled,
                tokens,
            } => self.go(
                input,
                Some(&request),
                flow_controlled,
                tokens,
                dispatched_ms,
            ),
            Admit::Parked => {
                // Envoy holds the body in the 16 KiB read slice it arrived in; a copy of
                // the exact size makes a parked stream much cheaper to hold.
                if !replaced {
                    if let Err(status) = host::replace_request_body(body_size, body) {
                        log::debug!("cannot compact the parked body: status {status}");
                    }
                }
                Action::Pause
            }
            Admit::Reject(e) => self.reject(&e, &input.model),
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if cfg!(feature = "ladder-continue") {
            return Action::Continue;
        }
        if self.rt.scheduler.latency.is_some() {
            latency::response_headers(self.id);
        }
        // Passive health: the status (the server's, or Envoy's own reply for a refused
        // or reset connection or a timeout), reported when the request is released. One
        // host call, only when it is on.
        let status = if self.rt.pool.passive_health.enabled() {
            host::header(Map::ResponseHeaders, ":status")
                .ok()
                .flatten()
                .and_then(|s| s.parse::<u16>().ok())
        } else {
            None
        };
        let Some(Some(tokens)) = vm::with(|vm| {
            vm.running.get_mut(&self.id).map(|r| {
                r.status = status;
                r.tokens
            })
        }) else {
            return Action::Continue;
        };
        // The address Envoy actually connected to (after any retry); our pick otherwise.
        let reported = host::property_at("upstream\0address")
            .ok()
            .flatten()
            .and_then(|b| String::from_utf8(b).ok())
            .filter(|s| !s.is_empty());
        // The request now runs on the endpoint that answers (the pick it leaves, if another).
        let Some(Some((served, left))) = vm::with(|vm| {
            vm.running.get_mut(&self.id).map(|r| match reported {
                Some(s) if s != r.endpoint => {
                    let pick = std::mem::replace(&mut r.endpoint, s.clone());
                    (s, Some(pick))
                }
                Some(s) => (s, None),
                None => (r.endpoint.clone(), None),
            })
        }) else {
            return Action::Continue;
        };
        if let Some(endpoint) = left {
            // Envoy retried on a fallback (override_host with a retry policy): the pick
            // failed before answering, and the request now loads the one that answers.
            let health = &self.rt.pool.passive_health;
            let watch = Some(health).filter(|h| h.enabled());
            route::moved(
                vm::id(),
                (&endpoint, &served),
                tokens,
                host::clock_us(),
                watch,
            );
        }
        feedback::served(self.id, &served);
        if self.rewritten.is_some() {
            // The body changes length when the model name is put back.
            if let Err(status) = host::remove_header(Map::ResponseHeaders, "content-length") {
                log::warn!("cannot remove content-length: status {status}");
            }
        }
        if let Err(status) = host::set_header(Map::ResponseHeaders, SERVED, &served) {
            log::warn!("cannot set {SERVED}: status {status}");
        }
        if let Some(s) = self
            .rt
            .session
            .as_ref()
            .filter(|s| s.strategy == Strategy::EncodedEndpoint)
        {
            let token = session_affinity::token(&served);
            let header = s.headers.first().map_or(SESSION_TOKEN, String::as_str);
            if let Err(status) = host::set_header(Map::ResponseHeaders, header, &token) {
                log::warn!("cannot set {header}: status {status}");
            }
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if cfg!(feature = "ladder-continue") {
            return Action::Continue;
        }
        if self.rt.scheduler.latency.is_some() {
            latency::response_chunk(self.id, body_size, end_of_stream);
        }
        feedback::response_chunk(self.id, body_size);
        // Envoy passes each chunk as it comes (nothing is buffered): the sizes add up.
        self.response_bytes = self
            .response_bytes
            .saturating_add(u64::try_from(body_size).unwrap_or(u64::MAX));
        let Some(restorer) = &mut self.rewritten else {
            return Action::Continue;
        };
        if body_size == 0 && !end_of_stream {
            return Action::Continue;
        }
        let Ok(chunk) = host::response_body(body_size) else {
            return Action::Continue;
        };
        if let Some(new) = restorer.chunk(&chunk, end_of_stream) {
            if let Err(status) = host::set_response_body(body_size, &new) {
                log::warn!("cannot restore the model name in the response: status {status}");
            }
        }
        Action::Continue
    }
}
