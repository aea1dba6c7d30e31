//! The simulated world around the host: virtual clock and randomness, the event queue,
//! clients and their workloads, the network, model servers (a simple one, and `vllm-sim`'s
//! engine in [`vllm`]), the KV-event relay those engines publish to ([`kv_relay`]),
//! per-request outcomes and
//! the invariants checked while it runs.

pub mod balancers;
pub mod client;
pub mod clock;
pub mod events;
pub mod invariants;
pub mod kv_relay;
pub mod network;
pub mod outcomes;
pub mod upstream;
pub mod vllm;
pub mod workload;
