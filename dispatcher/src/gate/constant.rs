//! `constant`: a fixed dispatch budget `D ∈ [0, 1]` (no metrics), applied to the
//! processor's worker count: `floor(D × workers)` requests in flight, at least 1 while
//! `D > 0`. `constant:0` pauses dispatch; `constant:1` lets every worker run.

use super::{Allowance, BoxFuture, Decision, Gate, Load};

pub struct Constant {
    pub budget: f64,
    pub workers: u64,
}

impl Constant {
    pub fn ceiling(&self) -> u64 {
        if self.budget.is_nan() || self.budget <= 0.0 {
            return 0;
        }
        ((self.budget.min(1.0) * self.workers as f64).floor() as u64).max(1)
    }
}

impl Gate for Constant {
    fn decide(&mut self, _load: Load) -> BoxFuture<'_, Decision> {
        let a = Allowance {
            requests: Some(self.ceiling()),
            bytes: None,
        };
        Box::pin(async move { Decision::of(a) })
    }

    fn describe(&self) -> String {
        format!("constant(D={} of {} workers)", self.budget, self.workers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fraction_of_the_workers_at_least_one_while_open() {
        let c = |budget| {
            Constant {
                budget,
                workers: 64,
            }
            .ceiling()
        };
        assert_eq!(c(0.5), 32);
        assert_eq!(c(0.001), 1);
        assert_eq!(c(0.0), 0);
        assert_eq!(c(2.0), 64);
    }
}
