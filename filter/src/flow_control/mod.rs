//! Flow control: hold requests in the gateway while the pool is saturated and release
//! them by strict priority (tier 1), fairness between tenants (tier 2) and a per-flow
//! ordering (tier 3), with capacity limits (429) and a queue TTL (503) — globally, across
//! every Envoy worker.
//!
//! | module | holds |
//! |---|---|
//! | `config` | the `flowControl` section: limits, TTL, bands, policy references |
//! | `fairness/` | `global-strict-fairness-policy`, `round-robin-fairness-policy` |
//! | `ordering/` | `fcfs-ordering-policy`, `edf-ordering-policy`, `slo-deadline-ordering-policy` |
//! | `saturation/` | `utilization-detector`, `concurrency-detector` |
//! | `state` | the global state shared by all workers (one CAS record) and its operations |
//! | `parked` | the requests one VM holds paused |
//! | `legacy` | admission with the gate off (429 for sheddable requests while saturated) |
//! | `usage_limit` | `static-usage-limit-policy`, `soft-reflective-ceiling-policy`: when a band may dispatch |
//! | `probabilistic` | `probabilistic-admitter`: sheddable requests shed with a probability rising with saturation |
//! | `outcome` | outcomes, their HTTP statuses, bodies and metric labels |

pub mod config;
pub mod fairness;
pub mod legacy;
pub mod ordering;
pub mod outcome;
pub mod parked;
pub mod probabilistic;
pub mod saturation;
pub mod state;
pub mod ttl;
pub mod usage_limit;
