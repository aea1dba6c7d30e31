//! Choosing the endpoint(s) for one request and counting it in flight, as one decision
//! over the shared state (the proxy writes the headers and the metrics it returns).
//!
//! The pick and its in-flight count are one CAS on the ledger (`crate::inflight`): the
//! candidates get every worker's in-flight counts, the scheduler decides, and the primary
//! is counted in the same write, so two workers never both see an endpoint as idle. Then
//! the reference's `PreRequest` bookkeeping: the prefix index learns the pick (here at
//! once; on every other worker through the shared log, `crate::prefix::shared`), and
//! stateful scorers see the decision.
//!
//! Endpoints that passive health ejected (`crate::health`, recorded in the ledger) are
//! left out of the pick unless every candidate is.
//!
//! No endpoint chosen → [`Routed::None`] with the reason; `pool.failOpen` then sends the
//! request to any healthy endpoint ([`fail_open`]).

use crate::endpoint::Candidate;
use crate::health;
use crate::inflight;
use crate::latency::Estimate;
use crate::prefix::feedback::Expectation;
use crate::prefix::index::{PrefixIndex, PrefixMatch};
use crate::prefix::shared::{self, Cursor};
use crate::rng::Rng;
use crate::scheduler::{PluginSample, Probe, Request, ScheduleError, Scheduler};
use crate::shared_store::{SharedStore, StoreError};

/// What one routing decision needs besides the candidates.
pub struct Pick<'a> {
    /// The request as the scheduler sees it.
    pub request: Request<'a>,
    /// Its token estimate (counted in flight on the primary).
    pub tokens: u64,
    /// This VM's id (its ledger row and prefix-log entries).
    pub vm: u64,
    /// The seed of this decision's random choices.
    pub seed: u64,
    /// When routing this request started (ns, the `clock`'s): the e2e duration runs
    /// from here to the decision being counted.
    pub started_ns: u64,
    /// Whether to time each plugin (one decision in [`PLUGIN_TIMING_EVERY`]).
    pub time_plugins: bool,
}

/// Plugins are timed in one decision out of this many per VM: timing each plugin costs a
/// clock read per plugin and a histogram observation per plugin, more than most plugins
/// themselves. The sample is uniform, so the distribution of
/// `inference_extension_plugin_duration_seconds` is the same; its `_count` is about
/// 1/16 of the decisions.
pub const PLUGIN_TIMING_EVERY: u64 = 16;

/// Whether the `n`-th decision of a VM (from 0) times its plugins.
pub fn times_plugins(n: u64) -> bool {
    n.is_multiple_of(PLUGIN_TIMING_EVERY)
}

/// The decision.
#[derive(Debug, Clone, PartialEq)]
pub enum Routed {
    /// Endpoints chosen; the primary is counted in flight.
    Chosen {
        /// `x-gateway-destination-endpoint`: primary, then fallbacks.
        targets: Vec<String>,
        /// `x-prefiller-host-port`, when P/D chose a prefill endpoint.
        prefill: Option<String>,
        /// P/D decided to disaggregate (even if no prefill endpoint was found).
        disaggregated: bool,
        /// `x-encoder-hosts-ports`, when the encode stage chose endpoints (E/P/D).
        encoders: Vec<String>,
        /// The primary's prefix match, when prefix plugins are configured.
        hit: Option<PrefixMatch>,
        /// The primary's features and prediction, with a latency producer.
        estimate: Option<Estimate>,
        /// What the prefix index predicted on the primary, for cached-token feedback
        /// (`crate::prefix::feedback`; when the request has blocks and no P/D prefill).
        expected: Option<Box<Expectation>>,
    },
    /// `latency-slo-admitter` refused a sheddable request (nothing counted): 429.
    Shed {
        /// Why, naming the objectives.
        why: String,
    },
    /// Nothing was chosen (and nothing counted).
    None {
        /// Why, for the 503 body.
        why: String,
        /// The request's candidates, for fail-open.
        pool: Vec<String>,
    },
}

/// A decision with what it cost.
#[derive(Debug)]
pub struct Outcome {
    /// The decision.
    pub routed: Routed,
    /// Time per plugin (when a clock is given).
    pub samples: Vec<PluginSample>,
    /// Microseconds from the start to the decision being counted (the reference's
    /// scheduler e2e duration; the bookkeeping after it is not included).
    pub e2e_us: u64,
}

/// The seed of one decision: distinct per stream, VM and millisecond.
pub fn seed(ctx: u32, vm: u64, now_ms: i64) -> u64 {
    u64::from(ctx) ^ vm.rotate_left(32) ^ now_ms.unsigned_abs().rotate_left(17)
}

/// Chooses among `candidates` and counts the primary in flight, in one ledger CAS; then
/// teaches the prefix index the pick. `clock` (ns) measures plugins and the e2e time.
/// Fails only when the ledger cannot be updated.
pub fn route(
    store: &impl SharedStore,
    scheduler: &Scheduler,
    pick: &Pick<'_>,
    candidates: &mut [Candidate],
    index: &mut PrefixIndex,
    cursor: &mut Cursor,
    clock: &dyn Fn() -> u64,
) -> Result<Outcome, StoreError> {
    let (decision, samples) =
        inflight::acquire_with(store, pick.vm, pick.request.now_ms, |ledger| {
            let loads = ledger.loads();
            for c in candidates.iter_mut() {
                let l = loads.get(c.key()).copied().unwrap_or_default();
                c.in_flight = l.requests;
                c.in_flight_tokens = l.tokens;
                c.prefilling = l.prefilling;
                c.prefill_tokens = l.prefill_tokens;
            }
            // Passive health: ejected endpoints at the end, out of this pick (unless
            // all are); the decision's indices stay positions in `candidates`.
            let live = health::partition(candidates, &ledger.health, pick.request.now_ms);
            let eligible = candidates.get_mut(..live).unwrap_or_default();
            let mut rng = Rng::new(pick.seed);
            let mut probe = Probe::new(pick.time_plugins.then_some(clock));
            let decision = scheduler.schedule(&pick.request, eligible, index, &mut rng, &mut probe);
            // With a latency producer the first response chunk is reported, so the
            // request counts as prefill queued there until then.
            let counted = decision.as_ref().ok().and_then(|d| {
                let i = d.primary()?;
                let c = candidates.get(i)?;
                let prefill = scheduler.latency.as_ref().map(|_| {
                    d.estimates
                        .get(i)
                        .map_or(0, |e| crate::latency::features::uncached_tokens(&e.x))
                });
                Some(inflight::Counted {
                    prefill,
                    ..inflight::Counted::new(c.key(), pick.tokens)
                })
            });
            (counted, (decision, probe.samples))
        })?;
    let e2e_us = clock().saturating_sub(pick.started_ns) / 1_000;
    let routed = match decision {
        Ok(d) => {
            let expected = expectation(scheduler, pick, candidates, index, &d);
            for i in [d.primary(), d.prefill].into_iter().flatten() {
                if let Some(c) = candidates.get(i) {
                    let cap = scheduler.lru_capacity(c);
                    index.insert(
                        &c.address,
                        &d.hashes,
                        usize::try_from(cap).unwrap_or(usize::MAX),
                    );
                    let (speculative, speculative_until_ms) = match &scheduler.precise {
                        Some(p) => (
                            index.precise.speculate(
                                p,
                                &c.address,
                                &d.precise_keys,
                                pick.request.now_ms,
                            ),
                            p.speculation_end(pick.request.now_ms),
                        ),
                        None => (Vec::new(), 0),
                    };
                    let picked = shared::Picked {
                        hashes: &d.hashes,
                        speculative: &speculative,
                        speculative_until_ms,
                    };
                    if !d.hashes.is_empty() || !speculative.is_empty() {
                        match shared::publish(store, pick.vm, &c.address, picked, cap) {
                            Ok(seq) => cursor.published(seq),
                            Err(e) => log::debug!("prefix log publish failed: {e:?}"),
                        }
                    }
                }
            }
            scheduler.pre_request(&pick.request, candidates, &d);
            let address = |i: usize| candidates.get(i).map(|c| c.address.clone());
            Routed::Chosen {
                targets: d.targets.iter().filter_map(|&i| address(i)).collect(),
                prefill: d.prefill.and_then(address),
                disaggregated: d.disaggregated,
                encoders: d.encoders.iter().filter_map(|&i| address(i)).collect(),
                hit: d.primary().and_then(|i| d.prefix.get(i).copied()),
                estimate: d.primary().and_then(|i| d.estimates.get(i).cloned()),
                expected: expected.map(Box::new),
            }
        }
        Err(e @ (ScheduleError::SloUnattainable { .. } | ScheduleError::Shed { .. })) => {
            Routed::Shed { why: e.to_string() }
        }
        Err(e) => Routed::None {
            why: e.to_string(),
            pool: candidates.iter().map(|c| c.address.clone()).collect(),
        },
    };
    Ok(Outcome {
        routed,
        samples,
        e2e_us,
    })
}

/// What the index predicts for the decision's primary, before the pick refreshes it.
fn expectation(
    scheduler: &Scheduler,
    pick: &Pick<'_>,
    candidates: &[Candidate],
    index: &PrefixIndex,
    d: &crate::scheduler::Decision,
) -> Option<Expectation> {
    // With P/D the decode server's report counts the prefill's transferred blocks.
    let correct = scheduler.prefix.as_ref()?.feedback;
    if d.hashes.is_empty() || d.prefill.is_some() {
        return None;
    }
    let i = d.primary()?;
    let c = candidates.get(i)?;
    let matched = d.prefix.get(i).map_or(0, |m| m.matched);
    let credited = d.hashes.get(..matched as usize).unwrap_or_default();
    Some(Expectation {
        endpoint: c.address.clone(),
        hashes: d.hashes.clone(),
        matched,
        stamps: index.stamps(&c.address, credited),
        clock: index.clock(&c.address),
        unsettled: c.in_flight.saturating_mul(d.hashes.len() as u64),
        block_chars: u64::from(d.block_size_tokens) * crate::prefix::CHARS_PER_TOKEN,
        prompt_chars: u64::try_from(pick.request.prompt.len()).unwrap_or(u64::MAX),
        ceiling: scheduler.lru_capacity(c),
        correct,
    })
}

/// `pool.failOpen`: one of `pool` at random (by `seed`), counted in flight. `None` when
/// `pool` is empty or the ledger cannot be updated.
pub fn fail_open(
    store: &impl SharedStore,
    vm: u64,
    pool: &[String],
    seed: u64,
    tokens: u64,
    now_ms: i64,
) -> Option<String> {
    let mut rng = Rng::new(seed);
    let pick = pool.get(rng.below(pool.len()))?.clone();
    let key = inflight::endpoint_key(&pick);
    inflight::acquire_with(store, vm, now_ms, |_| {
        (Some(inflight::Counted::new(key, tokens)), ())
    })
    .ok()?;
    Some(pick)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared_store::MemoryStore;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn candidates(n: usize) -> Vec<Candidate> {
        (1..=n)
            .map(|i| Candidate::new(&format!("10.0.0.{i}:8000")))
            .collect()
    }

    /// Requests in flight per endpoint of `10.0.0.1:8000` .. `10.0.0.9:8000` (where
    /// any).
    fn in_flight(store: &MemoryStore) -> Vec<(String, u64)> {
        let ledger = crate::inflight::read(store).unwrap();
        (1..=9)
            .map(|i| format!("10.0.0.{i}:8000"))
            .map(|a| (ledger.in_flight(&a), a))
            .filter(|(n, _)| *n > 0)
            .map(|(n, a)| (a, n))
            .collect()
    }

    fn request(prompt: &str) -> Request<'_> {
        Request {
            model: "m",
            prompt,
            now_ms: 1_000,
            ..Request::default()
        }
    }

    fn pick_once(
        store: &MemoryStore,
        scheduler: &Scheduler,
        index: &mut PrefixIndex,
        vm: u64,
        prompt: &str,
        cands: &mut [Candidate],
    ) -> Routed {
        let pick = Pick {
            request: request(prompt),
            tokens: 10,
            vm,
            seed: 7,
            started_ns: 0,
            time_plugins: true,
        };
        let mut cursor = Cursor::default();
        route(store, scheduler, &pick, cands, index, &mut cursor, &|| 0)
            .unwrap()
            .routed
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_pick_is_counted_in_flight_and_the_next_pick_sees_it() {
        let store = MemoryStore::default();
        let rt = crate::runtime::load("").unwrap();
        let mut index = PrefixIndex::new();
        let mut cands = candidates(2);
        let first = pick_once(&store, &rt.scheduler, &mut index, 1, "", &mut cands);
        let Routed::Chosen { targets, .. } = first else {
            panic!("nothing chosen: {first:?}");
        };
        assert_eq!(in_flight(&store), vec![(targets[0].clone(), 1)]);
        // Another worker (VM 2) picks next: it sees the first request in flight and
        // takes the other endpoint.
        let second = pick_once(&store, &rt.scheduler, &mut index, 2, "", &mut cands);
        let Routed::Chosen { targets: t2, .. } = second else {
            panic!("nothing chosen: {second:?}");
        };
        assert_ne!(t2[0], targets[0]);
        assert_eq!(in_flight(&store).len(), 2);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn an_ejected_endpoint_gets_no_pick_until_its_ejection_ends() {
        let store = MemoryStore::default();
        let rt = crate::runtime::load("").unwrap();
        let policy = &rt.pool.passive_health;
        let mut index = PrefixIndex::new();
        let mut cands = candidates(2);
        let bad = "10.0.0.1:8000";
        // Five failures reported with their releases (any worker) eject it for 1 s.
        let mut ejections = Vec::new();
        for _ in 0..policy.consecutive_failures {
            crate::inflight::acquire_with(&store, 1, 900, |_| {
                (
                    Some(crate::inflight::Counted::new(
                        crate::inflight::endpoint_key(bad),
                        0,
                    )),
                    (),
                )
            })
            .unwrap();
            let failed = Some((crate::health::Outcome::Failure, policy));
            ejections.push(crate::inflight::release(&store, 1, bad, 0, 900, failed).unwrap());
        }
        assert_eq!(ejections, [None, None, None, None, Some(1_000)]);
        for vm in 1..=4 {
            let Routed::Chosen { targets, .. } =
                pick_once(&store, &rt.scheduler, &mut index, vm, "", &mut cands)
            else {
                panic!("nothing chosen");
            };
            assert_eq!(targets[0], "10.0.0.2:8000");
        }
        // At 1 900 ms the ejection is over: the idle endpoint wins again.
        let pick = Pick {
            request: Request {
                now_ms: 1_900,
                ..request("")
            },
            tokens: 0,
            vm: 1,
            seed: 7,
            started_ns: 0,
            time_plugins: false,
        };
        let routed = route(
            &store,
            &rt.scheduler,
            &pick,
            &mut cands,
            &mut index,
            &mut Cursor::default(),
            &|| 0,
        )
        .unwrap()
        .routed;
        let Routed::Chosen { targets, .. } = routed else {
            panic!("nothing chosen");
        };
        assert_eq!(targets[0], bad);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn no_candidate_is_a_reasoned_refusal_and_nothing_is_counted() {
        let store = MemoryStore::default();
        let rt = crate::runtime::load("").unwrap();
        let mut index = PrefixIndex::new();
        let routed = pick_once(&store, &rt.scheduler, &mut index, 1, "", &mut []);
        assert!(matches!(routed, Routed::None { ref pool, .. } if pool.is_empty()));
        assert!(in_flight(&store).is_empty());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_prefix_index_learns_the_pick_here_and_in_the_shared_log() {
        let store = MemoryStore::default();
        let rt = crate::runtime::load("").unwrap();
        let mut index = PrefixIndex::new();
        let mut cands = candidates(3);
        let prompt = "a long shared system prompt ".repeat(40);
        let first = pick_once(&store, &rt.scheduler, &mut index, 1, &prompt, &mut cands);
        assert!(matches!(first, Routed::Chosen { .. }), "{first:?}");
        // Another VM's index, synced from the shared log, matches the same endpoint.
        let mut other = PrefixIndex::new();
        let mut cursor = Cursor::default();
        assert!(shared::sync(&store, 2, &mut other, &mut cursor).unwrap() > 0);
        let Routed::Chosen { hit, .. } =
            pick_once(&store, &rt.scheduler, &mut other, 2, &prompt, &mut cands)
        else {
            panic!("nothing chosen");
        };
        assert!(hit.is_some_and(|m| m.matched > 0), "{hit:?}");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_pick_says_what_the_index_credited_its_primary_with() {
        let store = MemoryStore::default();
        let rt = crate::runtime::load("").unwrap();
        let mut index = PrefixIndex::new();
        let mut cands = candidates(2);
        let prompt = "a long shared system prompt ".repeat(40);
        let expected = |r: Routed| match r {
            Routed::Chosen {
                expected, targets, ..
            } => (expected.unwrap(), targets[0].clone()),
            other => panic!("{other:?}"),
        };
        let (first, at) = expected(pick_once(
            &store,
            &rt.scheduler,
            &mut index,
            1,
            &prompt,
            &mut cands,
        ));
        assert_eq!((first.matched, first.stamps.len()), (0, 0));
        assert_eq!(first.endpoint, at);
        assert_eq!(first.prompt_chars, prompt.len() as u64);
        assert_eq!(first.block_chars, 64);
        let (second, at2) = expected(pick_once(
            &store,
            &rt.scheduler,
            &mut index,
            1,
            &prompt,
            &mut cands,
        ));
        assert_eq!(at2, at, "the prefix holder");
        assert_eq!(second.matched as usize, second.hashes.len());
        assert_eq!(second.stamps.len(), second.hashes.len());
        // Off: compared and counted, not corrected.
        let off = crate::runtime::load(
            r#"{"plugins":[{"type":"approx-prefix-cache-producer","parameters":{"cachedTokensFeedback":false}},{"type":"prefix-cache-scorer"}],"schedulingProfiles":[{"name":"default","plugins":[{"pluginRef":"prefix-cache-scorer"}]}]}"#,
        )
        .unwrap();
        let Routed::Chosen { expected, .. } =
            pick_once(&store, &off.scheduler, &mut index, 1, &prompt, &mut cands)
        else {
            panic!("nothing chosen");
        };
        assert!(!expected.unwrap().correct);
    }

    /// `precise-prefix-cache-scorer` with speculative entries on or off.
    fn precise(speculative: bool) -> crate::runtime::Runtime {
        crate::runtime::load(
            &serde_json::json!({
                "plugins": [
                    {"type": "precise-prefix-cache-scorer",
                     "parameters": {"speculativeIndexing": speculative}},
                    {"type": "max-score-picker"}
                ],
                "schedulingProfiles": [{"name": "default", "plugins": [
                    {"pluginRef": "precise-prefix-cache-scorer"}, {"pluginRef": "max-score-picker"}
                ]}]
            })
            .to_string(),
        )
        .unwrap()
    }

    /// A relay answer: every candidate known with `blockSize` 16, holding `held` on the
    /// first (`full`: a snapshot, else the changes since version 1, removing `removed`).
    fn relay(cands: &[Candidate], full: bool, held: &[u64], removed: &[u64]) -> String {
        let servers: Vec<_> = cands
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let (add, remove) = if i == 0 {
                    (held, removed)
                } else {
                    (&[][..], &[][..])
                };
                serde_json::json!({"endpoint": c.address, "blockSize": 16, "stale": false,
                                   "clear": full, "add": add, "remove": remove})
            })
            .collect();
        serde_json::json!({"epoch": 1, "version": if full { 1 } else { 2 }, "full": full,
                           "servers": servers})
        .to_string()
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_pick_is_credited_speculatively_on_every_worker_until_the_relay_reports_the_block() {
        let prompt = "abcd".repeat(64); // 4 blocks of 16 vllm-sim tokens
        let keys = crate::prefix::precise::keys(
            "m",
            &crate::prefix::sim_tokens::encode(&prompt, usize::MAX),
            16,
            256,
        );
        let hit = |r: Routed| match r {
            Routed::Chosen { hit, targets, .. } => (targets[0].clone(), hit.unwrap().matched),
            other => panic!("{other:?}"),
        };
        for speculative in [true, false] {
            let rt = precise(speculative);
            let cfg = rt.scheduler.precise.clone().unwrap();
            let store = MemoryStore::default();
            let mut cands = candidates(3);
            let snapshot = relay(&cands, true, &[], &[]);
            let (mut one, mut two) = (PrefixIndex::new(), PrefixIndex::new());
            for ix in [&mut one, &mut two] {
                ix.precise.apply(snapshot.as_bytes(), 1_000, &cfg).unwrap();
            }
            // Worker 1 routes the prompt: no server reports it yet.
            let (first, matched) = hit(pick_once(
                &store,
                &rt.scheduler,
                &mut one,
                1,
                &prompt,
                &mut cands,
            ));
            assert_eq!(matched, 0);
            // Worker 2, before the relay reports anything, learns the pick from the log.
            shared::sync(&store, 2, &mut two, &mut Cursor::default()).unwrap();
            let (second, matched) = hit(pick_once(
                &store,
                &rt.scheduler,
                &mut two,
                2,
                &prompt,
                &mut cands,
            ));
            if !speculative {
                assert_eq!(matched, 0, "off: nothing credited before the relay reports");
                continue;
            }
            assert_eq!((second.as_str(), matched), (first.as_str(), 4));
            // Still credited on worker 1 at the end of the TTL, not after.
            let at = |ix: &PrefixIndex, now: i64| {
                let (m, _) =
                    ix.precise
                        .matches(&cfg, "m", &prompt, [first.as_str()].into_iter(), now);
                m[0].unwrap().matched
            };
            assert_eq!(at(&one, 1_000 + 2_000), 4);
            assert_eq!(at(&one, 1_000 + 2_001), 0);
            // The relay reports the first block evicted there: the credit ends at once.
            let i = cands.iter().position(|c| c.address == first).unwrap();
            cands.swap(0, i);
            let evicted = relay(&cands, false, &[], &keys[..1]);
            two.precise.apply(evicted.as_bytes(), 1_100, &cfg).unwrap();
            assert_eq!(at(&two, 1_100), 0);
            // The relay confirms the blocks: they are its own from then on.
            let stored = relay(&cands, false, &keys, &[]);
            one.precise.apply(stored.as_bytes(), 1_100, &cfg).unwrap();
            assert!(one.precise.speculative.is_empty());
            assert_eq!(at(&one, 1_000 + 3_000), 4);
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn fail_open_counts_its_pick() {
        let store = MemoryStore::default();
        let pool = vec!["10.0.0.9:8000".to_string()];
        assert_eq!(
            fail_open(&store, 1, &pool, 3, 5, 1_000).as_deref(),
            Some("10.0.0.9:8000")
        );
        assert_eq!(in_flight(&store), vec![("10.0.0.9:8000".to_string(), 1)]);
        assert_eq!(fail_open(&store, 1, &[], 3, 5, 1_000), None);
    }
}
