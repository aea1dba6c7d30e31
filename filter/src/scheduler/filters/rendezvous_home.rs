//! `rendezvous-home-filter`: keeps a prompt's *home*, the first `homeSize` endpoints (3 by
//! default) in its rendezvous order whose load is within a bound, so that however many
//! gateway replicas route a prefix group, and whatever each has learned, they send it to
//! the same few servers (consistent hashing with bounded loads).
//!
//! The order is by `xxh64(address, seed = key)`, highest first, with the prompt's
//! rendezvous key (the chained hash of its leading `rendezvousPriorBlocks` blocks:
//! `crate::prefix::rendezvous`): every replica computes the same order from the prompt and
//! the endpoints alone. An endpoint's load is its `running + waiting` by the last scrape
//! (or this gateway's own requests in flight there, when more); it is within the bound
//! while it queues nothing (`Candidate::waiting_estimate` is 0: it serves a request at
//! once, however busy) or its load is at most `ceil(loadFactor × mean load over the
//! endpoints in play) + 1` (1.5 by default). The bound is relative, so when the whole pool queues a group stays home, and a loaded home
//! endpoint gives its place to the next in the order, which every replica reading the
//! same scrape agrees on. The scorers choose within the home. Without a key (no prefix
//! plugin, `rendezvousPrior: false`, or a prompt without blocks) every endpoint is kept;
//! if no endpoint is within the bound (only possible with a factor below 1), the first
//! `homeSize` in the order are.
//!
//! With `growWhenQueueing`, while every home endpoint queues (a prefix group hotter than
//! its home), the home grows along the same order up to the first endpoint within the
//! bound that queues nothing: the group's overflow goes to its next choices, the same on
//! every replica reading the same scrape, and the home shrinks back once one of its
//! endpoints stops queueing. When no endpoint is free (a pool-wide queue) it does not grow.
//!
//! With `otherGatewayShare` above 0 the filter acts only while other gateways route to the
//! pool too: while at least that share of the requests the endpoints in play reported
//! (`running + waiting`, by their last scrape) were not this gateway's own in flight there
//! when it scraped ([`crate::endpoint::Metrics::other_load`]). A gateway alone in front of
//! its pool learns where every group is, so it keeps every endpoint and leaves the choice
//! to the filters and scorers after it, as without the filter. `whenAlone` (the parameters
//! of `utilization-detector`, `{}` for its defaults) gives the filter it applies instead
//! while alone, and to a prompt without a key: the default profile's, so one gateway
//! routes exactly as with the utilization detector, and several keep their groups home.

use crate::config::validate::err;
use crate::config::{ConfigError, Params};
use crate::flow_control::saturation::utilization;
use crate::rng::Rng;
use crate::scheduler::filters::saturation::Utilization;
use crate::scheduler::{Cycle, Filter};
use serde_json::Value;
use xxhash_rust::xxh64::xxh64;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "rendezvous-home-filter";

/// Default `homeSize`.
pub const DEFAULT_HOME_SIZE: usize = 3;

/// Default `loadFactor`.
pub const DEFAULT_LOAD_FACTOR: f64 = 1.5;

/// Default `otherGatewayShare`.
pub const DEFAULT_OTHER_GATEWAY_SHARE: f64 = 0.0;

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
    /// `otherGatewayShare`: act only while at least this share of the endpoints' scraped
    /// requests are other gateways'; 0 = always.
    pub other_share: f64,
    /// `growWhenQueueing`: while every home endpoint queues, the home grows along the
    /// rendezvous order up to the first endpoint within the bound that queues nothing.
    pub grow: bool,
    /// `whenAlone`: the utilization filter applied instead while alone, or without a key.
    pub alone: Option<Utilization>,
}

impl Default for RendezvousHome {
    fn default() -> Self {
        Self {
            size: DEFAULT_HOME_SIZE,
            load_factor: DEFAULT_LOAD_FACTOR,
            other_share: DEFAULT_OTHER_GATEWAY_SHARE,
            grow: false,
            alone: None,
        }
    }
}

/// Whether other gateways' requests are at least `share` of what the endpoints reported
/// by their last scrape (never with nothing reported).
fn others_at_least(cx: &Cycle<'_>, endpoints: &[usize], share: f64) -> bool {
    let (mut others, mut total) = (0u64, 0u64);
    for c in endpoints.iter().filter_map(|&i| cx.candidate(i)) {
        others = others.saturating_add(c.metrics.other_load());
        total = total.saturating_add(c.metrics.running.saturating_add(c.metrics.waiting));
    }
    total > 0 && others as f64 >= share * total as f64
}

impl Filter for RendezvousHome {
    fn filter(&self, cx: &Cycle<'_>, endpoints: Vec<usize>, rng: &mut Rng) -> Vec<usize> {
        let key = cx.rendezvous_key.filter(|_| {
            self.other_share <= 0.0 || others_at_least(cx, &endpoints, self.other_share)
        });
        let Some(key) = key else {
            return match &self.alone {
                Some(f) => f.filter(cx, endpoints, rng),
                None => endpoints,
            };
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
        let within = |i: usize| {
            cx.candidate(i)
                .is_some_and(|c| c.waiting_estimate() == 0 || load(c) <= bound)
        };
        let queues = |i: usize| cx.candidate(i).is_none_or(|c| c.waiting_estimate() > 0);
        let mut order = weighted.iter().map(|&(_, i)| i).filter(|&i| within(i));
        let mut home: Vec<usize> = order.by_ref().take(self.size).collect();
        if self.grow && !home.is_empty() && home.iter().all(|&i| queues(i)) {
            // Every home endpoint queues: the home grows along the order, up to the first
            // endpoint within the bound that queues nothing (none: it stays as it is).
            let more: Vec<usize> = order.collect();
            if let Some(free) = more.iter().position(|&i| !queues(i)) {
                home.extend(more.iter().take(free + 1));
            }
        }
        if home.is_empty() {
            home = weighted.iter().take(self.size).map(|&(_, i)| i).collect();
        }
        home.sort_unstable();
        home
    }
}

impl RendezvousHome {
    /// Builds the filter from its `parameters` (`homeSize`, `loadFactor`,
    /// `otherGatewayShare`).
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(
            Some(v),
            path,
            &[
                "homeSize",
                "loadFactor",
                "otherGatewayShare",
                "growWhenQueueing",
                "whenAlone",
            ],
        )?;
        let other_share = p.f64("otherGatewayShare", DEFAULT_OTHER_GATEWAY_SHARE)?;
        if !(0.0..=1.0).contains(&other_share) {
            return Err(err(
                &p.path("otherGatewayShare"),
                format!("must be between 0 (always act) and 1, got {other_share}"),
            ));
        }
        let load_factor = p.f64("loadFactor", DEFAULT_LOAD_FACTOR)?;
        if load_factor < 0.0 {
            return Err(err(
                &p.path("loadFactor"),
                format!("must be 0 (no bound) or positive, got {load_factor}"),
            ));
        }
        let grow = p.bool("growWhenQueueing", false)?;
        let size = p.positive("homeSize", DEFAULT_HOME_SIZE as i64)?;
        let size = usize::try_from(size)
            .map_err(|_| err(&p.path("homeSize"), format!("too large: {size}")))?;
        let alone = match p.get("whenAlone") {
            None => None,
            Some(_) if other_share <= 0.0 => {
                return Err(err(
                    &p.path("whenAlone"),
                    "applies only with otherGatewayShare above 0 (the filter acts always)",
                ))
            }
            Some(v) => Some(Utilization(utilization::Params::parse(
                v,
                &p.path("whenAlone"),
            )?)),
        };
        Ok(Self {
            size,
            load_factor,
            other_share,
            grow,
            alone,
        })
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
            ..RendezvousHome::default()
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
            ..RendezvousHome::default()
        };
        assert_eq!(home(&unbounded, &c, Some(7)), owner);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn with_other_gateway_share_it_acts_only_when_the_servers_show_other_gateways_requests() {
        let f = RendezvousHome {
            other_share: 0.25,
            ..RendezvousHome::default()
        };
        // Every server runs 4, all of them this gateway's when it scraped: it is alone.
        let mut c = candidates(&[(0, 4, 0.1); 8]);
        for x in &mut c {
            x.metrics.gateway_in_flight = 4;
        }
        assert_eq!(home(&f, &c, Some(7)).len(), 8, "alone: every endpoint kept");
        // A quarter of what the servers run is another gateway's: the home applies.
        for x in c.iter_mut().take(2) {
            x.metrics.gateway_in_flight = 0;
        }
        assert_eq!(home(&f, &c, Some(7)).len(), DEFAULT_HOME_SIZE);
        // Nothing reported (an idle or never scraped pool): no sign of others.
        let idle = candidates(&[(0, 0, 0.0); 8]);
        assert_eq!(home(&f, &idle, Some(7)).len(), 8);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn when_alone_it_leaves_out_what_the_utilization_detector_would() {
        let f = RendezvousHome::from_parameters(
            &serde_json::json!({"otherGatewayShare": 0.25, "whenAlone": {}}),
            "p",
        )
        .unwrap_or_default();
        // Alone (all of it this gateway's): the server with 5 waiting is left out, as the
        // default profile's utilization detector does; no home.
        let mut c = candidates(&[(0, 4, 0.1); 8]);
        c[3].metrics.waiting = 5;
        for x in &mut c {
            x.metrics.gateway_in_flight = x.metrics.running + x.metrics.waiting;
        }
        let kept = home(&f, &c, Some(7));
        assert_eq!(kept.len(), 7);
        assert!(!kept.contains(&c[3].address));
        // Without a key, too.
        assert_eq!(home(&f, &c, None).len(), 7);
        // With other gateways' requests at the servers, the home (3 within the bound).
        for x in &mut c {
            x.metrics.gateway_in_flight = 0;
        }
        assert_eq!(home(&f, &c, Some(7)).len(), DEFAULT_HOME_SIZE);
        let e = RendezvousHome::from_parameters(&serde_json::json!({"whenAlone": {}}), "p")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("p.whenAlone"), "{e}");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn an_endpoint_with_nothing_waiting_stays_home_however_busy() {
        let f = RendezvousHome {
            size: 1,
            ..RendezvousHome::default()
        };
        let mut c = candidates(&[(0, 1, 0.1); 8]);
        let owner = home(&f, &c, Some(7));
        let i = c.iter().position(|x| x.address == owner[0]).unwrap_or(0);
        // Runs 8 against a mean of 1.9 (bound 4), but queues nothing: it serves at once.
        c[i].metrics.running = 8;
        assert_eq!(home(&f, &c, Some(7)), owner);
        c[i].metrics.waiting = 1;
        assert_ne!(home(&f, &c, Some(7)), owner);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn while_every_home_endpoint_queues_the_home_grows_to_the_next_that_does_not() {
        let f = RendezvousHome {
            grow: true,
            ..RendezvousHome::default()
        };
        let mut c = candidates(&[(0, 4, 0.1); 8]);
        let mut order: Vec<(u64, usize)> = c
            .iter()
            .enumerate()
            .map(|(i, x)| (xxh64(x.address.as_bytes(), 7), i))
            .collect();
        order.sort_unstable_by(|a, b| b.cmp(a));
        let by_rank: Vec<String> = order.iter().map(|&(_, i)| c[i].address.clone()).collect();
        let first = |n: usize| {
            let mut v = by_rank[..n].to_vec();
            v.sort();
            v
        };
        assert_eq!(
            home(&f, &c, Some(7)),
            first(3),
            "nothing queues: the first three"
        );
        // A hot group: its three home endpoints run full and queue 1 (within the bound).
        for &(_, i) in &order[..3] {
            c[i].metrics.running = 8;
            c[i].metrics.waiting = 1;
        }
        assert_eq!(
            home(&f, &c, Some(7)),
            first(4),
            "the fourth of the order joins"
        );
        // The fourth queues too: the fifth joins, the fourth stays.
        c[order[3].1].metrics.running = 8;
        c[order[3].1].metrics.waiting = 1;
        assert_eq!(home(&f, &c, Some(7)), first(5));
        // Without growWhenQueueing the home stays at three.
        assert_eq!(home(&RendezvousHome::default(), &c, Some(7)), first(3));
        // Every endpoint queues (a pool-wide queue): no growth past the three.
        for x in &mut c {
            x.metrics.running = 8;
            x.metrics.waiting = 1;
        }
        assert_eq!(home(&f, &c, Some(7)), first(3));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn without_a_key_every_endpoint_is_kept() {
        let c = candidates(&[(0, 0, 0.0); 4]);
        assert_eq!(home(&RendezvousHome::default(), &c, None).len(), 4);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn bad_parameters_name_the_field() {
        let e = RendezvousHome::from_parameters(&serde_json::json!({"growWhenQueueing": 1}), "p")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("p.growWhenQueueing"), "{e}");
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
        let e = RendezvousHome::from_parameters(&serde_json::json!({"otherGatewayShare": 2}), "p")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("p.otherGatewayShare"), "{e}");
    }
}
