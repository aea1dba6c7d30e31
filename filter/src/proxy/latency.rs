//! The latency predictor's host side (only with a latency producer configured): what a
//! pick reads (the published model, the tightest TPOT SLO running per endpoint), what a
//! dispatch records (the request's features and predictions; its entry in the shared
//! running list when it has a TPOT SLO), what the response path observes (status, body
//! chunk times, `usage`), what the end of the stream records (a training sample, the
//! latency and SLO-violation metrics), and the tick (push this VM's samples; the lease
//! holder trains and publishes, and sets the predictor's health gauges). The policy is
//! the core's (`crate::latency`).

use super::{host, host::Map, stats, store::HostStore, vm};
use crate::inflight;
use crate::latency::observe::{completion_tokens, Tracked};
use crate::latency::running::Entry;
use crate::latency::shared::{self, MAX_LOCAL};
use crate::latency::{Estimate, Slo, Target, View};
use crate::metrics;
use crate::runtime::Runtime;

/// The latest chunk read for `usage` is at most this large (bigger last chunks are
/// whole non-streamed bodies: their TPOT is not used).
const MAX_USAGE_CHUNK: usize = 64 * 1024;

fn ttl_ms(rt: &Runtime) -> i64 {
    rt.scheduler.latency.as_ref().map_or(300_000, |s| {
        i64::try_from(s.context_ttl_ms).unwrap_or(i64::MAX)
    })
}

/// What a pick knows of the predictor (`None` without a latency producer).
pub fn view(rt: &Runtime) -> Option<View> {
    rt.scheduler.latency.as_ref()?;
    let (model, min_tpot_slo) =
        vm::with(|vm| (vm.model.refresh(&HostStore), vm.slo_running.tightest()))?;
    Some(View {
        model,
        min_tpot_slo,
    })
}

/// The request `ctx` went to `endpoint` with `estimate` (its features and prediction
/// there): remember it for the response path, and list it on the endpoint when it has a
/// TPOT SLO.
pub fn dispatched(
    ctx: u32,
    endpoint: &str,
    estimate: Option<Estimate>,
    slo: Slo,
    streaming: bool,
    now_us: u64,
) {
    let Some(estimate) = estimate else { return };
    let mut t = Tracked::new(endpoint.to_string(), estimate.x, slo, streaming, now_us);
    if let Some(p) = estimate.prediction {
        t.predicted_ttft_ms = Some(p.ttft_ms);
        t.predicted_tpot_ms = p.tpot_ms;
    }
    if let Some(tpot) = slo.tpot_ms {
        let now_ms = i64::try_from(now_us / 1_000).unwrap_or(0);
        let entry = Entry {
            ctx,
            endpoint: endpoint.to_string(),
            tpot_slo_ms: tpot,
            ttft_slo_ms: slo.ttft_ms.unwrap_or(0.0),
            predicted_ttft_ms: t.predicted_ttft_ms.unwrap_or(0.0),
            predicted_tpot_ms: t.predicted_tpot_ms.unwrap_or(0.0),
            started_ms: now_ms,
        };
        vm::with(|vm| vm.slo_running.add(entry));
        t.listed = true;
    }
    vm::with(|vm| vm.tracked.insert(ctx, t));
}

/// Response headers of `ctx`: a non-2xx status teaches nothing.
pub fn response_headers(ctx: u32) {
    let tracked = vm::with(|vm| vm.tracked.contains_key(&ctx)).unwrap_or(false);
    if !tracked {
        return;
    }
    let ok = host::header(Map::ResponseHeaders, ":status")
        .ok()
        .flatten()
        .is_some_and(|s| s.starts_with('2'));
    vm::with(|vm| {
        if let Some(t) = vm.tracked.get_mut(&ctx) {
            t.ok = ok;
        }
    });
}

/// The request left prefill on `endpoint` (first chunk, or ended without one): the
/// in-flight ledger stops counting its prefill there.
fn left_prefill(endpoint: &str, x: &[f64; crate::latency::features::N]) {
    let tokens = crate::latency::features::uncached_tokens(x);
    if let Err(e) = inflight::first_chunk(&HostStore, vm::id(), endpoint, tokens) {
        log::debug!("in-flight prefill count of {endpoint} not updated: {e:?}");
    }
}

/// A response body chunk of `size` bytes for `ctx`; the last one is read for `usage`.
pub fn response_chunk(ctx: u32, size: usize, end_of_stream: bool) {
    let now = host::clock_us();
    let seen = vm::with(|vm| {
        vm.tracked.get_mut(&ctx).map(|t| {
            let first = t.first_us.is_none() && size > 0;
            t.chunk(now, size);
            (t.streaming, first.then(|| (t.endpoint.clone(), t.x)))
        })
    })
    .flatten();
    let Some((streaming, first)) = seen else {
        return;
    };
    if let Some((endpoint, x)) = first {
        left_prefill(&endpoint, &x);
    }
    if end_of_stream && streaming && size > 0 && size <= MAX_USAGE_CHUNK {
        if let Some(n) = host::response_body(size)
            .ok()
            .and_then(|b| completion_tokens(&b))
        {
            vm::with(|vm| {
                if let Some(t) = vm.tracked.get_mut(&ctx) {
                    t.completion_tokens = Some(n);
                }
            });
        }
    }
}

/// The stream of `ctx` ended: record its sample and metrics, unlist it.
pub fn finished(ctx: u32, model: &str, target: &str) {
    let Some(Some(t)) = vm::with(|vm| vm.tracked.remove(&ctx)) else {
        return;
    };
    if t.first_us.is_none() {
        left_prefill(&t.endpoint, &t.x);
    }
    if t.listed {
        vm::with(|vm| vm.slo_running.remove(ctx));
    }
    let Some(truth) = t.truth() else { return };
    let labels = [model, target];
    let us = |ms: f64| (ms * 1_000.0).round().max(0.0) as u64;
    for (label, predicted, observed) in [
        ("ttft", t.predicted_ttft_ms, Some(truth.ttft_ms)),
        ("tpot", t.predicted_tpot_ms, truth.tpot_ms),
    ] {
        if let (Some(p), Some(o)) = (predicted, observed.filter(|o| *o > 0.0)) {
            let permille = ((p - o).abs() / o * 1_000.0).round().min(1e9) as i64;
            stats::add(&metrics::PREDICTOR_ABS_ERROR, &[label], permille);
            stats::add(&metrics::PREDICTOR_SCORED, &[label], 1);
        }
    }
    stats::observe(&metrics::OBJECTIVE_TTFT, &labels, us(truth.ttft_ms));
    stats::set(&metrics::OBJECTIVE_TTFT_GAUGE, &labels, us(truth.ttft_ms));
    if let Some(p) = t.predicted_ttft_ms {
        stats::observe(&metrics::OBJECTIVE_PREDICTED_TTFT, &labels, us(p));
        stats::set(&metrics::OBJECTIVE_PREDICTED_TTFT_GAUGE, &labels, us(p));
    }
    if let Some(tpot) = truth.tpot_ms {
        stats::observe(&metrics::OBJECTIVE_TPOT, &labels, us(tpot));
        stats::set(&metrics::OBJECTIVE_TPOT_GAUGE, &labels, us(tpot));
        if let Some(p) = t.predicted_tpot_ms {
            stats::observe(&metrics::OBJECTIVE_PREDICTED_TPOT, &labels, us(p));
            stats::set(&metrics::OBJECTIVE_PREDICTED_TPOT_GAUGE, &labels, us(p));
        }
        if t.slo.tpot_ms.is_some_and(|slo| tpot > slo) {
            stats::add(&metrics::OBJECTIVE_TPOT_SLO_VIOLATION, &labels, 1);
            stats::add(
                &metrics::OBJECTIVE_SLO_VIOLATION,
                &[model, target, "tpot"],
                1,
            );
        }
    }
    if t.slo.ttft_ms.is_some_and(|slo| truth.ttft_ms > slo) {
        stats::add(&metrics::OBJECTIVE_TTFT_SLO_VIOLATION, &labels, 1);
        stats::add(
            &metrics::OBJECTIVE_SLO_VIOLATION,
            &[model, target, "ttft"],
            1,
        );
    }
    let sample = t.sample(truth);
    vm::with(|vm| {
        if vm.samples.len() >= MAX_LOCAL {
            vm.samples.remove(0);
        }
        vm.samples.push(sample);
    });
}

/// This VM's tick: push its samples, keep its running-list row alive; the lease holder
/// trains and publishes.
pub fn tick(rt: &Runtime, vm_id: u64, now_ms: i64) {
    let Some(settings) = &rt.scheduler.latency else {
        return;
    };
    let samples = vm::with(|vm| std::mem::take(&mut vm.samples)).unwrap_or_default();
    if let Err(e) = shared::push(&HostStore, &samples) {
        log::warn!("cannot push {} latency samples: {e:?}", samples.len());
    }
    let published = vm::with(|vm| {
        vm.slo_running
            .publish(&HostStore, vm_id, now_ms, ttl_ms(rt))
    });
    if let Some(Err(e)) = published {
        log::debug!("running SLO list not published: {e:?}");
    }
    if !super::scrape::holds_lease() {
        return;
    }
    let started = host::clock_ns();
    match shared::train_tick(&HostStore, now_ms, settings.tau()) {
        Ok(Some(trained)) => {
            let us = host::clock_ns().saturating_sub(started) / 1_000;
            stats::observe(&metrics::PREDICTOR_TRAIN_DURATION, &[], us);
            let m = &trained.model;
            for (t, label) in [(Target::Ttft, "ttft"), (Target::Tpot, "tpot")] {
                stats::set(&metrics::PREDICTOR_SAMPLES, &[label], m.samples(t));
                let permille = (m.error(t) * 1_000.0).round().max(0.0) as u64;
                stats::set(&metrics::PREDICTOR_ERROR, &[label], permille);
            }
            stats::set(
                &metrics::PREDICTOR_TRAINED,
                &[],
                u64::try_from(m.trained_ms).unwrap_or(0),
            );
        }
        Ok(None) => {}
        Err(e) => log::warn!("latency predictor training failed: {e:?}"),
    }
}
