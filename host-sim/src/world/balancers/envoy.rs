//! Envoy's cluster load-balancing policies, as Envoy 1.40 runs them for a cluster of
//! equally weighted hosts.

use super::{Balancer, Pick};
use crate::world::clock::Rng;

/// `lb_policy: ROUND_ROBIN`: every worker has its own load balancer and its own cursor,
/// starting at a random host.
pub struct RoundRobin {
    cursors: Vec<Option<u64>>,
    rng: Rng,
}

impl RoundRobin {
    /// Seeded (the workers' start positions).
    pub fn new(seed: u64) -> RoundRobin {
        RoundRobin {
            cursors: Vec::new(),
            rng: Rng::new(seed, 0x0072_6f75_6e64),
        }
    }
}

impl Balancer for RoundRobin {
    fn name(&self) -> &str {
        "Envoy ROUND_ROBIN"
    }

    fn pick(&mut self, req: &Pick<'_>) -> Option<String> {
        let n = req.candidates.len() as u64;
        if n == 0 {
            return None;
        }
        if self.cursors.len() <= req.worker {
            self.cursors.resize(req.worker + 1, None);
        }
        let rng = &mut self.rng;
        let cursor = self.cursors[req.worker].get_or_insert_with(|| rng.below(n));
        let i = *cursor % n;
        *cursor = cursor.wrapping_add(1);
        Some(req.candidates[i as usize].addr.clone())
    }
}

/// `lb_policy: LEAST_REQUEST` with its defaults: `choice_count` 2 (power of two
/// choices), two hosts drawn at random, the one with fewer active requests wins (the
/// active counts are per host, shared by all workers).
pub struct LeastRequest {
    rng: Rng,
}

impl LeastRequest {
    /// Seeded (the random draws).
    pub fn new(seed: u64) -> LeastRequest {
        LeastRequest {
            rng: Rng::new(seed, 0x006c_6561_7374),
        }
    }
}

impl Balancer for LeastRequest {
    fn name(&self) -> &str {
        "Envoy LEAST_REQUEST"
    }

    fn pick(&mut self, req: &Pick<'_>) -> Option<String> {
        let n = req.candidates.len() as u64;
        if n == 0 {
            return None;
        }
        let a = &req.candidates[self.rng.below(n) as usize];
        let b = &req.candidates[self.rng.below(n) as usize];
        let best = if b.in_flight < a.in_flight { b } else { a };
        Some(best.addr.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::balancers::Candidate;

    fn candidates(loads: &[u64]) -> Vec<Candidate> {
        loads
            .iter()
            .enumerate()
            .map(|(i, &l)| Candidate {
                addr: format!("10.0.0.{}:8000", i + 1),
                in_flight: l,
            })
            .collect()
    }

    fn pick(b: &mut dyn Balancer, worker: usize, c: &[Candidate]) -> String {
        b.pick(&Pick {
            now: 0,
            worker,
            path: "/v1/completions",
            body: b"{}",
            candidates: c,
        })
        .unwrap()
    }

    #[test]
    fn round_robin_cycles_through_every_host_on_each_worker() {
        let c = candidates(&[0, 0, 0]);
        let mut rr = RoundRobin::new(3);
        for worker in 0..2 {
            let got: Vec<String> = (0..6).map(|_| pick(&mut rr, worker, &c)).collect();
            assert_eq!(got[..3], got[3..], "period 3 on worker {worker}: {got:?}");
            let mut first: Vec<&String> = got[..3].iter().collect();
            first.sort();
            first.dedup();
            assert_eq!(first.len(), 3, "each host once per cycle: {got:?}");
        }
    }

    #[test]
    fn least_request_never_picks_the_busiest_of_two() {
        let c = candidates(&[5, 0]);
        let mut lr = LeastRequest::new(1);
        let busy = (0..200)
            .filter(|_| pick(&mut lr, 0, &c) == c[0].addr)
            .count();
        // Only when both draws land on the busy host: about a quarter of the time.
        assert!((25..=75).contains(&busy), "busy host chosen {busy}/200");
    }

    #[test]
    fn no_candidates_means_no_pick() {
        assert!(RoundRobin::new(1)
            .pick(&Pick {
                now: 0,
                worker: 0,
                path: "/",
                body: b"",
                candidates: &[]
            })
            .is_none());
    }
}
