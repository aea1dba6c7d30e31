//! Sending the current stream to an endpoint: the decision is the core's
//! (`crate::routing`: candidates → scheduler inside the ledger CAS → prefix learning);
//! this module gathers its inputs from the VM state, writes the destination headers and
//! the metrics, and answers when nothing can be chosen (503 JSON, or with
//! `pool.failOpen` any healthy endpoint). Used on the fast path (in the request's own
//! callback) and when flow control releases a parked request (from another context, with
//! the stream made current; its body is read and parsed again then).

use super::stats::Update;
use super::{feedback, host, host::Map, latency, stats, store::HostStore, vm};
use crate::config::PassiveHealth;
use crate::errors::ApiError;
use crate::headers::{DESTINATION, DROPPED_REASON, ENCODERS, PREFILLER, PRIMARY, RETRY_AFTER};
use crate::health::Outcome;
use crate::inflight;
use crate::latency::Slo;
use crate::metrics;
use crate::openai::{parse_request, Api, InferenceRequest};
use crate::prefix::shared;
use crate::routing::{self, Pick, Routed};
use crate::runtime::Runtime;
use crate::scheduler::Request;
use crate::shared_store::StoreError;

/// What routing needs to know about a request, kept while it is parked.
#[derive(Debug, Clone, Default)]
pub struct RouteInput {
    /// The client's model (metric labels).
    pub model: String,
    /// The model the request is sent as (after rewrite).
    pub target: String,
    /// Its flow's fairness id (metric label).
    pub fairness_id: String,
    /// Its priority (metric label).
    pub priority: i32,
    /// The API (to parse the body again when woken); `None` for bodiless requests.
    pub api: Option<Api>,
    /// Body size.
    pub body_bytes: usize,
    /// The subset hint, if any.
    pub subset: Option<Vec<String>>,
    /// `x-session-token`, if read.
    pub session: Option<String>,
    /// The SLO headers.
    pub slo: Slo,
    /// `x-prediction-based-scheduling(-off)`.
    pub prediction_based: Option<bool>,
    /// `stream: true`.
    pub streaming: bool,
}

/// A request sent: the primary endpoint, and the series its end updates.
pub struct Dispatched {
    /// The primary endpoint.
    pub endpoint: String,
    /// The metric series of the request, resolved when it was admitted ([`finished`]).
    pub series: Option<RequestSeries>,
}

/// The running gauges a routed request's admission raised and its end lowers, resolved
/// with the other series of its admission (one lookup by its labels for all of them).
#[derive(Debug, Clone, Copy)]
pub struct RequestSeries {
    running: stats::Series,
    request_running: stats::Series,
}

fn failed(target: &str, why: &str) -> Result<Dispatched, ApiError> {
    refused(target, ApiError::unavailable(why))
}

fn refused(target: &str, error: ApiError) -> Result<Dispatched, ApiError> {
    stats::add(
        &metrics::SCHEDULER_ATTEMPTS,
        &["failure", target, "", "", ""],
        1,
    );
    Err(error)
}

/// Chooses the endpoint(s) for the current stream, writes the destination headers,
/// counts the request (`tokens`) in flight, and returns the primary endpoint.
/// `request` is the parsed body; `None` reads and parses it again (a woken stream).
pub fn route(
    vm_id: u64,
    ctx: u32,
    rt: &Runtime,
    input: &RouteInput,
    request: Option<&InferenceRequest<'_>>,
    tokens: u64,
) -> Result<Dispatched, ApiError> {
    let started_ns = host::clock_ns();
    let now = i64::try_from(started_ns / 1_000_000).unwrap_or(0);
    let (body, reparsed);
    let request = match (request, input.api) {
        (Some(r), _) => Some(r),
        (None, Some(api)) if input.body_bytes > 0 => {
            body = host::request_body(input.body_bytes).ok();
            reparsed = body.as_deref().and_then(|b| parse_request(api, b).ok());
            reparsed.as_ref()
        }
        _ => None,
    };
    let view = latency::view(rt);
    // With precise prefix matching, the prompt is taken as the servers tokenize it: a chat
    // rendered by their chat template (vllm-sim's, or the shape the relay learnt), a
    // completion after what their tokenizer adds (the relay's completion prefix).
    let server_text = match (&rt.scheduler.precise, request) {
        (Some(p), Some(r)) => vm::with(|vm| {
            let chat = (!r.chat.is_empty()).then(|| r.messages());
            p.server_text(&vm.prefix.precise, chat, &r.prompt)
        })
        .unwrap_or(Err(crate::prefix::precise::Unrendered)),
        _ => Ok(None),
    };
    let unrendered_chat = server_text.is_err();
    let rendered = server_text.unwrap_or(None);
    let pick = Pick {
        request: Request {
            model: &input.target,
            prompt: rendered
                .as_deref()
                .or(request.map(|r| r.prompt.as_ref()))
                .unwrap_or(""),
            cache_salt: request.and_then(|r| r.cache_salt.as_deref()),
            body_bytes: input.body_bytes,
            session_token: input.session.as_deref(),
            now_ms: now,
            slo: input.slo,
            priority: input.priority,
            prediction_based: input.prediction_based,
            latency: view.as_ref(),
            unrendered_chat,
            peer: None,
            // One more read of the body, only with a multimodal encode decider.
            multimodal: rt.scheduler.reads_multimodal()
                && input.body_bytes > 0
                && host::request_body(input.body_bytes)
                    .is_ok_and(|b| crate::openai::multimodal::has_parts(&b)),
        },
        tokens,
        vm: vm_id,
        seed: routing::seed(ctx, vm_id, now),
        started_ns,
        time_plugins: vm::with(|vm| {
            vm.decisions += 1;
            routing::times_plugins(vm.decisions - 1)
        })
        .unwrap_or(false),
    };
    let clock: &dyn Fn() -> u64 = &host::clock_ns;
    let discovery = rt.pool.discovery.is_some();
    let outcome = vm::with(|vm| {
        let vm = &mut *vm;
        vm.view.refresh(discovery);
        if let Err(e) = shared::sync(&HostStore, vm_id, &mut vm.prefix, &mut vm.cursor) {
            log::debug!("prefix log sync failed: {e:?}");
        }
        let (prefix, cursor) = (&mut vm.prefix, &mut vm.cursor);
        vm.view
            .with_candidates(&rt.pool.endpoints, input.subset.as_deref(), |cands| {
                routing::route(
                    &HostStore,
                    &rt.scheduler,
                    &pick,
                    cands,
                    prefix,
                    cursor,
                    clock,
                )
            })
    });
    let outcome = match outcome {
        Some(Ok(o)) => o,
        Some(Err(e)) => {
            log::error!("in-flight ledger unavailable: {e:?}");
            return failed(&input.target, "the gateway's endpoint state is unavailable");
        }
        None => return failed(&input.target, "the gateway's endpoint state is unavailable"),
    };
    for s in &outcome.samples {
        stats::observe(
            &metrics::PLUGIN_DURATION,
            &[s.extension_point, &s.plugin_type, &s.plugin_name],
            s.ns / 1_000,
        );
        if s.extension_point == crate::scheduler::PREDICTION_POINT {
            let (labels, us) = ([input.model.as_str(), input.target.as_str()], s.ns / 1_000);
            for (histogram, gauge) in [
                (
                    &metrics::OBJECTIVE_TTFT_PREDICTION_DURATION,
                    &metrics::OBJECTIVE_TTFT_PREDICTION_DURATION_GAUGE,
                ),
                (
                    &metrics::OBJECTIVE_TPOT_PREDICTION_DURATION,
                    &metrics::OBJECTIVE_TPOT_PREDICTION_DURATION_GAUGE,
                ),
            ] {
                stats::observe(histogram, &labels, us);
                stats::set(gauge, &labels, us);
            }
        }
    }
    let (targets, prefill, disaggregated, encoders, hit, estimate, expected) = match outcome.routed
    {
        Routed::Chosen {
            targets,
            prefill,
            disaggregated,
            encoders,
            hit,
            estimate,
            expected,
        } => (
            targets,
            prefill,
            disaggregated,
            encoders,
            hit,
            estimate,
            expected,
        ),
        Routed::Shed { why } => {
            let error = ApiError {
                status: 429,
                kind: "rate_limit_error",
                message: why,
                param: None,
                dropped: None,
            };
            return refused(&input.target, error);
        }
        Routed::None { why, pool } => {
            let filtered_out = !pool.is_empty();
            if rt.pool.fail_open {
                if let Some(d) = fail_open(vm_id, ctx, rt, pool, input, tokens, now) {
                    return Ok(d);
                }
            }
            if filtered_out {
                return refused(&input.target, ApiError::no_target(why));
            }
            return failed(&input.target, &why);
        }
    };
    // One target (no fallbacks) is the header's whole value: nothing to join.
    let joined = (targets.len() > 1).then(|| targets.join(","));
    let mut targets = targets;
    if targets.is_empty() {
        return failed(&input.target, "no model server endpoint is available");
    }
    let primary = targets.swap_remove(0);
    let destination = joined.as_deref().unwrap_or(&primary);
    let routed = host::set_header(Map::RequestHeaders, DESTINATION, destination)
        .and_then(|()| host::set_header(Map::RequestHeaders, PRIMARY, &primary));
    if let Err(status) = routed {
        log::error!("cannot set {DESTINATION}: status {status}");
        release(vm_id, &primary, tokens, host::clock_us(), None);
        return failed(&input.target, "the gateway could not route the request");
    }
    if !encoders.is_empty() {
        let list = encoders.join(",");
        if let Err(status) = host::set_header(Map::RequestHeaders, ENCODERS, &list) {
            log::warn!("cannot set {ENCODERS}: status {status}");
        }
    }
    if let Some(p) = prefill {
        if let Err(status) = host::set_header(Map::RequestHeaders, PREFILLER, &p) {
            log::warn!("cannot set {PREFILLER}: status {status}");
        }
    } else if disaggregated {
        log::warn!(
            "P/D: prefill was decided but no prefill endpoint is available; decode runs alone on {primary}"
        );
    }
    let e2e = Update::Observe(outcome.e2e_us);
    match hit {
        Some(m) => {
            // The decision's three histograms in one lookup.
            let ratio = Update::Observe((m.ratio() * 100.0).round() as u64);
            let bytes = u64::from(m.matched)
                * u64::from(m.block_size_tokens)
                * crate::prefix::CHARS_PER_TOKEN;
            let group = stats::group("decision", &[], |resolve| {
                resolve(&metrics::PREFIX_INDEXER_HIT_RATIO, &[]);
                resolve(&metrics::PREFIX_INDEXER_HIT_BYTES, &[]);
                resolve(&metrics::SCHEDULER_E2E_DURATION, &[]);
            });
            if let Some([r, b, e]) = group {
                stats::apply(&[
                    (r, &metrics::PREFIX_INDEXER_HIT_RATIO, ratio),
                    (
                        b,
                        &metrics::PREFIX_INDEXER_HIT_BYTES,
                        Update::Observe(bytes),
                    ),
                    (e, &metrics::SCHEDULER_E2E_DURATION, e2e),
                ]);
            }
        }
        None => stats::observe(&metrics::SCHEDULER_E2E_DURATION, &[], outcome.e2e_us),
    }
    let series = admitted(input, &primary);
    feedback::dispatched(ctx, expected, request.is_some_and(|r| r.usage_expected));
    if rt.scheduler.latency.is_some() {
        latency::dispatched(
            ctx,
            &primary,
            estimate,
            input.slo,
            input.streaming,
            host::clock_us(),
        );
    }
    Ok(Dispatched {
        endpoint: primary,
        series,
    })
}

/// `pool.failOpen`: any healthy endpoint when the scheduler chose none (`pool`: the
/// request's candidates; when empty, every healthy endpoint whatever the subset hint).
fn fail_open(
    vm_id: u64,
    ctx: u32,
    rt: &Runtime,
    pool: Vec<String>,
    input: &RouteInput,
    tokens: u64,
    now: i64,
) -> Option<Dispatched> {
    let pool: Vec<String> = if pool.is_empty() {
        vm::with(|vm| {
            vm.view.with_candidates(&rt.pool.endpoints, None, |c| {
                c.iter().map(|c| c.address.clone()).collect()
            })
        })
        .unwrap_or_default()
    } else {
        pool
    };
    let seed = u64::from(ctx) ^ now.unsigned_abs();
    let pick = routing::fail_open(&HostStore, vm_id, &pool, seed, tokens, now)?;
    let routed = host::set_header(Map::RequestHeaders, DESTINATION, &pick)
        .and_then(|()| host::set_header(Map::RequestHeaders, PRIMARY, &pick));
    if routed.is_err() {
        release(vm_id, &pick, tokens, host::clock_us(), None);
        return None;
    }
    log::debug!("fail-open: no endpoint was chosen, sending to {pick}");
    let series = admitted(input, &pick);
    Some(Dispatched {
        endpoint: pick,
        series,
    })
}

/// Counts a request sent to `endpoint` (attempt, total, running, size); returns the series
/// its end updates. Every series a request updates is resolved in one group, keyed by its
/// label values.
fn admitted(input: &RouteInput, endpoint: &str) -> Option<RequestSeries> {
    let (model, target) = (input.model.as_str(), input.target.as_str());
    // The priority label formatted on the stack: no allocation per request.
    let mut priority = itoa::Buffer::new();
    let (fairness, priority) = (input.fairness_id.as_str(), priority.format(input.priority));
    let size = u64::try_from(input.body_bytes).unwrap_or(u64::MAX);
    let key = [model, target, fairness, priority, endpoint];
    let group = stats::group("request", &key, |resolve| {
        let (pod, namespace, port) = metrics::pod_labels(endpoint);
        resolve(
            &metrics::SCHEDULER_ATTEMPTS,
            &["success", target, pod, namespace, port],
        );
        resolve(&metrics::OBJECTIVE_REQUEST_TOTAL, &[model, target]);
        resolve(&metrics::OBJECTIVE_RUNNING_REQUESTS, &[model]);
        resolve(
            &metrics::REQUEST_RUNNING,
            &[model, target, fairness, priority],
        );
        resolve(&metrics::OBJECTIVE_REQUEST_SIZES, &[model, target]);
    });
    let Some([attempts, total, running, request_running, sizes]) = group else {
        // The metrics state is busy (logged): nothing can be counted.
        return None;
    };
    // Resolved just now: none is stale.
    stats::apply(&[
        (attempts, &metrics::SCHEDULER_ATTEMPTS, Update::Add(1)),
        (total, &metrics::OBJECTIVE_REQUEST_TOTAL, Update::Add(1)),
        (
            running,
            &metrics::OBJECTIVE_RUNNING_REQUESTS,
            Update::Add(1),
        ),
        (request_running, &metrics::REQUEST_RUNNING, Update::Add(1)),
        (
            sizes,
            &metrics::OBJECTIVE_REQUEST_SIZES,
            Update::Observe(size),
        ),
    ]);
    Some(RequestSeries {
        running,
        request_running,
    })
}

/// Records the end of a routed request: it no longer runs; its duration and response size.
/// Through the series resolved when it was admitted, or by its labels if those went stale.
pub fn finished(done: &super::vm::Running, response_bytes: u64, now_us: u64) {
    let duration = now_us.saturating_sub(done.received_us);
    let (model, target) = (done.model.as_str(), done.target.as_str());
    // Valid unless idle series were dropped since the admission (then by labels below).
    let lowered = done.series.is_some_and(|s| {
        stats::apply(&[
            (
                s.running,
                &metrics::OBJECTIVE_RUNNING_REQUESTS,
                Update::Add(-1),
            ),
            (
                s.request_running,
                &metrics::REQUEST_RUNNING,
                Update::Add(-1),
            ),
        ])
    });
    if lowered {
        // Both histograms in one lookup (resolved here, at the first request's end, as
        // before: a series appears in the exposition with its first observation).
        let pair: &[&str] = &[model, target];
        let group = stats::group("request-end", pair, |resolve| {
            resolve(&metrics::OBJECTIVE_REQUEST_DURATION, pair);
            resolve(&metrics::OBJECTIVE_RESPONSE_SIZES, pair);
        });
        if let Some([d, r]) = group {
            stats::apply(&[
                (
                    d,
                    &metrics::OBJECTIVE_REQUEST_DURATION,
                    Update::Observe(duration),
                ),
                (
                    r,
                    &metrics::OBJECTIVE_RESPONSE_SIZES,
                    Update::Observe(response_bytes),
                ),
            ]);
        }
        return;
    }
    stats::add(&metrics::OBJECTIVE_RUNNING_REQUESTS, &[model], -1);
    let mut priority = itoa::Buffer::new();
    stats::add(
        &metrics::REQUEST_RUNNING,
        &[
            model,
            target,
            &done.fairness_id,
            priority.format(done.priority),
        ],
        -1,
    );
    stats::observe(
        &metrics::OBJECTIVE_REQUEST_DURATION,
        &[model, target],
        duration,
    );
    stats::observe(
        &metrics::OBJECTIVE_RESPONSE_SIZES,
        &[model, target],
        response_bytes,
    );
}

/// Counts a request of `tokens` on `endpoint` as finished at `now_us`, with its outcome
/// for passive health (`None`: not watched, or no response); counts an ejection it caused.
pub fn release(
    vm: u64,
    endpoint: &str,
    tokens: u64,
    now_us: u64,
    outcome: Option<(Outcome, &PassiveHealth)>,
) {
    let now = i64::try_from(now_us / 1_000).unwrap_or(i64::MAX);
    let result = inflight::release(&HostStore, vm, endpoint, tokens, now, outcome);
    ejected(endpoint, result, "release");
}

/// Counts a request Envoy retried on `to` as no longer loading `from`, which failed it
/// (for passive health, when `health` watches).
pub fn moved(
    vm: u64,
    (from, to): (&str, &str),
    tokens: u64,
    now_us: u64,
    health: Option<&PassiveHealth>,
) {
    let now = i64::try_from(now_us / 1_000).unwrap_or(i64::MAX);
    let result = inflight::moved(&HostStore, vm, (from, to), tokens, now, health);
    ejected(from, result, "move");
}

/// Logs and counts an ejection of `endpoint` that a ledger update caused.
fn ejected(endpoint: &str, result: Result<Option<u64>, StoreError>, what: &str) {
    match result {
        Ok(Some(ms)) => {
            log::warn!("passive health: {endpoint} failed repeatedly; ejected for {ms} ms");
            let (pod, namespace, port) = metrics::pod_labels(endpoint);
            stats::add(
                &metrics::PASSIVE_HEALTH_EJECTIONS,
                &[pod, namespace, port],
                1,
            );
        }
        Ok(None) => {}
        Err(e) => log::warn!("in-flight {what} of {endpoint} failed: {e:?}"),
    }
}

/// Answers the current stream with an OpenAI-style error (with a flow-control drop's
/// reason and `Retry-After`). `false` if the host refused.
pub fn reply(error: &ApiError, model: &str, extra: &[(&str, &str)]) -> bool {
    stats::add(
        &metrics::OBJECTIVE_REQUEST_ERROR_TOTAL,
        &[model, model, metrics::error_code(error.status)],
        1,
    );
    let body = error.body();
    let retry_after = error.retry_after_s().map(|s| s.to_string());
    let mut headers = vec![("content-type", "application/json")];
    if let Some(reason) = error.dropped {
        headers.push((DROPPED_REASON, reason));
    }
    if let Some(s) = &retry_after {
        headers.push((RETRY_AFTER, s.as_str()));
    }
    headers.extend_from_slice(extra);
    match host::send_local_response(error.status, &headers, body.as_bytes()) {
        Ok(()) => true,
        Err(status) => {
            log::error!(
                "cannot send a local {} reply: status {status}",
                error.status
            );
            false
        }
    }
}
