//! `vllm-sim`: a simulated vLLM model server.
//!
//! * [`engine`]: the engine (continuous batching, prefix-cached KV, latency
//!   model), clock-free so it runs in real or virtual time;
//! * [`sim`]: a small virtual-time driver for the engine;
//! * [`metrics`]: Prometheus text with vLLM's (or sglang's) names;
//! * [`server`]: the OpenAI-compatible HTTP server around the engine;
//! * [`cli`]: command-line flags.
//!
//! Driving the engine in virtual time:
//!
//! ```
//! use std::time::Duration;
//! use vllm_sim::engine::{Engine, EngineConfig, EngineRequest};
//! use vllm_sim::sim::{self, Arrival};
//! use vllm_sim::tokenizer;
//!
//! let mut engine = Engine::new(EngineConfig { seed: 1, max_num_seqs: 16, ..EngineConfig::default() });
//! let arrivals = vec![Arrival {
//!     at: Duration::from_millis(5),
//!     request: EngineRequest::fixed(tokenizer::encode("Hello, world"), 32),
//! }];
//! let traces = sim::run(&mut engine, &arrivals, Duration::from_secs(60));
//! let finished = traces[0].finished.expect("finished");
//! assert_eq!(finished.usage.completion_tokens, 32);
//! assert!(traces[0].ttft().unwrap() >= Duration::from_millis(9)); // 30 ms ± jitter
//! ```

pub mod api;
pub mod cli;
pub mod engine;
pub mod failures;
pub mod kv_events;
pub mod metrics;
pub mod model_tokenizer;
pub mod rng;
pub mod server;
pub mod settings;
pub mod sim;
pub mod time;
pub mod tokenizer;
