//! A small network latency model: a base one-way delay plus seeded uniform jitter, per hop.

use super::clock::{Nanos, Rng, US};

/// One hop's one-way latency.
#[derive(Debug, Clone, Copy)]
pub struct Latency {
    /// Minimum delay.
    pub base: Nanos,
    /// Up to this much more, uniformly.
    pub jitter: Nanos,
}

impl Latency {
    /// A delay drawn from `rng`.
    pub fn draw(&self, rng: &mut Rng) -> Nanos {
        self.base + rng.below(self.jitter + 1)
    }
}

/// Latencies of the simulated network.
#[derive(Debug, Clone, Copy)]
pub struct Network {
    /// Client to Envoy (and back).
    pub client: Latency,
    /// Envoy to a model server (and back).
    pub upstream: Latency,
    /// A shared-queue message to a worker VM (Envoy: 0.15-0.8 ms).
    pub queue_worker: Latency,
    /// A shared-queue message to the main-thread VM (Envoy: up to about 2 ms).
    pub queue_main: Latency,
}

impl Default for Network {
    fn default() -> Self {
        Network {
            client: Latency {
                base: 50 * US,
                jitter: 50 * US,
            },
            upstream: Latency {
                base: 100 * US,
                jitter: 100 * US,
            },
            queue_worker: Latency {
                base: 150 * US,
                jitter: 650 * US,
            },
            queue_main: Latency {
                base: 300 * US,
                jitter: 1_700 * US,
            },
        }
    }
}
