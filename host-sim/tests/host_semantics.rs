//! Host semantics the real filter does not exercise yet, through a small probe filter
//! (`tests/probe`, built with the same SDK): shared queues (last registrant receives),
//! wake-ups from the root context via a VM's inbox, local replies sent later, parked
//! streams whose client left, and many resumes in one callback.

use host_sim::world::outcomes::Final;
use host_sim::{ms, RequestSpec, Sim, SimConfig, SimpleUpstream, SEC, US};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

fn probe_wasm() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/probe");
            let out = Command::new(env!("CARGO"))
                .args([
                    "build",
                    "--offline",
                    "--release",
                    "--target",
                    "wasm32-wasip1",
                ])
                .current_dir(&dir)
                .env_remove("CARGO_TARGET_DIR")
                .output()
                .expect("run cargo for the probe filter");
            assert!(
                out.status.success(),
                "building tests/probe failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            dir.join("target/wasm32-wasip1/release/hostsim_probe.wasm")
        })
        .clone()
}

fn probe_sim(workers: usize, seed: u64) -> Sim {
    probe_sim_with(workers, seed, |_| {})
}

fn probe_sim_with(workers: usize, seed: u64, adjust: impl Fn(&mut SimConfig)) -> Sim {
    let mut cfg = SimConfig::new("").workers(workers).seed(seed);
    adjust(&mut cfg);
    cfg.wasm = probe_wasm();
    cfg.vm_id = "probe".into();
    // The probe routes on the protocol's destination header itself (the filter's route
    // header is its `-primary` copy).
    cfg.route_header = "x-gateway-destination-endpoint".into();
    for c in &mut cfg.clusters {
        if c.name == "pool" {
            c.dst_header = "x-gateway-destination-endpoint".into();
        }
    }
    let mut sim = Sim::new(cfg).unwrap();
    sim.add_endpoint(
        "10.0.0.1:8000",
        Box::new(SimpleUpstream::new("10.0.0.1:8000").ttft(ms(5))),
    );
    sim
}

fn list(sim: &Sim, key: &str) -> Vec<String> {
    sim.shared_data(key)
        .map(|b| {
            String::from_utf8_lossy(&b)
                .split(',')
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_vm_configures_and_only_the_last_registrant_of_a_queue_receives() {
    let mut sim = probe_sim(4, 3);
    sim.add_requests((0..20).map(|i| RequestSpec::get("/global").at(ms(10 + i))));
    sim.run().unwrap();
    assert!(sim.outcomes().iter().all(|o| o.status == Some(200)));
    let vms = list(&sim, "probe.vms");
    assert_eq!(vms.len(), 6, "base + main-thread + 4 worker VMs: {vms:?}");
    let receivers = list(&sim, "probe.global_receivers");
    assert_eq!(
        receivers.len(),
        20,
        "one on_queue_ready per message, drained"
    );
    let last = vms.last().unwrap();
    assert!(
        receivers.iter().all(|r| r == last),
        "{receivers:?} vs last registrant {last}"
    );
}

#[test]
fn a_stream_parked_in_a_callback_is_resumed_later_from_the_root_via_its_inbox() {
    let mut sim = probe_sim(2, 1);
    sim.add_requests((0..8).map(|i| RequestSpec::get("/park-queue").at(ms(10 + i))));
    sim.run().unwrap();
    for o in sim.outcomes() {
        assert_eq!(o.status, Some(200));
        assert_eq!(o.header("x-probe-seen"), Some("1"));
        let (paused, sent) = (o.enqueued_at.unwrap(), o.dispatched_at.unwrap());
        // Queue delivery to a worker takes 0.15-0.8 ms.
        assert!(
            sent - paused >= 150 * US && sent - paused <= 800 * US,
            "{o:?}"
        );
    }
}

#[test]
fn a_local_reply_sent_later_from_the_root_passes_through_the_response_callbacks() {
    let mut sim = probe_sim(2, 2);
    sim.add_requests([RequestSpec::get("/park-reply").at(ms(10))]);
    sim.run().unwrap();
    let o = sim.outcome(0);
    assert_eq!(o.status, Some(429));
    assert_eq!(o.text(), "later");
    assert!(o.header("x-released-by").is_some());
    assert_eq!(
        o.header("x-probe-seen"),
        Some("1"),
        "on_http_response_headers saw it"
    );
    assert!(o.endpoint.is_none());
}

#[test]
fn a_client_that_leaves_while_parked_gets_on_log_then_on_done_and_its_context_is_gone() {
    let mut sim = probe_sim(1, 4);
    sim.add_requests([RequestSpec::get("/park")
        .at(ms(10))
        .disconnect_after(ms(100))]);
    sim.run().unwrap();
    assert_eq!(sim.outcome(0).fin, Final::Disconnected);
    let events = list(&sim, "probe.events");
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(
        events[0].starts_with("log ") && events[1].starts_with("done "),
        "{events:?}"
    );
    assert!(
        list(&sim, "probe.gone").is_empty(),
        "pruned in on_done, never resumed"
    );
}

#[test]
fn resuming_a_context_that_is_gone_is_a_bad_argument_not_a_crash() {
    // `/park-queue` asks the inbox to resume the stream, but the client leaves first
    // (its disconnect reaches Envoy before the queue message reaches the VM).
    let mut sim = probe_sim_with(1, 5, |cfg| {
        cfg.network.queue_worker = host_sim::world::network::Latency {
            base: ms(5),
            jitter: 0,
        };
    });
    sim.add_requests([RequestSpec::get("/park-queue")
        .at(ms(10))
        .disconnect_after(ms(1))]);
    sim.run().unwrap();
    assert_eq!(sim.outcome(0).fin, Final::Disconnected);
    assert_eq!(list(&sim, "probe.gone").len(), 1);
    assert!(sim.crashes().is_empty());
}

#[test]
fn many_streams_resumed_in_one_callback_all_reach_the_upstream_and_ticks_release_the_rest() {
    let mut sim = probe_sim(1, 6);
    sim.add_requests((0..50).map(|i| RequestSpec::get("/park").at(ms(10) + i * US)));
    sim.add_requests([RequestSpec::get("/release-all").at(ms(20))]);
    // Parked after the release: only the 1 s tick releases these.
    sim.add_requests((0..5).map(|i| RequestSpec::get("/park").at(ms(40) + i * US)));
    sim.run().unwrap();
    let o = sim.outcomes();
    assert!(o.iter().all(|o| o.status == Some(200)));
    for o in &o[..50] {
        assert!(
            o.dispatched_at.unwrap() < ms(25),
            "released by the queue message: {o:?}"
        );
    }
    for o in &o[51..] {
        let d = o.dispatched_at.unwrap();
        assert!(d > SEC && d < SEC + ms(10), "released by the tick: {o:?}");
    }
}

#[test]
fn callouts_are_routed_by_the_original_dst_header_and_time_out() {
    let mut sim = probe_sim(2, 7);
    sim.add_endpoint(
        "10.0.0.2:8000",
        Box::new(SimpleUpstream::new("10.0.0.2:8000").ttft(5 * SEC)),
    );
    sim.add_requests([
        RequestSpec::get("/callout-metrics").at(ms(10)),
        RequestSpec::get("/callout-slow").at(ms(10)),
        RequestSpec::get("/callout-dead").at(ms(10)),
    ]);
    sim.run().unwrap();
    let o = sim.outcomes();
    assert_eq!(o[0].header("x-callout-status"), Some("200"));
    assert!(
        o[0].text().contains("vllm:num_requests_running"),
        "{}",
        o[0].text()
    );
    assert_eq!(
        o[1].header("x-callout-status"),
        Some("504"),
        "{}",
        o[1].text()
    );
    let answered = o[1].finished_at.unwrap() - o[1].sent_at;
    assert!(
        answered > ms(100) && answered < ms(102),
        "timed out after 100 ms: {answered}"
    );
    assert_eq!(o[2].header("x-callout-status"), Some("503"));
    assert!(
        o[2].text().starts_with("upstream connect error"),
        "{}",
        o[2].text()
    );
}

#[test]
fn too_many_local_replies_in_one_callback_overflow_the_vm_like_v8() {
    for (parked, crashes) in [(250u64, 0usize), (320, 1)] {
        let mut sim = probe_sim(1, 8);
        sim.add_requests((0..parked).map(|i| RequestSpec::get("/park").at(ms(10) + i * US)));
        sim.add_requests([RequestSpec::get("/reply-all").at(ms(20))]);
        sim.run().unwrap();
        assert_eq!(
            sim.crashes().len(),
            crashes,
            "{parked} replies in one callback"
        );
        let answered = sim.outcomes()[..parked as usize]
            .iter()
            .filter(|o| o.status == Some(429))
            .count();
        assert_eq!(answered as u64, parked, "every reply is still sent");
        if crashes > 0 {
            assert!(sim.crashes()[0]
                .message
                .contains("Maximum call stack size exceeded"));
        }
    }
}

#[test]
fn a_buffered_body_is_seen_with_cumulative_sizes_and_a_final_end_of_stream_call() {
    let mut sim = probe_sim(1, 9);
    let body = vec![b'x'; 150 * 1024];
    sim.add_requests([RequestSpec::post("/body", body).at(ms(10))]);
    sim.run().unwrap();
    assert_eq!(sim.outcome(0).status, Some(200));
    // 64 KiB pieces, each callback seeing everything buffered so far, then the end of
    // stream again with the whole body (Envoy: false then true even for one packet).
    assert_eq!(
        list(&sim, "probe.bodies"),
        [
            "65536/65536/false",
            "131072/131072/false",
            "153600/153600/false",
            "153600/153600/true"
        ]
    );
}
