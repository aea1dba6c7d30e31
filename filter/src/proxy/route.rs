//! Sending the current stream to an endpoint: pick, write the destination header,
//! count it in flight. Used on the fast path (in the request's own callback) and when
//! flow control releases a parked request (from another context, with the stream made
//! current by `set_effective_context`).

use super::{host, host::Map, stats, store::HostStore};
use crate::config::Config;
use crate::errors::ApiError;
use crate::inflight;
use crate::metrics;

/// Request header carrying the chosen endpoint to the ORIGINAL_DST cluster.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";

/// Picks the endpoint with the fewest requests in flight across all workers for the
/// current stream, writes [`DESTINATION`], and returns the endpoint.
pub fn route(vm: u64, ctx: u32, config: &Config, model: &str) -> Result<String, ApiError> {
    let candidates: Vec<&str> = config
        .pool
        .endpoints
        .iter()
        .map(|e| e.address.as_str())
        .collect();
    let now = host::now_ms().unwrap_or(0);
    let seed = u64::from(ctx) ^ vm.rotate_left(32);
    let failed = |why: &str| {
        stats::add(&metrics::SCHEDULER_ATTEMPTS, &["failure", model], 1);
        Err(ApiError::unavailable(why))
    };
    let endpoint = match inflight::acquire(&HostStore, vm, &candidates, now, seed) {
        Ok(Some(e)) => e,
        Ok(None) => return failed("no model server endpoint is available"),
        Err(e) => {
            log::error!("in-flight ledger unavailable: {e:?}");
            return failed("the gateway's endpoint state is unavailable");
        }
    };
    if let Err(status) = host::set_header(Map::RequestHeaders, DESTINATION, &endpoint) {
        log::error!("cannot set {DESTINATION}: status {status}");
        release(vm, &endpoint);
        return failed("the gateway could not route the request");
    }
    stats::add(&metrics::SCHEDULER_ATTEMPTS, &["success", model], 1);
    stats::add(&metrics::OBJECTIVE_REQUEST_TOTAL, &[model, model], 1);
    stats::add(&metrics::OBJECTIVE_RUNNING_REQUESTS, &[model], 1);
    Ok(endpoint)
}

/// Counts a request on `endpoint` as finished.
pub fn release(vm: u64, endpoint: &str) {
    let now = host::now_ms().unwrap_or(0);
    if let Err(e) = inflight::release(&HostStore, vm, endpoint, now) {
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
