//! One request's path through the filter.
//!
//! Headers: strip the headers only the gateway may set, pause for the body.
//! Body: buffer to the end, enforce the size limit (413), parse (400), apply the model
//! rewrite, then schedule: candidates (static + discovered endpoints, minus failing ones,
//! within the subset hint) with their snapshots and in-flight counts → the configured
//! profiles → `x-gateway-destination-endpoint` (primary, then fallbacks) and, for P/D,
//! `x-prefiller-host-port`. The pick and its in-flight count are one CAS on the ledger;
//! the prefix index learns the pick here and, through the shared log, on every worker.
//! No endpoint → 503 JSON (or, with `pool.failOpen`, any healthy endpoint).
//! Response: name the endpoint that served (and the session token). End of stream,
//! however it ends: release the in-flight count.

use super::state::{self, Runtime};
use super::{host, host::Map, stats, store::HostStore};
use crate::datalayer::parse_subset;
use crate::errors::ApiError;
use crate::inflight;
use crate::metrics;
use crate::openai::{parse_request, Api, InferenceRequest};
use crate::prefix::shared;
use crate::rng::Rng;
use crate::scheduler::scorers::session_affinity::{self, SESSION_HEADER};
use crate::scheduler::{Probe, Request};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::rc::Rc;

/// Request header carrying the chosen endpoints (primary, then fallbacks, comma-separated),
/// as the reference protocol defines it. An `override_host` cluster takes its first member.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// Request header carrying the primary endpoint alone: what our ORIGINAL_DST cluster
/// routes on (ORIGINAL_DST reads a single `ip:port`, so a fallback list in
/// [`DESTINATION`] would make it fail).
pub const PRIMARY: &str = "x-gateway-destination-endpoint-primary";
/// Response header naming the endpoint that served.
pub const SERVED: &str = "x-gateway-destination-endpoint-served";
/// Request header restricting the candidates (set by the route or an earlier filter).
pub const SUBSET: &str = "x-gateway-destination-endpoint-subset";
/// Request header naming the prefill endpoint (P/D).
pub const PREFILLER: &str = "x-prefiller-host-port";
/// Model rewrite request headers (GIE name, router name).
const REWRITE_HEADERS: [&str; 2] = ["x-gateway-model-name-rewrite", "x-llm-d-model-name-rewrite"];
/// Headers a client must not set: the gateway owns them.
const SYSTEM_OWNED: [&str; 4] = [DESTINATION, PRIMARY, SERVED, PREFILLER];

/// What scheduling produced, with the candidates' addresses resolved.
enum Picked {
    Chosen {
        targets: Vec<String>,
        prefill: Option<String>,
        disaggregated: bool,
        hit: Option<crate::prefix::index::PrefixMatch>,
    },
    None {
        why: String,
        pool: Vec<String>,
    },
}

/// A request scheduled to an endpoint and not yet finished.
struct InFlight {
    endpoint: String,
    model: String,
    tokens: u64,
}

/// A model rewrite to undo in the response: `"model":"<sent>"` becomes the client's name.
struct Rewritten {
    sent: String,
    client: String,
}

pub struct Http {
    id: u32,
    vm: u64,
    rt: Rc<Runtime>,
    path: String,
    in_flight: Option<InFlight>,
    rewritten: Option<Rewritten>,
}

fn now_ns() -> u64 {
    host::now_ns().unwrap_or(0)
}

impl Http {
    pub fn new(id: u32, rt: Rc<Runtime>, vm: u64) -> Self {
        Self {
            id,
            vm,
            rt,
            path: String::new(),
            in_flight: None,
            rewritten: None,
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

    fn fail_schedule(&mut self, model: &str, why: &str) -> Action {
        stats::add(&metrics::SCHEDULER_ATTEMPTS, &["failure", model], 1);
        self.reject(&ApiError::unavailable(why), model)
    }

    /// Chooses the endpoint(s), writes the destination headers, counts the request.
    fn schedule(
        &mut self,
        request: Option<&InferenceRequest>,
        model: &str,
        target: &str,
        body_bytes: usize,
    ) -> Action {
        let rt = self.rt.clone();
        let start_ns = now_ns();
        let now = i64::try_from(start_ns / 1_000_000).unwrap_or(0);
        let subset = host::header(Map::RequestHeaders, SUBSET)
            .ok()
            .flatten()
            .map(|v| parse_subset(&v));
        let session = if rt.sessions {
            host::header(Map::RequestHeaders, SESSION_HEADER)
                .ok()
                .flatten()
        } else {
            None
        };
        let sreq = Request {
            model: target,
            prompt: request.map_or("", |r| r.prompt.as_str()),
            cache_salt: request.and_then(|r| r.cache_salt.as_deref()),
            body_bytes,
            session_token: session.as_deref(),
            now_ms: now,
        };
        let tokens = sreq.token_estimate();
        let seed =
            u64::from(self.id) ^ self.vm.rotate_left(32) ^ now.unsigned_abs().rotate_left(17);
        let vm = self.vm;
        let clock: &dyn Fn() -> u64 = &now_ns;
        let scheduler = &rt.scheduler;
        // Everything that needs the candidates happens inside: the list is this VM's cache.
        let outcome = state::with_candidates(&rt, subset.as_deref(), |cands| {
            state::with_prefix(vm, |index, cursor| {
                let result = inflight::acquire_with(&HostStore, vm, now, |ledger| {
                    let totals = ledger.totals();
                    for c in cands.iter_mut() {
                        let (n, t) = totals.get(c.address.as_str()).copied().unwrap_or_default();
                        c.in_flight = n;
                        c.in_flight_tokens = t;
                    }
                    let mut rng = Rng::new(seed);
                    let mut probe = Probe::new(Some(clock));
                    let decision = scheduler.schedule(&sreq, cands, index, &mut rng, &mut probe);
                    let pick = decision
                        .as_ref()
                        .ok()
                        .and_then(|d| d.primary())
                        .and_then(|i| cands.get(i))
                        .map(|c| (c.address.clone(), tokens));
                    (pick, (decision, probe.samples))
                });
                // The decision is made (and counted): the e2e scheduling time ends here, as the
                // reference's; what follows is its PreRequest bookkeeping.
                let e2e_us = now_ns().saturating_sub(start_ns) / 1_000;
                let (decision, samples) = match result {
                    Ok(r) => r,
                    Err(e) => return Err(e),
                };
                let picked = match decision {
                    Ok(d) => {
                        // The prefix index learns the pick: here at once, elsewhere via the log.
                        for i in [d.primary(), d.prefill].into_iter().flatten() {
                            if let Some(c) = cands.get(i) {
                                let cap = scheduler.lru_capacity(c);
                                let cap_usize = usize::try_from(cap).unwrap_or(usize::MAX);
                                index.insert(&c.address, &d.hashes, cap_usize);
                                if !d.hashes.is_empty() {
                                    match shared::publish(
                                        &HostStore, vm, &c.address, &d.hashes, cap,
                                    ) {
                                        Ok(seq) => cursor.published(seq),
                                        Err(e) => log::debug!("prefix log publish failed: {e:?}"),
                                    }
                                }
                            }
                        }
                        scheduler.pre_request(&sreq, cands, &d);
                        let addr = |i: usize| cands.get(i).map(|c| c.address.clone());
                        Picked::Chosen {
                            targets: d.targets.iter().filter_map(|&i| addr(i)).collect(),
                            prefill: d.prefill.and_then(addr),
                            disaggregated: d.disaggregated,
                            hit: d.primary().and_then(|i| d.prefix.get(i).copied()),
                        }
                    }
                    Err(e) => Picked::None {
                        why: e.to_string(),
                        pool: cands.iter().map(|c| c.address.clone()).collect(),
                    },
                };
                Ok((picked, samples, e2e_us))
            })
        });
        let (picked, samples, e2e_us) = match outcome {
            Ok(r) => r,
            Err(e) => {
                log::error!("in-flight ledger unavailable: {e:?}");
                return self.fail_schedule(model, "the gateway's endpoint state is unavailable");
            }
        };
        for s in &samples {
            stats::observe(
                &metrics::PLUGIN_DURATION,
                &[s.extension_point, &s.plugin_type, &s.plugin_name],
                s.ns / 1_000,
            );
        }
        let (targets, prefill, disaggregated, hit) = match picked {
            Picked::Chosen {
                targets,
                prefill,
                disaggregated,
                hit,
            } => (targets, prefill, disaggregated, hit),
            Picked::None { why, pool } => {
                if rt.config.pool.fail_open {
                    if let Some(action) = self.fail_open(pool, model, tokens, now) {
                        return action;
                    }
                }
                return self.fail_schedule(model, &why);
            }
        };
        let Some(primary) = targets.first().cloned() else {
            return self.fail_schedule(model, "no model server endpoint is available");
        };
        let routed = host::set_header(Map::RequestHeaders, DESTINATION, &targets.join(","))
            .and_then(|()| host::set_header(Map::RequestHeaders, PRIMARY, &primary));
        if let Err(status) = routed {
            log::error!("cannot set {DESTINATION}: status {status}");
            if let Err(e) = inflight::release_with_tokens(&HostStore, vm, &primary, tokens, now) {
                log::warn!("in-flight release failed: {e:?}");
            }
            return self.fail_schedule(model, "the gateway could not route the request");
        }
        if let Some(p) = prefill {
            if let Err(status) = host::set_header(Map::RequestHeaders, PREFILLER, &p) {
                log::warn!("cannot set {PREFILLER}: status {status}");
            }
        } else if disaggregated {
            log::warn!("P/D: prefill was decided but no prefill endpoint is available; decode runs alone on {primary}");
        }
        if let Some(m) = hit {
            stats::observe(
                &metrics::PREFIX_INDEXER_HIT_RATIO,
                &[],
                (m.ratio() * 100.0).round() as u64,
            );
            let bytes = u64::from(m.matched)
                * u64::from(m.block_size_tokens)
                * crate::prefix::CHARS_PER_TOKEN;
            stats::observe(&metrics::PREFIX_INDEXER_HIT_BYTES, &[], bytes);
        }
        stats::observe(&metrics::SCHEDULER_E2E_DURATION, &[], e2e_us);
        self.admitted(primary, model, tokens);
        Action::Continue
    }

    /// `pool.failOpen`: any healthy endpoint when the scheduler chose none (`pool`: the
    /// request's candidates; when empty, every healthy endpoint whatever the subset hint).
    fn fail_open(
        &mut self,
        pool: Vec<String>,
        model: &str,
        tokens: u64,
        now: i64,
    ) -> Option<Action> {
        let pool: Vec<String> = if pool.is_empty() {
            state::with_candidates(&self.rt, None, |c| {
                c.iter().map(|c| c.address.clone()).collect()
            })
        } else {
            pool
        };
        let mut rng = Rng::new(u64::from(self.id) ^ now.unsigned_abs());
        let pick = pool.get(rng.below(pool.len()))?.clone();
        let counted = inflight::acquire_with(&HostStore, self.vm, now, |_| {
            (Some((pick.clone(), tokens)), ())
        });
        if counted.is_err() {
            return None;
        }
        let routed = host::set_header(Map::RequestHeaders, DESTINATION, &pick)
            .and_then(|()| host::set_header(Map::RequestHeaders, PRIMARY, &pick));
        if routed.is_err() {
            let _ = inflight::release_with_tokens(&HostStore, self.vm, &pick, tokens, now);
            return None;
        }
        log::debug!("fail-open: no endpoint was chosen, sending to {pick}");
        self.admitted(pick, model, tokens);
        Some(Action::Continue)
    }

    fn admitted(&mut self, endpoint: String, model: &str, tokens: u64) {
        stats::add(&metrics::SCHEDULER_ATTEMPTS, &["success", model], 1);
        stats::add(&metrics::OBJECTIVE_REQUEST_TOTAL, &[model, model], 1);
        stats::add(&metrics::OBJECTIVE_RUNNING_REQUESTS, &[model], 1);
        self.in_flight = Some(InFlight {
            endpoint,
            model: model.to_string(),
            tokens,
        });
    }

    /// Releases the in-flight count, once.
    fn release(&mut self) {
        if let Some(done) = self.in_flight.take() {
            let now = host::now_ms().unwrap_or(0);
            if let Err(e) =
                inflight::release_with_tokens(&HostStore, self.vm, &done.endpoint, done.tokens, now)
            {
                log::warn!("in-flight release of {} failed: {e:?}", done.endpoint);
            }
            stats::add(&metrics::OBJECTIVE_RUNNING_REQUESTS, &[&done.model], -1);
        }
    }

    /// The model to send: the rewrite header, then a matching `pool.modelRewrites` rule.
    fn target_model(&self, model: &str) -> String {
        let header = REWRITE_HEADERS
            .iter()
            .find_map(|h| host::header(Map::RequestHeaders, h).ok().flatten())
            .filter(|v| !v.is_empty());
        let mut target = header.unwrap_or_else(|| model.to_string());
        let draw = Rng::new(u64::from(self.id) ^ self.vm).next_f64();
        if let Some((_, t)) = self.rt.config.pool.rewrite(&target, draw) {
            target = t.to_string();
        }
        target
    }
}

/// `chunk` with `"model":"<sent>"` (with or without a space) turned back into the client's
/// model name, as the reference's `rewriteModelName`; `None` when nothing matched.
fn restore_model(chunk: &[u8], sent: &str, client: &str) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(chunk).ok()?;
    let mut out = text.to_string();
    for sep in [":", ": "] {
        let from = format!("\"model\"{sep}\"{sent}\"");
        let to = format!("\"model\"{sep}\"{client}\"");
        out = out.replace(&from, &to);
    }
    (out != text).then(|| out.into_bytes())
}

/// `body` with its `model` field set to `target`.
fn rewrite_body(body: &[u8], target: &str) -> Option<Vec<u8>> {
    let mut doc: serde_json::Value = serde_json::from_slice(body).ok()?;
    doc.as_object_mut()?.insert(
        "model".into(),
        serde_json::Value::String(target.to_string()),
    );
    serde_json::to_vec(&doc).ok()
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
            return self.schedule(None, "", "", 0);
        }
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let limit = self.rt.config.pool.max_request_body_bytes;
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
        let target = self.target_model(&request.model);
        let mut size = body.len();
        if target != request.model {
            match rewrite_body(&body, &target) {
                Some(new_body) => {
                    let ok = host::set_request_body(body_size, &new_body).is_ok()
                        && host::set_header(
                            Map::RequestHeaders,
                            "content-length",
                            &new_body.len().to_string(),
                        )
                        .is_ok();
                    if !ok {
                        return self.reject(
                            &ApiError::internal("cannot rewrite the model of the request"),
                            &request.model,
                        );
                    }
                    size = new_body.len();
                    self.rewritten = Some(Rewritten {
                        sent: target.clone(),
                        client: request.model.clone(),
                    });
                }
                None => {
                    return self.reject(
                        &ApiError::internal("cannot rewrite the model of the request"),
                        &request.model,
                    )
                }
            }
        }
        self.schedule(Some(&request), &request.model.clone(), &target, size)
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
        if self.rewritten.is_some() {
            // The body changes length when the model name is put back.
            if let Err(status) = host::remove_header(Map::ResponseHeaders, "content-length") {
                log::warn!("cannot remove content-length: status {status}");
            }
        }
        if let Err(status) = host::set_header(Map::ResponseHeaders, SERVED, &served) {
            log::warn!("cannot set {SERVED}: status {status}");
        }
        if self.rt.sessions {
            let token = session_affinity::token(&served);
            if let Err(status) = host::set_header(Map::ResponseHeaders, SESSION_HEADER, &token) {
                log::warn!("cannot set {SESSION_HEADER}: status {status}");
            }
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, _end_of_stream: bool) -> Action {
        let Some(rw) = &self.rewritten else {
            return Action::Continue;
        };
        if body_size == 0 {
            return Action::Continue;
        }
        let Ok(chunk) = host::response_body(body_size) else {
            return Action::Continue;
        };
        if let Some(new) = restore_model(&chunk, &rw.sent, &rw.client) {
            if let Err(status) = host::set_response_body(body_size, &new) {
                log::warn!("cannot restore the model name in the response: status {status}");
            }
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        self.release();
    }
}
