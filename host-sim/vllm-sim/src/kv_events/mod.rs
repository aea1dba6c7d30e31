//! KV-cache events as vLLM publishes them with
//! `--kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq",...}'`.
//!
//! * [`config`] — the flag's JSON (vLLM's `KVEventsConfig` fields).
//! * [`wire`] — one engine step's events as a msgpack `KVEventBatch`.
//! * [`publisher`] — the ZMQ PUB socket (`[topic, seq, payload]`) and the replay
//!   ROUTER socket.
//!
//! In virtual time the same events come with every [`crate::engine::Step`]
//! (`Step::kv_events`), so a simulated world reads them without a socket.

pub mod config;
pub mod publisher;
pub mod wire;

pub use config::KvEventsConfig;
pub use publisher::{Publisher, PublisherAddrs};
