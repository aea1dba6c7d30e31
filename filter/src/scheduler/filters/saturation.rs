//! The saturation detectors in their **filter** role (they act only when placed in a
//! profile).
//!
//! * `utilization-detector`: keeps an endpoint whose metrics are fresh
//!   (`now − updated ≤ metricsStalenessThreshold`), with
//!   `waiting < max(queueDepthThreshold·(1+headroom), queueDepthMeanFactor × mean waiting
//!   of the fresh endpoints)` and `kv < kvCacheUtilThreshold·(1+headroom)`; if that removes
//!   every endpoint, all are kept (fail open).
//! * `concurrency-detector`: keeps an endpoint whose in-flight load (requests, or tokens
//!   in `tokens` mode) is below `int(capacity·(1+headroom))` (with `inFlightSource:
//!   servers`, also its load plus the other replicas' there below the whole
//!   `maxConcurrency`); no fail-open.

use crate::flow_control::saturation::{concurrency, utilization, Detector, EndpointLoad};
use crate::rng::Rng;
use crate::scheduler::{Cycle, Filter};
use std::rc::Rc;

/// A configured detector in its filter role.
pub fn filter_of(detector: &Detector) -> Rc<dyn Filter> {
    match detector {
        Detector::Utilization(d) => Rc::new(Utilization(d.clone())),
        Detector::Concurrency(d) => Rc::new(Concurrency(d.clone())),
    }
}

/// `utilization-detector` as a filter (parameters and formula: [`utilization::Params::keep`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Utilization(pub utilization::Params);

impl Filter for Utilization {
    fn filter(&self, cx: &Cycle<'_>, mut endpoints: Vec<usize>, _rng: &mut Rng) -> Vec<usize> {
        let load = |&i: &usize| match cx.candidate(i) {
            Some(c) => {
                EndpointLoad::scraped(c.metrics.waiting, c.metrics.kv_usage, c.metrics.updated_ms)
            }
            None => EndpointLoad::UNKNOWN,
        };
        let now = u64::try_from(cx.request.now_ms).unwrap_or(0);
        self.0.retain(&mut endpoints, load, now);
        endpoints
    }
}

/// `concurrency-detector` as a filter (parameters and formula: [`concurrency::Params::keep`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Concurrency(pub concurrency::Params);

impl Filter for Concurrency {
    fn filter(&self, cx: &Cycle<'_>, endpoints: Vec<usize>, _rng: &mut Rng) -> Vec<usize> {
        endpoints
            .into_iter()
            .filter(|&i| {
                cx.candidate(i).is_some_and(|c| {
                    self.0
                        .keep(c.in_flight, c.in_flight_tokens, c.metrics.other_load())
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::*;
    use crate::scheduler::Request;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn utilization_keeps_fresh_unsaturated_endpoints_and_fails_open() {
        let mut c = candidates(&[(4, 0, 0.5), (5, 0, 0.5), (0, 0, 0.8), (0, 0, 0.1)]);
        c[3].metrics.updated_ms = Some(-1000); // stale at now = 0
        let request = Request::default();
        let cx = Cycle {
            request: &request,
            candidates: &c,
            prefix: &[],
            prior: &[],
            rendezvous_key: None,
            estimates: &[],
        };
        let mut rng = Rng::new(0);
        let f = Utilization::default();
        assert_eq!(f.filter(&cx, all(&c), &mut rng), vec![0]);
        // All saturated: everything is kept.
        assert_eq!(f.filter(&cx, vec![1, 2], &mut rng), vec![1, 2]);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn concurrency_keeps_endpoints_below_the_limit_without_fail_open() {
        let mut c = candidates(&[(0, 0, 0.0); 2]);
        c[0].in_flight = 9;
        c[1].in_flight = 10;
        let f = Concurrency(concurrency::Params {
            max_concurrency: 10,
            ..concurrency::Params::default()
        });
        let mut rng = Rng::new(0);
        assert_eq!(
            with_cycle(&c, &[], |cx| f.filter(cx, all(&c), &mut rng)),
            vec![0]
        );
        assert!(with_cycle(&c, &[], |cx| f.filter(cx, vec![1], &mut rng)).is_empty());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn concurrency_with_the_servers_counts_leaves_out_endpoints_other_replicas_filled() {
        // Both servers run 6 by their last scrape; 2 of those on the first were this
        // gateway's when it scraped, none on the second. It now has 2 at each.
        let mut c = candidates(&[(0, 6, 0.1), (0, 6, 0.1)]);
        c[0].metrics.gateway_in_flight = 2;
        for x in &mut c {
            x.in_flight = 2;
        }
        let params = |source| concurrency::Params {
            max_concurrency: 8,
            source,
            ..concurrency::Params::default()
        };
        let mut rng = Rng::new(0);
        let servers = Concurrency(params(concurrency::Source::Servers));
        assert_eq!(
            with_cycle(&c, &[], |cx| servers.filter(cx, all(&c), &mut rng)),
            vec![0],
            "2 + 4 others < 8 is kept; 2 + 6 others is full"
        );
        let gateway = Concurrency(params(concurrency::Source::Gateway));
        assert_eq!(
            with_cycle(&c, &[], |cx| gateway.filter(cx, all(&c), &mut rng)),
            vec![0, 1]
        );
    }
}
