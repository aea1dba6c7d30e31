//! Dispatch gates: each decides how much batch work may be in flight, behind one trait.
//!
//! A gate answers with an [`Allowance`]: ceilings on the batch requests (and bytes) this
//! processor may have in flight until the next decision. The dispatcher asks every gate
//! once per metrics interval; the [`composite`] gate takes the minimum of its members.
//!
//! * [`saturation`]: the seed's dispatch budget from the pool's saturation and ready
//!   endpoints, read from Envoy's stats, the filter's metrics endpoint or Prometheus.
//! * [`constant`]: a fixed budget `D` applied to the processor's worker count.
//! * [`local_max`]: at most `M` requests in flight from this process.
//! * [`composite`]: the minimum of several gates.

pub mod composite;
pub mod constant;
pub mod local_max;
pub mod saturation;

use std::future::Future;
use std::pin::Pin;

/// A boxed future, so gates can be trait objects.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What this processor has in flight when a gate decides.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    /// Requests sent to the gateway and not yet answered.
    pub requests: u64,
    /// Their body bytes.
    pub bytes: u64,
}

/// Ceilings on what may be in flight; `None` means this gate sets no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allowance {
    pub requests: Option<u64>,
    pub bytes: Option<u64>,
}

impl Allowance {
    /// Nothing may be in flight beyond what already is (budget 0).
    pub fn closed() -> Allowance {
        Allowance {
            requests: Some(0),
            bytes: None,
        }
    }

    /// The tighter of two allowances, ceiling by ceiling.
    pub fn min(self, other: Allowance) -> Allowance {
        fn m(a: Option<u64>, b: Option<u64>) -> Option<u64> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, None) => a,
                (None, b) => b,
            }
        }
        Allowance {
            requests: m(self.requests, other.requests),
            bytes: m(self.bytes, other.bytes),
        }
    }

    /// Whether one more request of `size` bytes may start with `load` in flight. A request
    /// larger than the whole byte ceiling still goes when nothing is in flight (the
    /// seed's "at least one while D > B"), or it would never go.
    pub fn admits(&self, load: Load, size: u64) -> bool {
        if let Some(r) = self.requests {
            if load.requests >= r {
                return false;
            }
        }
        match self.bytes {
            Some(0) => false,
            Some(b) => load.requests == 0 || load.bytes.saturating_add(size) <= b,
            None => true,
        }
    }
}

/// A gate's answer, with what it read (for progress and the budget log).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    pub allowance: Allowance,
    /// The pool's saturation `S`, when the gate read one.
    pub saturation: Option<f64>,
    /// Ready endpoints, when the gate read them.
    pub ready: Option<u64>,
    /// Why the gate failed closed (unreadable metrics).
    pub error: Option<String>,
    /// Whether this decision rests on a metrics update (not a repeat of the last
    /// reading); a 429 closes the gate until one.
    pub update: bool,
}

impl Decision {
    pub fn of(allowance: Allowance) -> Decision {
        Decision {
            allowance,
            update: true,
            ..Decision::default()
        }
    }
}

/// A dispatch gate.
pub trait Gate: Send {
    /// The allowance until the next decision, given what is in flight now.
    fn decide(&mut self, load: Load) -> BoxFuture<'_, Decision>;
    /// A one-line description for logs (`saturation(envoy-stats …)`).
    fn describe(&self) -> String;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_takes_the_tighter_ceiling_of_each_kind() {
        let a = Allowance {
            requests: Some(10),
            bytes: None,
        };
        let b = Allowance {
            requests: Some(30),
            bytes: Some(1000),
        };
        assert_eq!(
            a.min(b),
            Allowance {
                requests: Some(10),
                bytes: Some(1000)
            }
        );
    }

    #[test]
    fn bytes_stop_at_the_first_request_that_does_not_fit() {
        let a = Allowance {
            requests: None,
            bytes: Some(629_145),
        };
        let one = Load {
            requests: 1,
            bytes: 600 * 1024,
        };
        assert!(a.admits(Load::default(), 600 * 1024));
        assert!(!a.admits(one, 100 * 1024));
        // Too large for the whole budget: only alone.
        assert!(a.admits(Load::default(), 2_000_000));
        assert!(!a.admits(one, 2_000_000));
    }

    #[test]
    fn a_closed_allowance_admits_nothing() {
        assert!(!Allowance::closed().admits(Load::default(), 1));
    }
}
