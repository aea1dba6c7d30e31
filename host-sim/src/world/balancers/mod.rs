//! Load balancers that stand in for the filter, so the same world can be run behind what
//! a user would deploy instead: Envoy's own `ROUND_ROBIN` and `LEAST_REQUEST` cluster
//! policies, and a model of sglang-router's `cache_aware` policy.
//!
//! Install one with [`Sim::set_balancer`](crate::Sim::set_balancer): requests then skip
//! the Wasm filter and the router sends each to the endpoint the balancer names.

mod cache_aware;
mod envoy;

pub use cache_aware::CacheAware;
pub use envoy::{LeastRequest, RoundRobin};

use super::clock::Nanos;

/// An endpoint the balancer may choose.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// `ip:port`.
    pub addr: String,
    /// Requests the proxy has sent there that have not finished (Envoy's `rq_active`,
    /// sglang-router's per-worker load).
    pub in_flight: u64,
}

/// One routing decision to make.
#[derive(Debug)]
pub struct Pick<'a> {
    /// Virtual time.
    pub now: Nanos,
    /// The Envoy worker handling the request (per-worker balancers keep state per worker);
    /// with several gateway replicas, numbered across them (`replica × workers + worker`).
    /// A balancer's other state (`cache_aware`'s tree) is one for all replicas.
    pub worker: usize,
    /// `:path`.
    pub path: &'a str,
    /// The request body.
    pub body: &'a [u8],
    /// The endpoints that are up, in the order they were added.
    pub candidates: &'a [Candidate],
}

/// Chooses an upstream for each request.
pub trait Balancer {
    /// Short name for reports.
    fn name(&self) -> &str;
    /// The chosen endpoint's address, or `None` (the router answers 503).
    fn pick(&mut self, req: &Pick<'_>) -> Option<String>;
}
