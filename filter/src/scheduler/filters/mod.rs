//! Filters: narrow the candidates.
//!
//! * [`label_selector`] — `label-selector-filter`: Kubernetes `matchLabels` / `matchExpressions`.
//! * [`roles`] — `prefill-endpoints-filter` / `decode-endpoints-filter` (router
//!   `prefill-filter` / `decode-filter`), on label `llm-d.ai/role`.
//! * [`prefix_affinity`] — `prefix-cache-affinity-filter`: keep sticky endpoints, with a
//!   TTFT load gate and exploration.
//! * [`rendezvous_home`] — `rendezvous-home-filter`: keep a prompt's few highest-weight
//!   rendezvous endpoints, so replicas cache a prefix group on the same few servers.
//! * [`saturation`] — the saturation detectors in their filter role.
//! * [`session_affinity`] — `session-affinity-filter`: only the session's endpoint, if it is a candidate.
//! * [`topology_affinity`] — `topology-affinity-filter`: P/D prefill candidates near the decode pick.
//! * [`slo_tier`] — `slo-headroom-tier-filter`: keep the endpoints predicted to meet the
//!   request's objectives.

pub mod label_selector;
pub mod prefix_affinity;
pub mod rendezvous_home;
pub mod roles;
pub mod saturation;
pub mod session_affinity;
pub mod slo_tier;
pub mod topology_affinity;
