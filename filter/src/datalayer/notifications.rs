//! `endpoint-notification-source` (llm-d-router): a data source that feeds its extractors
//! the pool's endpoint changes (added, removed) instead of scraping. Its extractor there is
//! `precise-prefix-cache-producer`, which learns which servers exist from it and opens a
//! KV-event subscription to each.
//!
//! Here the subscriptions are kv-relay's (`--server`, one per model server), and the filter
//! learns the servers the relay follows from each answer it polls, so the source has
//! nothing to do: it is accepted (no parameters), scrapes nothing, and its extractors are
//! checked like any other. The pool's endpoints still come from the configuration or
//! discovery (`pool`), and the metrics from `metrics-data-source`, which is added when no
//! source of that type is declared (llm-d-router's `dataLayer.injectDefaults`).

/// The type name.
pub const TYPE: &str = "endpoint-notification-source";
