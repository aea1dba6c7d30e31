//! `rendezvous-home-filter`: keeps a prompt's *home*, the first `homeSize` endpoints (3 by
//! default) in its rendezvous order whose load is within a bound, so that however many
//! gateway replicas route a prefix group, and whatever each has learned, they send it to
//! the same few servers (consistent hashing with bounded loads).
//!
//! The order is by `xxh64(address, seed = key)`, highest first, with the prompt's
//! rendezvous key (the chained hash of its leading `rendezvousPriorBlocks` blocks:
//! `crate::prefix::rendezvous`): every replica computes the same order from the prompt and
//! the endpoints alone. An endpoint's load is its `running + waiting` by the last scrape
//! (or this gateway's own requests in flight there, when more); the bound is
//! `ceil(loadFactor × mean load over the endpoints in play) + 1` (1.5 by default). The
//! bound is relative, so when the whole pool queues a group stays home, and a loaded home
//! endpoint gives its place to the next in the order, which every replica reading the
//! same scrape agrees on. The scorers choose within the home. Without a key (no prefix
//! plugin, `rendezvousPrior: false`, or a prompt without blocks) every endpoint is kept;
//! if no endpoint is within the bound (only possible with a factor below 1), the first
//! `homeSize` in the order are.

use crate::config::validate::err;
use crate::config::{ConfigError, Params};
use crate::rng::Rng;
use crate::scheduler::{Cycle, Filter};
use serde_json::Value;
use xxhash_rust::xxh64::xxh64;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "rendezvous-home-filter";

/// Default `homeSize`.
pub const DEFAULT_HOME_SIZE: usize = 3;

/// Default `loadFactor`.
pub const DEFAULT_LOAD_FACTOR: f64 = 1.5;

/// An endpoint's load: its requests by the last scrape (running + waiting), or this
/// gateway's own in flight there when that is more (dispatches since the scrape).
fn load(c: &crate::endpoint::Candidate) -> u64 {
    c.metrics
        .running
        .saturating_add(c.metrics.waiting)
        .max(c.in_flight)
}

/// The rendezvous home filter.
#[derive(Debug, Clone, PartialEq)]
pub struct RendezvousHome {
    /// `homeSize`: endpoints kept per prompt.
    pub size: usize,
    /// `loadFactor`: an endpoint is home only while its load is at most this times the
    /// mean over the endpoints in play (rounded up, plus one); 0 = no bound.
    pub load_factor: f64,
}

impl Default for RendezvousHome {
    fn default() -> Self {
        Self {
            size: DEFAULT_HOME_SIZE,
            load_factor: DEFAULT_LOAD_FACTOR,
        }
    }
}

impl Filter for RendezvousHome {
    fn filter(&self, cx: &Cycle<'_>, endpoints: Vec<usize>, _rng: &mut Rng) -> Vec<usize> {
        let Some(key) = cx.rendezvous_key else {
            return endpoints;
        };
        if endpoints.len() <= self.size {
            return endpoints;
        }
        let mut weighted: Vec<(u64, usize)> = endpoints
            .iter()
            .filter_map(|&i| {
                cx.candidate(i)
                    .map(|c| (xxh64(c.address.as_bytes(), key), i))
            })
            .collect();
        weighted.sort_unstable_by(|a, b| b.cmp(a));
        let loads: Vec<u64> = endpoints
            .iter()
            .map(|&i| cx.candidate(i).map_or(0, load))
            .collect();
        let bound = if self.load_factor > 0.0 {
            let mean = loads.iter().sum::<u64>() as f64 / loads.len().max(1) as f64;
            (self.load_factor * mean).ceil() as u64 + 1
        } else {
            u64::MAX
        };
        let mut home: Vec<usize> = weighted
            .iter()
            .map(|&(_, i)| i)
            .filter(|&i| cx.candidate(i).map_or(0, load) <= bound)
            .take(self.size)
            .collect();
        if home.is_empty() {
            home = weighted.iter().take(self.size).map(|&(_, i)| i).collect();
        }
        home.sort_unstable();
        home
    }
}

impl RendezvousHome {
    /// Builds the filter from its `parameters` (`homeSize`, default 2, at least 1).
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(Some(v), path, &["homeSize", "loadFactor"])?;
        let load_factor = p.f64("loadFactor", DEFAULT_LOAD_FACTOR)?;
        if load_factor < 0.0 {
            return Err(err(
                &p.path("loadFactor"),
                format!("must be 0 (no bound) or positive, got {load_factor}"),
            ));
        }
        let size = p.positive("homeSize", DEFAULT_HOME_SIZE as i64)?;
        let size = usize::try_from(size)
            .map_err(|_| err(&p.path("homeSize"), format!("too large: {size}")))?;
        Ok(Self { size, load_factor })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::*;
    use crate::scheduler::{Cycle, Request};
    use wasm_bindgen_test::wasm_bindgen_test;

    fn home(f: &RendezvousHome, c: &[crate::endpoint::Candidate], key: Option<u64>) -> Vec<String> {
        let request = Request::default();
        let cx = Cycle {
            request: &request,
            candidates: c,
            prefix: &[],
            prior: &[],
            rendezvous_key: key,
            estimates: &[],
        };
        let mut kept: Vec<String> = f
            .filter(&cx, all(c), &mut Rng::new(0))
            .into_iter()
            .map(|i| c[i].address.clone())
            .collect();
        kept.sort();
        kept
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn every_gateway_keeps_the_same_home_whatever_the_candidates_order() {
        let f = RendezvousHome::default();
        let c = candidates(&[(0, 2, 0.1); 8]);
        let mut rev = c.clone();
        rev.reverse();
        let mut homes = std::collections::BTreeSet::new();
        for key in 0..64u64 {
            let h = home(&f, &c, Some(key));
            assert_eq!(h.len(), DEFAULT_HOME_SIZE);
            assert_eq!(h, home(&f, &rev, Some(key)), "key {key}");
            homes.insert(h);
        }
        assert!(homes.len() > 8, "keys spread over homes: {}", homes.len());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_home_endpoint_loaded_past_the_bound_gives_its_place_to_the_next() {
        let f = RendezvousHome {
            size: 1,
            load_factor: 1.5,
        };
        let mut c = candidates(&[(0, 4, 0.1); 4]);
        let owner = home(&f, &c, Some(7));
        let i = c.iter().position(|x| x.address == owner[0]).unwrap_or(0);
        // Bound: ceil(1.5 × the mean load) + 1. Loads 8, 4, 4, 4: mean 5, bound 9.
        c[i].metrics.waiting = 4;
        assert_eq!(home(&f, &c, Some(7)), owner, "8 is within 9");
        // Loads 12, 4, 4, 4: mean 6, bound 10.
        c[i].metrics.waiting = 8;
        let next = home(&f, &c, Some(7));
        assert_ne!(next, owner);
        // This gateway's own requests in flight count when the scrape shows fewer.
        c[i].metrics.waiting = 0;
        c[i].in_flight = 30;
        assert_eq!(home(&f, &c, Some(7)), next);
        // With no bound the owner stays.
        let unbounded = RendezvousHome {
            size: 1,
            load_factor: 0.0,
        };
        assert_eq!(home(&unbounded, &c, Some(7)), owner);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn without_a_key_every_endpoint_is_kept() {
        let c = candidates(&[(0, 0, 0.0); 4]);
        assert_eq!(home(&RendezvousHome::default(), &c, None).len(), 4);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn bad_parameters_name_the_field() {
        let e = RendezvousHome::from_parameters(&serde_json::json!({"homeSize": 0}), "p")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("p.homeSize"), "{e}");
        let e = RendezvousHome::from_parameters(&serde_json::json!({"loadFactor": -1}), "p")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("p.loadFactor"), "{e}");
    }
}
