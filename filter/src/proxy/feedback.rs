//! Cached-token feedback's host side (`crate::prefix::feedback` holds the policy): a routed
//! request whose response ends with `usage` is watched; the end of each of its response
//! chunks (at most `TAIL` bytes, one host call) is read for `prompt_tokens` and
//! `cached_tokens`; when the stream ends, the report is judged against what the index
//! predicted, counted in the metrics, and the correction applied to this VM's index and
//! published to the others through the prefix log.

use super::{host, stats, store::HostStore, vm};
use crate::metrics;
use crate::prefix::feedback::{self, Correction, Expectation, Watch, TAIL};
use crate::prefix::shared;

/// Request `ctx` went out with `expected`; `usage_expected`: its response ends with `usage`.
pub fn dispatched(ctx: u32, expected: Option<Box<Expectation>>, usage_expected: bool) {
    let Some(expected) = expected.filter(|_| usage_expected) else {
        return;
    };
    vm::with(|vm| vm.watched.insert(ctx, Watch::new(*expected)));
}

/// The response of `ctx` came from `served`: a retry on another endpoint than the one
/// predicted for reports nothing about that one.
pub fn served(ctx: u32, served: &str) {
    vm::with(|vm| {
        if vm
            .watched
            .get(&ctx)
            .is_some_and(|w| w.expected.endpoint != served)
        {
            vm.watched.remove(&ctx);
        }
    });
}

/// A response chunk of `size` bytes for `ctx`: its end is read when the request is watched.
pub fn response_chunk(ctx: u32, size: usize) {
    if size == 0 || !vm::with(|vm| vm.watched.contains_key(&ctx)).unwrap_or(false) {
        return;
    }
    let start = size.saturating_sub(TAIL);
    let Ok(tail) = host::response_body_range(start, size - start) else {
        return;
    };
    vm::with(|vm| {
        if let Some(w) = vm.watched.get_mut(&ctx) {
            w.chunk(&tail);
        }
    });
}

/// The stream of `ctx` ended: judge its report (an error response has none), count it,
/// correct the index.
pub fn finished(ctx: u32, vm_id: u64) {
    let Some(Some(w)) = vm::with(|vm| vm.watched.remove(&ctx)) else {
        return;
    };
    let e = &w.expected;
    let Some(prompt_tokens) = w.report.prompt_tokens else {
        return;
    };
    let mut learned = false;
    let shared = |endpoint: &str| feedback::is_reporter(&HostStore, endpoint).unwrap_or(false);
    let outcome = vm::with(|vm| {
        let cached = vm
            .reporters
            .resolve(&e.endpoint, w.report, shared, &mut learned)?;
        let verdict = feedback::judge(e, prompt_tokens, cached)?;
        let resized = feedback::apply(&mut vm.prefix, e, &verdict.correction);
        Some((verdict, resized))
    })
    .flatten();
    if learned {
        if let Err(err) = feedback::publish_reporter(&HostStore, &e.endpoint) {
            log::debug!(
                "cannot record {} as reporting cached tokens: {err:?}",
                e.endpoint
            );
        }
    }
    let Some((verdict, resized)) = outcome else {
        return;
    };
    let tokens = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    stats::add(
        &metrics::PREFIX_PREDICTED_HIT_TOKENS,
        &[],
        tokens(verdict.predicted_tokens),
    );
    stats::add(
        &metrics::PREFIX_REPORTED_HIT_TOKENS,
        &[],
        tokens(verdict.reported_tokens),
    );
    stats::add(
        &metrics::PREFIX_REPORTED_PROMPT_TOKENS,
        &[],
        tokens(prompt_tokens),
    );
    let outcome = match verdict.correction {
        Correction::None => "confirmed",
        Correction::Evicted { .. } => "evicted",
        Correction::Unsettled => "unsettled",
        Correction::Grow { .. } => "grown",
    };
    stats::add(&metrics::PREFIX_FEEDBACK, &[outcome], 1);
    if let Some(capacity) = resized {
        log::debug!("prefix index: {} now holds {capacity} blocks", e.endpoint);
        let capacity = u64::try_from(capacity).unwrap_or(u64::MAX);
        match shared::publish_capacity(&HostStore, vm_id, &e.endpoint, capacity) {
            Ok(seq) => {
                vm::with(|vm| vm.cursor.published(seq));
            }
            Err(e) => log::debug!("prefix log publish failed: {e:?}"),
        }
    }
}
