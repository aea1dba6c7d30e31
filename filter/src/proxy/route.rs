//! Sending the current stream to an endpoint: schedule (profiles of filters, scorers and
//! a picker over the candidates), write the destination headers, count the request in
//! flight, teach the prefix index. Used on the fast path (in the request's own callback)
//! and when flow control releases a parked request (from another context, with the stream
//! made current by `set_effective_context`; its body is read and parsed again then).
//!
//! Candidates: static + discovered endpoints, minus failing ones, within the subset hint,
//! with their snapshots and the in-flight counts of every worker. The pick and its
//! in-flight count are one CAS on the ledger; the prefix index learns the pick here and,
//! through the shared log, on every worker. No endpoint → 503 JSON (or, with
//! `pool.failOpen`, any healthy endpoint).

use super::state::{self, Runtime};
use super::{host, host::Map, stats, store::HostStore};
use crate::errors::ApiError;
use crate::inflight;
use crate::metrics;
use crate::openai::{parse_request, Api, InferenceRequest};
use crate::prefix::index::PrefixMatch;
use crate::prefix::shared;
use crate::rng::Rng;
use crate::scheduler::{Probe, Request};

/// Request header carrying the chosen endpoints (primary, then fallbacks, comma-separated),
/// as the reference protocol defines it. An `override_host` cluster takes its first member.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// Request header carrying the primary endpoint alone: what our ORIGINAL_DST cluster
/// routes on (ORIGINAL_DST reads a single `ip:port`, so a fallback list in
/// [`DESTINATION`] would make it fail).
pub const PRIMARY: &str = "x-gateway-destination-endpoint-primary";
/// Request header restricting the candidates (read, then stripped before upstream).
pub const SUBSET: &str = "x-gateway-destination-endpoint-subset";
/// Request header naming the prefill endpoint (P/D).
pub const PREFILLER: &str = "x-prefiller-host-port";

/// What routing needs to know about a request, kept while it is parked.
#[derive(Debug, Clone, Default)]
pub struct RouteInput {
    /// The client's model (metric labels).
    pub model: String,
    /// The model the request is sent as (after rewrite).
    pub target: String,
    /// The API (to parse the body again when woken); `None` for bodiless requests.
    pub api: Option<Api>,
    /// Body size.
    pub body_bytes: usize,
    /// The subset hint, if any.
    pub subset: Option<Vec<String>>,
    /// `x-session-token`, if read.
    pub session: Option<String>,
}

fn now_ns() -> u64 {
    host::now_ns().unwrap_or(0)
}

/// What scheduling produced, with the candidates' addresses resolved.
enum Picked {
    Chosen {
        targets: Vec<String>,
        prefill: Option<String>,
        disaggregated: bool,
        hit: Option<PrefixMatch>,
    },
    None {
        why: String,
        pool: Vec<String>,
    },
}

fn failed(model: &str, why: &str) -> Result<String, ApiError> {
    stats::add(
        &metrics::SCHEDULER_ATTEMPTS,
        &["failure", model, "", "", ""],
        1,
    );
    Err(ApiError::unavailable(why))
}

/// Chooses the endpoint(s) for the current stream, writes the destination headers,
/// counts the request (`tokens`) in flight, and returns the primary endpoint.
/// `request` is the parsed body; `None` reads and parses it again (a woken stream).
pub fn route(
    vm: u64,
    ctx: u32,
    rt: &Runtime,
    input: &RouteInput,
    request: Option<&InferenceRequest>,
    tokens: u64,
) -> Result<String, ApiError> {
    let start_ns = now_ns();
    let now = i64::try_from(start_ns / 1_000_000).unwrap_or(0);
    let reparsed;
    let request = match (request, input.api) {
        (Some(r), _) => Some(r),
        (None, Some(api)) if input.body_bytes > 0 => {
            reparsed = host::request_body(input.body_bytes)
                .ok()
                .and_then(|b| parse_request(api, &b).ok());
            reparsed.as_ref()
        }
        _ => None,
    };
    let model = input.model.as_str();
    let sreq = Request {
        model: &input.target,
        prompt: request.map_or("", |r| r.prompt.as_str()),
        cache_salt: request.and_then(|r| r.cache_salt.as_deref()),
        body_bytes: input.body_bytes,
        session_token: input.session.as_deref(),
        now_ms: now,
    };
    let seed = u64::from(ctx) ^ vm.rotate_left(32) ^ now.unsigned_abs().rotate_left(17);
    let clock: &dyn Fn() -> u64 = &now_ns;
    let scheduler = &rt.scheduler;
    // Everything that needs the candidates happens inside: the list is this VM's cache.
    let outcome = state::with_candidates(rt, input.subset.as_deref(), |cands| {
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
            let (decision, samples) = result?;
            let picked = match decision {
                Ok(d) => {
                    // The prefix index learns the pick: here at once, elsewhere via the log.
                    for i in [d.primary(), d.prefill].into_iter().flatten() {
                        if let Some(c) = cands.get(i) {
                            let cap = scheduler.lru_capacity(c);
                            index.insert(
                                &c.address,
                                &d.hashes,
                                usize::try_from(cap).unwrap_or(usize::MAX),
                            );
                            if !d.hashes.is_empty() {
                                match shared::publish(&HostStore, vm, &c.address, &d.hashes, cap) {
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
            Ok::<_, crate::shared_store::StoreError>((picked, samples, e2e_us))
        })
    });
    let (picked, samples, e2e_us) = match outcome {
        Ok(r) => r,
        Err(e) => {
            log::error!("in-flight ledger unavailable: {e:?}");
            return failed(model, "the gateway's endpoint state is unavailable");
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
                if let Some(endpoint) = fail_open(vm, ctx, rt, pool, model, tokens, now) {
                    return Ok(endpoint);
                }
            }
            return failed(model, &why);
        }
    };
    let Some(primary) = targets.first().cloned() else {
        return failed(model, "no model server endpoint is available");
    };
    let routed = host::set_header(Map::RequestHeaders, DESTINATION, &targets.join(","))
        .and_then(|()| host::set_header(Map::RequestHeaders, PRIMARY, &primary));
    if let Err(status) = routed {
        log::error!("cannot set {DESTINATION}: status {status}");
        release(vm, &primary, tokens);
        return failed(model, "the gateway could not route the request");
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
    if let Some(m) = hit {
        stats::observe(
            &metrics::PREFIX_INDEXER_HIT_RATIO,
            &[],
            (m.ratio() * 100.0).round() as u64,
        );
        let bytes =
            u64::from(m.matched) * u64::from(m.block_size_tokens) * crate::prefix::CHARS_PER_TOKEN;
        stats::observe(&metrics::PREFIX_INDEXER_HIT_BYTES, &[], bytes);
    }
    stats::observe(&metrics::SCHEDULER_E2E_DURATION, &[], e2e_us);
    admitted(model, &primary);
    Ok(primary)
}

/// `pool.failOpen`: any healthy endpoint when the scheduler chose none (`pool`: the
/// request's candidates; when empty, every healthy endpoint whatever the subset hint).
fn fail_open(
    vm: u64,
    ctx: u32,
    rt: &Runtime,
    pool: Vec<String>,
    model: &str,
    tokens: u64,
    now: i64,
) -> Option<String> {
    let pool: Vec<String> = if pool.is_empty() {
        state::with_candidates(rt, None, |c| c.iter().map(|c| c.address.clone()).collect())
    } else {
        pool
    };
    let mut rng = Rng::new(u64::from(ctx) ^ now.unsigned_abs());
    let pick = pool.get(rng.below(pool.len()))?.clone();
    let counted =
        inflight::acquire_with(&HostStore, vm, now, |_| (Some((pick.clone(), tokens)), ()));
    if counted.is_err() {
        return None;
    }
    let routed = host::set_header(Map::RequestHeaders, DESTINATION, &pick)
        .and_then(|()| host::set_header(Map::RequestHeaders, PRIMARY, &pick));
    if routed.is_err() {
        release(vm, &pick, tokens);
        return None;
    }
    log::debug!("fail-open: no endpoint was chosen, sending to {pick}");
    admitted(model, &pick);
    Some(pick)
}

fn admitted(model: &str, endpoint: &str) {
    let (pod, namespace, port) = metrics::pod_labels(endpoint);
    stats::add(
        &metrics::SCHEDULER_ATTEMPTS,
        &["success", model, pod, namespace, port],
        1,
    );
    stats::add(&metrics::OBJECTIVE_REQUEST_TOTAL, &[model, model], 1);
    stats::add(&metrics::OBJECTIVE_RUNNING_REQUESTS, &[model], 1);
}

/// Counts a request of `tokens` on `endpoint` as finished.
pub fn release(vm: u64, endpoint: &str, tokens: u64) {
    let now = host::now_ms().unwrap_or(0);
    if let Err(e) = inflight::release_with_tokens(&HostStore, vm, endpoint, tokens, now) {
        log::warn!("in-flight release of {endpoint} failed: {e:?}");
    }
}

/// Answers the current stream with an OpenAI-style error. `false` if the host refused.
pub fn reply(error: &ApiError, model: &str, extra: &[(&str, &str)]) -> bool {
    stats::add(
        &metrics::OBJECTIVE_REQUEST_ERROR_TOTAL,
        &[model, model, metrics::error_code(error.status)],
        1,
    );
    let body = error.body();
    let mut headers = vec![("content-type", "application/json")];
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
