//! `precise-prefix-cache-scorer`'s state on callbacks: each VM's root tick asks `kv-relay`
//! (`relayCluster`) for what changed since the version this VM holds, every
//! `pollIntervalMs`, one call at a time; the answer is applied to this VM's copy
//! (`crate::prefix::precise`). Every VM polls for itself: the answers are deltas, so each
//! VM's update is small and no VM waits for another. A relay that does not answer only
//! ages the state until every server falls back to the approximate index.

use super::{host, vm};
use crate::runtime::Runtime;
use std::cell::RefCell;

#[derive(Default)]
struct Poll {
    /// The call in flight: token and when it was sent.
    pending: Option<(u32, i64)>,
    last_ms: i64,
    /// Failures in a row (logged at the first, then every 100th).
    failures: u64,
}

thread_local! {
    static POLL: RefCell<Poll> = RefCell::new(Poll::default());
}

fn failed(p: &mut Poll, why: &str) {
    if p.failures.is_multiple_of(100) {
        log::warn!("kv-relay: {why} ({} failures in a row)", p.failures + 1);
    }
    p.failures += 1;
}

/// One root tick at `now` (ms, the filter's clock).
pub fn tick(rt: &Runtime, now: i64) {
    let Some(cfg) = &rt.scheduler.precise else {
        return;
    };
    POLL.with(|p| {
        let Ok(mut p) = p.try_borrow_mut() else {
            return;
        };
        let timeout = i64::try_from(cfg.timeout_ms).unwrap_or(i64::MAX);
        if let Some((_, sent)) = p.pending {
            if now.saturating_sub(sent) <= timeout.saturating_add(1_000) {
                return;
            }
            p.pending = None;
        }
        // The tick period is the poll interval (or shorter): a quarter of slack keeps a tick
        // that fires a little early from skipping a whole period.
        let interval = i64::try_from(cfg.poll_interval_ms).unwrap_or(i64::MAX);
        if now.saturating_sub(p.last_ms) < interval - interval / 4 {
            return;
        }
        p.last_ms = now;
        let query = vm::with(|vm| vm.prefix.precise.query()).unwrap_or_default();
        let path = format!("{}{}", cfg.relay_path, query);
        let headers = [
            (":method", "GET"),
            (":path", path.as_str()),
            (":authority", cfg.relay_authority.as_str()),
        ];
        match host::http_call(&cfg.relay_cluster, &headers, cfg.timeout_ms) {
            Ok(token) => p.pending = Some((token, now)),
            Err(status) => failed(
                &mut p,
                &format!(
                    "cannot call cluster `{}`: status {status}",
                    cfg.relay_cluster
                ),
            ),
        }
    });
}

/// A callout answer; ignored unless it is this module's.
pub fn on_response(rt: &Runtime, token: u32, body_size: usize) {
    let Some(cfg) = &rt.scheduler.precise else {
        return;
    };
    POLL.with(|p| {
        let Ok(mut p) = p.try_borrow_mut() else {
            return;
        };
        if p.pending.map(|(t, _)| t) != Some(token) {
            return;
        }
        p.pending = None;
        let status = host::header(host::Map::HttpCallResponseHeaders, ":status")
            .ok()
            .flatten()
            .unwrap_or_default();
        if status != "200" {
            failed(&mut p, &format!("answered `{status}`"));
            return;
        }
        let body = match host::http_call_body(body_size) {
            Ok(b) => b,
            Err(status) => {
                failed(&mut p, &format!("cannot read the answer: status {status}"));
                return;
            }
        };
        let now = host::clock_ms();
        match vm::with(|vm| vm.prefix.precise.apply(&body, now, cfg)) {
            Some(Ok(())) => p.failures = 0,
            Some(Err(e)) => failed(&mut p, &e),
            None => {}
        }
    });
}
