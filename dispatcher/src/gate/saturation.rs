//! `saturation`: the seed's dispatch budget. Each decision reads the pool's saturation
//! `S` and ready endpoints ([`crate::metrics`]) and lets `N` more requests in on top of
//! those this processor already has in flight:
//! `N = ready × max_concurrency × (D − B)`, `D = 1 − S`, floored, at least 1 while
//! `D > B` ([`crate::budget`]). `S` already counts the batch requests in flight (they
//! are in the pool), so `N` is what may be *added*; the next reading sees them. While
//! `D < B`, `N` is negative: the ceiling drops by `ceil(|N|)` below what is in flight,
//! so finished batch requests are not replaced until the pool is back under `1 − B`. The load
//! the dispatcher passes counts only the requests old enough to be in the reading
//! (`--metrics-lag`); younger ones use up `N`. In bytes,
//! the ceiling is `in-flight bytes + ready × max_bytes × (D − B)`, cut at a request
//! boundary. Unreadable metrics: budget 0.
//!
//! The filter sets its pool gauges once a second and Envoy's stats carry no timestamp,
//! so a reading identical to the previous one is taken as the same update (for up to
//! [`SAME_READING_FOR`]): the previous allowance stands, so `N` is not granted twice for
//! one update, and a 429 keeps the gate closed until a real update.

use super::{Allowance, BoxFuture, Decision, Gate, Load};
use crate::budget;
use crate::metrics::{self, Source};
use std::time::{Duration, Instant};

/// How long an unchanged reading is taken as the same metrics update.
pub const SAME_READING_FOR: Duration = Duration::from_secs(3);

/// The capacity unit of the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Requests; per-endpoint capacity `max_concurrency`.
    Requests,
    /// Body bytes; per-endpoint capacity in bytes.
    Bytes(u64),
}

pub struct Saturation {
    pub client: reqwest::Client,
    pub source: Source,
    pub pool: Option<String>,
    /// Factor from the source's saturation number to a fraction.
    pub scale: f64,
    /// Per-endpoint request capacity (the detector's `maxConcurrency`; reference default 100).
    pub max_concurrency: u64,
    /// `B`.
    pub baseline: f64,
    pub unit: Unit,
    pub timeout: Duration,
    /// The last reading, when it was first seen, and the allowance it gave.
    pub last: Option<(metrics::Reading, Instant, Allowance)>,
}

impl Saturation {
    /// The allowance for a reading, given what is in flight.
    pub fn allowance(&self, reading: metrics::Reading, load: Load) -> Allowance {
        let (s, ready) = (reading.saturation, reading.ready);
        match self.unit {
            Unit::Requests => {
                let n = budget::requests(ready, self.max_concurrency, s, self.baseline);
                let ceiling = if n > 0 {
                    load.requests + n
                } else {
                    // Over the baseline: what finishes is not replaced until the pool is
                    // back under it.
                    let excess = budget::excess(ready, self.max_concurrency, s, self.baseline);
                    load.requests.saturating_sub(excess)
                };
                Allowance {
                    requests: Some(ceiling),
                    bytes: None,
                }
            }
            Unit::Bytes(per_endpoint) => {
                if budget::headroom(s, self.baseline) <= 0.0 || ready == 0 {
                    return Allowance::closed();
                }
                Allowance {
                    requests: None,
                    bytes: Some(load.bytes + budget::bytes(ready, per_endpoint, s, self.baseline)),
                }
            }
        }
    }
}

impl Saturation {
    /// The allowance for a reading taken at `now`, and whether it is a metrics update: a
    /// repeat of the last reading (within [`SAME_READING_FOR`]) keeps the last allowance.
    pub fn on_reading(
        &mut self,
        reading: metrics::Reading,
        load: Load,
        now: Instant,
    ) -> (Allowance, bool) {
        if let Some((r, since, a)) = &self.last {
            if *r == reading && now.duration_since(*since) < SAME_READING_FOR {
                return (*a, false);
            }
        }
        let a = self.allowance(reading, load);
        self.last = Some((reading, now, a));
        (a, true)
    }
}

impl Gate for Saturation {
    fn decide(&mut self, load: Load) -> BoxFuture<'_, Decision> {
        Box::pin(async move {
            let r = metrics::read(
                &self.client,
                &self.source,
                self.pool.as_deref(),
                self.scale,
                self.max_concurrency,
                self.timeout,
            )
            .await;
            match r {
                Ok(reading) => {
                    let (allowance, update) = self.on_reading(reading, load, Instant::now());
                    Decision {
                        allowance,
                        saturation: Some(reading.saturation),
                        ready: Some(reading.ready),
                        error: None,
                        update,
                    }
                }
                Err(e) => {
                    self.last = None;
                    Decision {
                        allowance: Allowance::closed(),
                        error: Some(e),
                        update: true,
                        ..Decision::default()
                    }
                }
            }
        })
    }

    fn describe(&self) -> String {
        let unit = match self.unit {
            Unit::Requests => format!("max_concurrency {}", self.max_concurrency),
            Unit::Bytes(b) => format!("max_bytes {b}"),
        };
        format!(
            "saturation({:?}, {unit}, baseline {})",
            self.source, self.baseline
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(unit: Unit) -> Saturation {
        Saturation {
            client: reqwest::Client::new(),
            source: Source::EnvoyStats("http://127.0.0.1:1/".into()),
            pool: None,
            scale: 0.001,
            max_concurrency: 10,
            baseline: 0.1,
            unit,
            timeout: Duration::from_millis(200),
            last: None,
        }
    }

    fn reading(saturation: f64, ready: u64) -> metrics::Reading {
        metrics::Reading { saturation, ready }
    }

    #[test]
    fn the_seeds_example_lets_30_more_in_on_top_of_those_in_flight() {
        let g = gate(Unit::Requests);
        let idle = g.allowance(reading(0.3, 5), Load::default());
        assert_eq!(idle.requests, Some(30));
        let busy = g.allowance(
            reading(0.3, 5),
            Load {
                requests: 7,
                bytes: 0,
            },
        );
        assert_eq!(busy.requests, Some(37));
        // At the baseline: nothing more than what is in flight.
        let full = g.allowance(
            reading(0.9, 5),
            Load {
                requests: 7,
                bytes: 0,
            },
        );
        assert_eq!(full.requests, Some(7));
        // Over it (N = 50 × (0 − 0.1) = −5): five of those in flight are not replaced.
        let over = g.allowance(
            reading(1.0, 5),
            Load {
                requests: 7,
                bytes: 0,
            },
        );
        assert_eq!(over.requests, Some(2));
    }

    #[test]
    fn bytes_budget_is_the_seeds_614_kib() {
        let g = gate(Unit::Bytes(1024 * 1024));
        let a = g.allowance(reading(0.3, 1), Load::default());
        assert_eq!(a.bytes, Some(629_145));
        assert!(a.admits(Load::default(), 600 * 1024));
        assert!(!a.admits(
            Load {
                requests: 1,
                bytes: 600 * 1024
            },
            100 * 1024
        ));
        // Over the baseline: closed, even for a lone request.
        let closed = g.allowance(reading(0.95, 1), Load::default());
        assert!(!closed.admits(Load::default(), 1));
    }

    #[test]
    fn a_repeated_reading_is_not_a_new_update() {
        let mut g = gate(Unit::Requests);
        let t0 = Instant::now();
        let (a, update) = g.on_reading(reading(0.3, 5), Load::default(), t0);
        assert_eq!((a.requests, update), (Some(30), true));
        // Same numbers 0.5 s later with 30 in flight: the same update, N not granted again.
        let busy = Load {
            requests: 30,
            bytes: 0,
        };
        let (a, update) = g.on_reading(reading(0.3, 5), busy, t0 + Duration::from_millis(500));
        assert_eq!((a.requests, update), (Some(30), false));
        // A changed reading is an update.
        let (a, update) = g.on_reading(reading(0.5, 5), busy, t0 + Duration::from_millis(1000));
        assert_eq!((a.requests, update), (Some(30 + 20), true));
        // The same numbers long after: taken as a new update.
        let (_, update) = g.on_reading(reading(0.5, 5), busy, t0 + Duration::from_secs(10));
        assert!(update);
    }

    #[tokio::test]
    async fn unreadable_metrics_close_the_gate() {
        // Port 1 on loopback: connection refused.
        let mut g = gate(Unit::Requests);
        let d = g.decide(Load::default()).await;
        assert_eq!(d.allowance, Allowance::closed());
        assert!(d.error.is_some());
    }
}
