//! The real filter in a simulated 4-worker Envoy: what a user of the gateway relies on.

mod common;

use common::filter::HTTP_CONTEXT_TYPE;
use common::*;
use host_sim::{ms, Control, Fault, FaultAction, Final, RequestSpec, SimConfig, SimpleUpstream};
use serde_json::json;

fn completion(i: usize, stream: bool) -> RequestSpec {
    RequestSpec::completion(MODEL, &format!("request {i}"), 4, stream)
}

#[test]
fn concurrent_requests_are_spread_evenly_over_endpoints_across_workers() {
    let eps = endpoints(3);
    let cfg = SimConfig::new(&filter_config(&eps, json!({})))
        .workers(4)
        .seed(11);
    let mut sim = sim_with(cfg, &eps, |a| SimpleUpstream::new(a).ttft(ms(200)));
    // 12 requests in flight together, then 12 more after the first wave finished.
    sim.add_requests((0..12).map(|i| completion(i, i % 2 == 0).at(ms(10))));
    sim.add_requests((12..24).map(|i| completion(i, i % 2 == 0).at(ms(2000))));
    sim.run().unwrap();
    let mut workers = std::collections::BTreeSet::new();
    for wave in [0..12, 12..24] {
        for o in &sim.outcomes()[wave.clone()] {
            assert_eq!(o.status, Some(200), "{}", o.text());
            assert_served_where_routed(o);
            workers.insert(o.worker.unwrap());
        }
        let per_ep = per_endpoint(&sim.outcomes()[wave]);
        assert_eq!(
            per_ep.values().copied().collect::<Vec<_>>(),
            vec![4, 4, 4],
            "{per_ep:?}"
        );
    }
    assert!(
        workers.len() >= 3,
        "connections spread over workers: {workers:?}"
    );
    assert_eq!(running_requests(&sim), 0.0);
    assert_eq!(scheduler_attempts(&sim, "success"), 24.0);
}

#[test]
fn malformed_bodies_get_openai_style_400s_that_pass_through_the_filter() {
    let eps = endpoints(1);
    let cfg = SimConfig::new(&filter_config(&eps, json!({}))).workers(2);
    let mut sim = sim_with(cfg, &eps, SimpleUpstream::new);
    sim.add_requests([
        RequestSpec::post("/v1/completions", "{not json").at(ms(5)),
        RequestSpec::post("/v1/completions", r#"{"prompt":"no model"}"#).at(ms(5)),
        RequestSpec::post("/v1/chat/completions", r#"{"model":"m","messages":[]}"#).at(ms(5)),
        completion(3, false).at(ms(6)),
    ]);
    sim.run().unwrap();
    let o = sim.outcomes();
    for bad in &o[..3] {
        assert_eq!(bad.status, Some(400), "{}", bad.text());
        assert_eq!(bad.header("content-type"), Some("application/json"));
        assert_eq!(bad.json()["error"]["type"], "invalid_request_error");
        assert_eq!(bad.json()["error"]["code"], 400);
        assert!(bad.endpoint.is_none(), "a rejected request goes nowhere");
    }
    assert_eq!(o[1].json()["error"]["param"], "model");
    assert_eq!(o[3].status, Some(200));
    assert_eq!(
        metric(&sim, "inference_objective_request_error_total{target_model_name=\"\",model_name=\"\",error_code=\"BadRequest\"}"),
        3.0
    );
}

#[test]
fn a_body_over_the_limit_gets_413_naming_the_limit() {
    let eps = endpoints(1);
    let cfg = SimConfig::new(&filter_config(&eps, json!({"maxRequestBodyBytes": 4096})));
    let mut sim = sim_with(cfg, &eps, SimpleUpstream::new);
    let big = RequestSpec::completion(MODEL, &"x".repeat(100_000), 1, false).at(ms(5));
    sim.add_requests([big, completion(1, false).at(ms(50))]);
    sim.run().unwrap();
    let o = sim.outcome(0);
    assert_eq!(o.status, Some(413));
    assert!(o.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("4096"));
    assert_eq!(
        sim.outcome(1).status,
        Some(200),
        "the gateway still serves afterwards"
    );
}

#[test]
fn envoys_own_413_beyond_the_connection_buffer_limit_also_reaches_the_client() {
    // The filter allows 1 MiB, but the listener buffers at most 64 KiB: Envoy answers 413
    // itself while the filter is still buffering.
    let eps = endpoints(1);
    let cfg = SimConfig::new(&filter_config(
        &eps,
        json!({"maxRequestBodyBytes": 1_048_576}),
    ))
    .buffer_limit(65_536);
    let mut sim = sim_with(cfg, &eps, SimpleUpstream::new);
    sim.add_requests([RequestSpec::completion(MODEL, &"y".repeat(200_000), 1, false).at(ms(5))]);
    sim.run().unwrap();
    assert_eq!(sim.outcome(0).status, Some(413));
    assert_eq!(sim.outcome(0).text(), "Payload Too Large");
}

#[test]
fn a_router_local_reply_passes_through_the_filters_response_callbacks() {
    // The filter picks an endpoint nobody listens on: the router's 503 goes through the
    // filter's on_http_response_headers, which names the endpoint it picked.
    let eps = endpoints(1);
    let cfg = SimConfig::new(&filter_config(&eps, json!({})));
    let mut sim = sim_with(cfg, &[], SimpleUpstream::new);
    sim.add_requests([completion(0, false).at(ms(5))]);
    sim.run().unwrap();
    let o = sim.outcome(0);
    assert_eq!(o.status, Some(503));
    assert!(o.text().contains("upstream connect error"), "{}", o.text());
    assert_eq!(o.header(SERVED_HEADER), Some(eps[0].as_str()));
    assert_eq!(
        running_requests(&sim),
        0.0,
        "a failed request is released too"
    );
}

#[test]
fn a_client_disconnect_mid_request_releases_the_in_flight_count() {
    let eps = endpoints(3);
    let cfg = SimConfig::new(&filter_config(&eps, json!({})))
        .workers(4)
        .seed(5);
    let mut sim = sim_with(cfg, &eps, |a| SimpleUpstream::new(a).ttft(ms(1000)));
    // Six clients give up after 100 ms; six wait.
    sim.add_requests((0..12).map(|i| {
        let r = completion(i, i % 3 == 0).at(ms(10));
        if i % 2 == 0 {
            r.disconnect_after(ms(100))
        } else {
            r
        }
    }));
    // Envoy's gauge is brought up to date on the root tick (and when a request ends).
    sim.run_until(ms(105)).unwrap();
    assert_eq!(running_requests(&sim), 12.0);
    sim.run_until(ms(500)).unwrap();
    assert_eq!(
        running_requests(&sim),
        6.0,
        "the six that left are released at once"
    );
    let l = ledger(&sim);
    let total: u64 = eps.iter().map(|e| l.in_flight(e)).sum();
    assert_eq!(total, 6);
    let at_servers: u64 = eps.iter().map(|e| sim.in_flight(e)).sum();
    assert_eq!(at_servers, 6, "the servers were told to stop");
    sim.run().unwrap();
    for o in sim.outcomes() {
        let expect = if o.id % 2 == 0 {
            Final::Disconnected
        } else {
            Final::Response
        };
        assert_eq!(o.fin, expect, "request {}", o.id);
    }
    assert_eq!(running_requests(&sim), 0.0);
    assert!(ledger(&sim).workers.is_empty(), "{:?}", ledger(&sim));
}

#[test]
fn a_vm_trap_is_handled_as_fail_reload() {
    let eps = endpoints(2);
    let cfg = SimConfig::new(&filter_config(&eps, json!({}))).workers(1);
    let mut sim = sim_with(cfg, &eps, SimpleUpstream::new);
    // The worker's VM traps in a host call made while scheduling the request sent at 100 ms.
    sim.add_fault(
        Fault::new("proxy_get_shared_data", FaultAction::Trap)
            .in_slot(host_sim::slot_of_worker(0))
            .between(ms(100), u64::MAX)
            .times(1),
    );
    sim.add_requests([
        completion(0, false).at(ms(50)),
        completion(1, false).at(ms(100)),
        completion(2, false).at(ms(600)),
        completion(3, false).at(ms(1300)),
        completion(4, true).at(ms(1400)),
    ]);
    sim.run().unwrap();
    let status: Vec<_> = sim.outcomes().iter().map(|o| o.status).collect();
    assert_eq!(
        status,
        [Some(200), Some(503), Some(503), Some(200), Some(200)]
    );
    assert_eq!(sim.reloads(), 1, "one fresh VM after the backoff");
    let crash = &sim.crashes()[0];
    assert_eq!(crash.callback, "proxy_on_request_body");
    assert!(
        crash
            .message
            .contains("injected fault: proxy_get_shared_data trapped"),
        "{}",
        crash.message
    );
    assert!(
        crash.message.contains("wasm backtrace"),
        "{}",
        crash.message
    );
    assert!(
        crash.message.contains(HTTP_CONTEXT_TYPE),
        "demangled frames: {}",
        crash.message
    );
    // Stats are process-wide: the fresh VM's counts add to the dead one's.
    assert_eq!(scheduler_attempts(&sim, "success"), 3.0);
}

#[test]
fn an_injected_shared_data_failure_takes_the_filters_error_path_without_a_crash() {
    let eps = endpoints(2);
    let cfg = SimConfig::new(&filter_config(&eps, json!({}))).workers(2);
    let mut sim = sim_with(cfg, &eps, SimpleUpstream::new);
    sim.add_fault(
        Fault::new("proxy_set_shared_data", FaultAction::Status(10)).between(ms(20), ms(40)),
    );
    sim.add_requests([
        completion(0, false).at(ms(25)),
        completion(1, false).at(ms(26)),
        completion(2, false).at(ms(60)),
    ]);
    sim.run().unwrap();
    for o in &sim.outcomes()[..2] {
        assert_eq!(o.status, Some(503));
        assert_eq!(o.json()["error"]["type"], "service_unavailable");
        assert!(
            o.text().contains("endpoint state is unavailable"),
            "{}",
            o.text()
        );
    }
    assert_eq!(sim.outcome(2).status, Some(200));
    assert!(sim.crashes().is_empty());
    assert_eq!(running_requests(&sim), 0.0);
    assert_eq!(scheduler_attempts(&sim, "failure"), 2.0);
}

#[test]
fn a_server_that_goes_away_resets_its_streams_and_fails_new_requests() {
    let eps = endpoints(2);
    let cfg = SimConfig::new(&filter_config(&eps, json!({})))
        .workers(2)
        .seed(3);
    let mut sim = sim_with(cfg, &eps, |a| {
        SimpleUpstream::new(a).ttft(ms(50)).itl(ms(20))
    });
    sim.add_requests((0..4).map(|i| RequestSpec::completion(MODEL, "long", 100, i < 2).at(ms(10))));
    sim.at(ms(500), Control::RemoveEndpoint(eps[0].clone()));
    sim.add_requests((4..8).map(|i| completion(i, false).at(ms(700))));
    sim.run().unwrap();
    for o in &sim.outcomes()[..4] {
        if o.endpoint.as_deref() == Some(eps[0].as_str()) {
            // Streams already had their head: reset; the others get the router's 503.
            let expect = if o.id < 2 {
                Final::Reset
            } else {
                Final::Response
            };
            assert_eq!(o.fin, expect, "request {}", o.id);
            if o.id >= 2 {
                assert_eq!(o.status, Some(503));
            }
        } else {
            assert_eq!(o.status, Some(200));
        }
    }
    // Two failures are fewer than passive health's 5 in a row: the dead endpoint has
    // the fewest requests in flight, so it is still picked, and those requests fail
    // (tests/passive_health.rs: ejected after 5).
    let later: Vec<_> = sim.outcomes()[4..]
        .iter()
        .map(|o| (o.endpoint.clone().unwrap(), o.status.unwrap()))
        .collect();
    assert!(
        later.iter().any(|(e, s)| e == &eps[0] && *s == 503),
        "{later:?}"
    );
    assert_eq!(running_requests(&sim), 0.0);
}

#[test]
fn poisson_load_with_tenants_keeps_every_invariant() {
    let eps = endpoints(8);
    let cfg = SimConfig::new(&filter_config(&eps, json!({})))
        .workers(4)
        .seed(99);
    let mut sim = sim_with(cfg, &eps, |a| {
        SimpleUpstream::new(a)
            .ttft(ms(30))
            .itl(ms(2))
            .max_running(8)
    });
    let mut w = host_sim::Poisson::new(400.0, 400, MODEL);
    w.start = ms(10);
    w.tenants = vec![("a".into(), 3.0), ("b".into(), 1.0)];
    w.objectives = vec![("critical".into(), 1.0), ("sheddable".into(), 1.0)];
    w.prefix_groups = 4;
    w.slo = Some((500, 50));
    w.disconnects = Some((0.1, ms(40)));
    let mut rng = host_sim::world::clock::Rng::new(7, 3);
    sim.add_requests(w.generate(&mut rng));
    sim.run().unwrap();
    let served = sim
        .outcomes()
        .iter()
        .filter(|o| o.fin == Final::Response)
        .count();
    let gone = sim
        .outcomes()
        .iter()
        .filter(|o| o.fin == Final::Disconnected)
        .count();
    assert_eq!(served + gone, 400);
    assert!(gone > 10 && gone < 80, "{gone}");
    for o in sim.outcomes().iter().filter(|o| o.fin == Final::Response) {
        assert_eq!(o.status, Some(200), "{}", o.text());
        let (d, f, l) = (
            o.dispatched_at.unwrap(),
            o.first_token_at.unwrap(),
            o.last_token_at.unwrap(),
        );
        assert!(o.sent_at < d && d < f && f <= l, "{o:?}");
    }
    assert_eq!(running_requests(&sim), 0.0);
}

#[test]
fn a_slowed_server_gets_fewer_requests_and_a_failing_one_passes_its_errors_through() {
    let eps = endpoints(3);
    // The scorers alone: passive health (tests/passive_health.rs) would eject the
    // failing server.
    let pool = json!({"passiveHealth": {"consecutiveFailures": 0}});
    let cfg = SimConfig::new(&filter_config(&eps, pool))
        .workers(4)
        .seed(21);
    let mut sim = sim_with(cfg, &eps, |a| {
        SimpleUpstream::new(a).ttft(ms(20)).itl(ms(2))
    });
    sim.at(
        ms(5),
        Control::SetCondition(eps[0].clone(), host_sim::Condition::Slowed(8.0)),
    );
    sim.at(
        ms(5),
        Control::SetCondition(eps[2].clone(), host_sim::Condition::Failing(500)),
    );
    let mut w = host_sim::Poisson::new(500.0, 300, MODEL);
    w.start = ms(10);
    sim.add_requests(w.generate(&mut host_sim::world::clock::Rng::new(1, 1)));
    sim.run().unwrap();
    let count = |ep: &str| {
        sim.outcomes()
            .iter()
            .filter(|o| o.endpoint.as_deref() == Some(ep))
            .count()
    };
    // Least-in-flight: the slow server holds its requests longer, so it gets fewer; the
    // failing one answers at once, so it gets the most.
    assert!(
        count(&eps[0]) < count(&eps[1]),
        "{} vs {}",
        count(&eps[0]),
        count(&eps[1])
    );
    assert!(count(&eps[2]) > count(&eps[1]));
    for o in sim.outcomes() {
        let expect = if o.endpoint.as_deref() == Some(eps[2].as_str()) {
            500
        } else {
            200
        };
        assert_eq!(o.status, Some(expect));
        assert_eq!(o.header(SERVED_HEADER), o.endpoint.as_deref());
    }
    assert_eq!(running_requests(&sim), 0.0);
}

#[test]
fn lost_cas_races_are_retried_and_the_spread_still_holds() {
    // host-sim runs each callback to completion, so two VMs never race inside one; a
    // lost race (another worker wrote the ledger between our read and our write) is
    // injected instead: 40 % of ledger writes fail with CasMismatch.
    let eps = endpoints(3);
    let cfg = SimConfig::new(&filter_config(&eps, json!({})))
        .workers(4)
        .seed(17);
    let mut sim = sim_with(cfg, &eps, |a| SimpleUpstream::new(a).ttft(ms(300)));
    sim.add_fault(
        Fault::new("proxy_set_shared_data", FaultAction::Status(8))
            .between(ms(5), u64::MAX)
            .probability(0.4),
    );
    sim.add_requests((0..30).map(|i| completion(i, false).at(ms(10) + i as u64)));
    sim.run().unwrap();
    for o in sim.outcomes() {
        assert_eq!(o.status, Some(200), "{}", o.text());
    }
    let per_ep = per_endpoint(sim.outcomes());
    assert_eq!(
        per_ep.values().copied().collect::<Vec<_>>(),
        vec![10, 10, 10]
    );
    assert!(sim.crashes().is_empty());
    assert!(sim.faults_fired()[0] > 20, "{:?}", sim.faults_fired());
    assert!(
        ledger(&sim).workers.is_empty(),
        "every retry-won release landed"
    );
}

#[test]
fn a_server_that_comes_up_mid_run_starts_serving() {
    let eps = endpoints(1);
    let cfg = SimConfig::new(&filter_config(&eps, json!({})));
    let mut sim = sim_with(cfg, &[], SimpleUpstream::new);
    sim.at(
        ms(100),
        Control::AddEndpoint(eps[0].clone(), Box::new(SimpleUpstream::new(&eps[0]))),
    );
    sim.add_requests([
        completion(0, false).at(ms(50)),
        completion(1, true).at(ms(150)),
    ]);
    sim.run().unwrap();
    assert_eq!(sim.outcome(0).status, Some(503), "nobody listening yet");
    assert_eq!(sim.outcome(1).status, Some(200));
    assert_eq!(sim.outcome(1).header("x-sim-server"), Some(eps[0].as_str()));
}

#[test]
fn a_crashed_workers_in_flight_requests_fail_and_their_counts_expire() {
    let eps = endpoints(2);
    let cfg = SimConfig::new(&filter_config(&eps, json!({})))
        .workers(1)
        .seed(2);
    let mut sim = sim_with(cfg, &eps, |a| SimpleUpstream::new(a).ttft(ms(200)));
    // The first response header callback on the worker traps (it reads upstream.address;
    // configure, at 0 ms, also reads a property).
    sim.add_fault(
        Fault::new("proxy_get_property", FaultAction::Trap)
            .in_slot(host_sim::slot_of_worker(0))
            .between(ms(5), u64::MAX)
            .times(1),
    );
    sim.add_requests((0..4).map(|i| completion(i, false).at(ms(10) + i as u64)));
    sim.run_until(ms(500)).unwrap();
    assert_eq!(sim.crashes().len(), 1);
    assert_eq!(sim.crashes()[0].callback, "proxy_on_response_headers");
    for o in sim.outcomes() {
        assert_eq!(
            o.status,
            Some(503),
            "every stream of the dead VM fails: {o:?}"
        );
    }
    // The dead VM never released its four requests: the ledger still counts them ...
    let total = |sim: &host_sim::Sim| -> u64 { eps.iter().map(|e| ledger(sim).in_flight(e)).sum() };
    assert_eq!(total(&sim), 4);
    // ... until a live VM's tick, WORKER_STALE_MS (5 s) on, drops the rows nobody refreshed.
    sim.run_until(host_sim::SEC * 4).unwrap();
    assert_eq!(total(&sim), 4);
    sim.run_until(host_sim::SEC * 12).unwrap();
    assert_eq!(total(&sim), 0, "the dead VM's counts expired");
    sim.add_requests([completion(9, false).at(host_sim::SEC * 12 + ms(1))]);
    sim.run_until(host_sim::SEC * 12 + ms(100)).unwrap();
    assert_eq!(total(&sim), 1, "only the new request");
    assert_eq!(sim.reloads(), 1);
    sim.run().unwrap();
    assert_eq!(sim.outcome(4).status, Some(200));
    // The gauge, kept by increments, stays wrong for good: the dead VM's +4 is never
    // undone (stats outlive VMs in Envoy too).
    assert_eq!(running_requests(&sim), 4.0);
}
