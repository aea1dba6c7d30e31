//! SLO-aware scheduling end to end in the core: the configurations of the design and of
//! the reference's chart load, the headroom against the tightest running SLO steers the
//! pick, a sheddable request nobody can serve is refused while a critical one goes to
//! the least overloaded endpoint, and nothing changes before the predictor is ready.

#[cfg(test)]
mod tests {
    use crate::latency::features::N;
    use crate::latency::predictor::Predictor;
    use crate::latency::{Model, Sample, View};
    use crate::scheduler::handlers::Handler;
    use crate::scheduler::testing::candidates;
    use crate::scheduler::*;
    use serde_json::json;
    use std::rc::Rc;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn scheduler(config: serde_json::Value) -> Scheduler {
        crate::runtime::from_value(&config).unwrap().scheduler
    }

    /// A model trained on a pool where TTFT = 50 + 100·waiting ms and TPOT = 10 + 10·running
    /// ms, on every endpoint of `addresses`.
    fn trained(addresses: &[&str]) -> Model {
        let mut m = Model::default();
        for i in 0..600 {
            let waiting = (i % 7) as f64;
            let running = (i % 11) as f64;
            let mut x = [0.0; N];
            x[0] = 1.0;
            x[3] = waiting;
            x[4] = running;
            m.train(
                &Sample {
                    address: addresses[i % addresses.len()].to_string(),
                    x: x.to_vec(),
                    ttft_ms: 50.0 + 100.0 * waiting,
                    tpot_ms: 10.0 + 10.0 * running,
                    ..Sample::default()
                },
                0,
            );
        }
        m
    }

    /// Candidates with (waiting, running) loads, all of them sent through this gateway
    /// (so none is idle).
    fn busy(loads: &[(u64, u64)]) -> Vec<Candidate> {
        let spec: Vec<(u64, u64, f64)> = loads.iter().map(|(w, r)| (*w, *r, 0.5)).collect();
        let mut c = candidates(&spec);
        c.iter_mut()
            .for_each(|c| c.in_flight = c.metrics.waiting + c.metrics.running);
        c
    }

    fn slo_request<'a>(slo: Slo, priority: i32, view: &'a View) -> Request<'a> {
        Request {
            model: "m",
            prompt: "hello",
            slo,
            priority,
            latency: Some(view),
            ..Request::default()
        }
    }

    fn run(
        s: &Scheduler,
        r: &Request<'_>,
        c: &[Candidate],
        seed: u64,
    ) -> Result<Decision, ScheduleError> {
        s.schedule(
            r,
            c,
            &PrefixIndex::new(),
            &mut Rng::new(seed),
            &mut Probe::new(None),
        )
    }

    fn slo_profile(producer: serde_json::Value) -> serde_json::Value {
        json!({
            "plugins": [
                {"type": "predicted-latency-producer", "parameters": producer},
                {"type": "slo-headroom-tier-filter", "parameters": {"epsilonExploreNeg": 0}},
                {"type": "latency-scorer"},
                {"type": "latency-slo-admitter"},
                {"type": "weighted-random-picker"}
            ],
            "schedulingProfiles": [{"name": "slo", "plugins": [
                {"pluginRef": "slo-headroom-tier-filter"},
                {"pluginRef": "latency-scorer"},
                {"pluginRef": "weighted-random-picker"}
            ]}]
        })
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_designs_two_profile_example_loads_and_the_header_selects_the_profile() {
        let s = scheduler(json!({
            "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
            "kind": "EndpointPickerConfig",
            "plugins": [
                {"type": "queue-scorer"},
                {"type": "kv-cache-utilization-scorer"},
                {"type": "prefix-cache-scorer"},
                {"type": "slo-request-tracker"},
                {"type": "slo-scorer"},
                {"type": "slo-aware-profile-handler"},
                {"type": "weighted-random-picker"}
            ],
            "schedulingProfiles": [
                {"name": "default", "plugins": [
                    {"pluginRef": "slo-request-tracker"},
                    {"pluginRef": "queue-scorer"},
                    {"pluginRef": "kv-cache-utilization-scorer"},
                    {"pluginRef": "prefix-cache-scorer"}
                ]},
                {"name": "slo", "plugins": [
                    {"pluginRef": "prefix-cache-scorer", "weight": 0},
                    {"pluginRef": "slo-request-tracker"},
                    {"pluginRef": "slo-scorer"},
                    {"pluginRef": "weighted-random-picker"}
                ]}
            ]
        }));
        assert!(matches!(s.handler, Handler::SloAware(_)));
        assert!(s.latency.is_some());
        let c = busy(&[(0, 1), (0, 1)]);
        let view = View::default();
        let mut r = slo_request(Slo::default(), 0, &view);
        assert_eq!(run(&s, &r, &c, 1).unwrap().profile, "default");
        r.prediction_based = Some(true);
        assert_eq!(run(&s, &r, &c, 1).unwrap().profile, "slo");
        // An SLO header alone selects it; opting out wins.
        let mut r = slo_request(
            Slo {
                ttft_ms: Some(500.0),
                tpot_ms: None,
            },
            0,
            &view,
        );
        assert_eq!(run(&s, &r, &c, 1).unwrap().profile, "slo");
        r.prediction_based = Some(false);
        assert_eq!(run(&s, &r, &c, 1).unwrap().profile, "default");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_reference_charts_default_profile_loads() {
        let s = scheduler(json!({
            "plugins": [
                {"type": "predicted-latency-producer", "parameters": {"sloBufferFactor": 1.0, "contextTTL": "5m"}},
                {"type": "prefix-cache-affinity-filter", "name": "sticky-99",
                 "parameters": {"affinityThreshold": 0.99, "ttftSource": "latencyPredictor", "maxTTFTPenaltyMs": 5000}},
                {"type": "slo-headroom-tier-filter"},
                {"type": "prefix-cache-affinity-filter", "name": "sticky-80",
                 "parameters": {"affinityThreshold": 0.80, "ttftSource": "latencyPredictor", "maxTTFTPenaltyMs": 5000}},
                {"type": "latency-scorer", "parameters": {"headroomSelectionStrategy": "least"}},
                {"type": "latency-slo-admitter"},
                {"type": "weighted-random-picker"}
            ],
            "schedulingProfiles": [{"name": "default", "plugins": [
                {"pluginRef": "sticky-99"},
                {"pluginRef": "slo-headroom-tier-filter"},
                {"pluginRef": "sticky-80"},
                {"pluginRef": "latency-scorer"},
                {"pluginRef": "weighted-random-picker"}
            ]}]
        }));
        assert!(s.slo_admitter);
        assert_eq!(s.profiles[0].filters.len(), 3);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn slo_plugins_without_a_producer_are_refused_at_load() {
        let e = crate::runtime::from_value(&json!({
            "plugins": [{"type": "latency-scorer"}, {"type": "max-score-picker"}]
        }))
        .err()
        .unwrap();
        assert_eq!(e.path, "plugins[0].type");
        assert!(e.to_string().contains("predicted-latency-producer"), "{e}");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_tpot_slo_avoids_the_endpoint_whose_running_request_is_tighter() {
        let s = scheduler(slo_profile(json!({"streamingMode": true})));
        let a = "10.0.0.1:8000";
        let b = "10.0.0.2:8000";
        // Same load on both: TPOT predicted 10 + 10·5 = 60 ms. A runs a 50 ms TPOT request.
        let c = busy(&[(0, 5), (0, 5)]);
        let view = View {
            model: Some(Rc::new(Predictor::new(trained(&[a, b])))),
            min_tpot_slo: Rc::new([(a.to_string(), 50.0)].into_iter().collect()),
        };
        let slo = Slo {
            ttft_ms: Some(1_000.0),
            tpot_ms: Some(80.0),
        };
        let r = slo_request(slo, 0, &view);
        let d = run(&s, &r, &c, 0).unwrap();
        let on_a = d.estimates[0].prediction.unwrap();
        let on_b = d.estimates[1].prediction.unwrap();
        // The design's example: −10 ms on A (against the 50 ms running), +20 ms on B.
        assert!((on_a.tpot_headroom + 10.0).abs() < 1.0, "{on_a:?}");
        assert!((on_b.tpot_headroom - 20.0).abs() < 1.0, "{on_b:?}");
        for seed in 0..200 {
            assert_eq!(
                run(&s, &r, &c, seed).unwrap().primary(),
                Some(1),
                "seed {seed}"
            );
        }
        // Without the running request, A fits as well.
        let free = View {
            min_tpot_slo: Default::default(),
            ..view.clone()
        };
        let d = run(&s, &slo_request(slo, 0, &free), &c, 0).unwrap();
        assert!(d.estimates.iter().all(|e| e.prediction.unwrap().valid()));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_tight_ttft_slo_goes_where_the_queue_is_short() {
        let s = scheduler(slo_profile(json!({})));
        let eps = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"];
        // TTFT predicted 650, 150 and 350 ms.
        let c = busy(&[(6, 1), (1, 1), (3, 1)]);
        let view = View {
            model: Some(Rc::new(Predictor::new(trained(&eps)))),
            ..View::default()
        };
        let r = slo_request(
            Slo {
                ttft_ms: Some(200.0),
                tpot_ms: None,
            },
            0,
            &view,
        );
        for seed in 0..100 {
            assert_eq!(run(&s, &r, &c, seed).unwrap().primary(), Some(1));
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn sheddable_requests_nobody_can_serve_are_refused_and_critical_ones_go_to_the_least_late() {
        let s = scheduler(slo_profile(json!({})));
        let eps = ["10.0.0.1:8000", "10.0.0.2:8000"];
        // TTFT predicted 350 and 150 ms; the SLO is 100 ms: nobody fits.
        let c = busy(&[(3, 1), (1, 1)]);
        let view = View {
            model: Some(Rc::new(Predictor::new(trained(&eps)))),
            ..View::default()
        };
        let slo = Slo {
            ttft_ms: Some(100.0),
            tpot_ms: None,
        };
        let shed = run(&s, &slo_request(slo, -1, &view), &c, 0).unwrap_err();
        assert_eq!(shed, ScheduleError::SloUnattainable { slo });
        assert!(shed.to_string().contains("TTFT 100 ms"), "{shed}");
        // A critical request is served, by the endpoint that misses by the least.
        for seed in 0..50 {
            let d = run(&s, &slo_request(slo, 0, &view), &c, seed).unwrap();
            assert_eq!(d.primary(), Some(1));
        }
        // A sheddable request that fits somewhere goes.
        let relaxed = Slo {
            ttft_ms: Some(200.0),
            tpot_ms: None,
        };
        assert!(run(&s, &slo_request(relaxed, -1, &view), &c, 0).is_ok());
        // So does one with no SLO at all (the SLO plugins do not judge it).
        assert!(run(&s, &slo_request(Slo::default(), -1, &view), &c, 0).is_ok());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn before_the_predictor_is_ready_nothing_is_shed_and_the_composite_decides() {
        let s = scheduler(slo_profile(json!({})));
        let c = busy(&[(5, 1), (0, 1)]);
        let cold = View {
            model: None,
            ..View::default()
        };
        let slo = Slo {
            ttft_ms: Some(1.0),
            tpot_ms: None,
        };
        let d = run(&s, &slo_request(slo, -1, &cold), &c, 0).unwrap();
        assert!(d.estimates.iter().all(|e| e.prediction.is_none()));
        // The composite favours the empty queue.
        let on_empty = (0..200)
            .filter(|seed| {
                run(&s, &slo_request(slo, -1, &cold), &c, *seed)
                    .unwrap()
                    .primary()
                    == Some(1)
            })
            .count();
        assert!(on_empty > 120, "{on_empty} of 200");
    }
}
