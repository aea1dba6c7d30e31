//! A batch processor for the endpoint picker: it pulls batch requests from a queue
//! (Redis, wire-compatible with llm-d-async's `redis-sortedset` transport, or an OpenAI
//! Batch JSONL file) and lets them into the gateway only as fast as the pool has spare
//! capacity, by the dispatch budget of [`budget`] behind the [`gate::Gate`] trait.
//! See README.md.

pub mod budget;
pub mod cli;
pub mod gate;
pub mod gateway;
pub mod message;
pub mod metrics;
pub mod queue;
pub mod run;
