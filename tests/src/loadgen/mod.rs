//! `loadgen`, the load generator of `scripts/bench`: async (tokio, hyper 1 over
//! HTTP/1.1 keep-alive with TCP_NODELAY), open-loop seeded Poisson arrivals or a
//! closed loop of N in flight, shared-prefix prompt groups, tenants and priorities,
//! streaming with TTFT and inter-token timing per request, bounded by count and
//! duration. See `loadgen --help` and BENCHMARKS.md.
//!
//! * [`workload`]: prompts, request sequence and arrival times (deterministic per seed);
//! * [`client`]: connections and per-request timing; [`sse`]: the stream scanner;
//! * [`run`]: the open and closed loops; [`metrics`]: model-server counters;
//! * [`stats`]: percentiles; [`report`]: records and the JSON summary;
//! * [`args`]: the command line.

pub mod args;
pub mod client;
pub mod metrics;
pub mod report;
pub mod run;
pub mod sse;
pub mod stats;
pub mod workload;
