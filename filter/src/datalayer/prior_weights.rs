//! The rendezvous prior's load weights, computed by the scraper and published with the
//! snapshots (`crate::prefix::rendezvous`).
//!
//! With plain rendezvous hashing every server owns chance's share of the prompt groups
//! (the busiest owner of 16 holds up to twice the mean), and with several gateway
//! replicas each replica sees a group too rarely to learn to move it. A weight below 1
//! makes a server own fewer groups: weighted rendezvous moves only the groups that the
//! weight change must move, and every replica moves the same ones if it reads the same
//! weights.
//!
//! The signal is slow and common to all replicas: each endpoint's `running + waiting`,
//! as scraped (the whole server's load, whoever sent it), averaged over
//! [`AVERAGE_MS`]. The weight is a slow integral controller toward equal load: while an
//! endpoint's average is more than [`DEADBAND`] above the pool's mean (both plus one
//! request, so that an idle pool reads as balanced), its weight falls; while it is more
//! than that below, its weight rises back, in both cases by the log of the ratio (beyond
//! the band) per [`CONTROL_MS`], clamped to `[MIN_WEIGHT, 1]`. An integrator, not a
//! weight proportional to the ratio: moving groups away lowers the load that lowered the
//! weight, so a proportional weight would bring them back; the integrator holds the
//! weight where the load is even. Inside the band the weight drifts slowly back to full
//! ([`RECOVER_MS`]), so that a pool whose loads have evened out for good returns to plain
//! rendezvous (a server whose load then rises again loses weight again). It is
//! published quantized to [`STEPS`] of the full weight, so replicas that scrape at
//! different instants publish exactly the same weight except near a step's edge.
//!
//! Near capacity the weights hold still: while the pool's mean `waiting` per endpoint
//! (each averaged over the same [`AVERAGE_MS`]) is above [`NEAR_CAPACITY_WAITING`], no
//! weight moves, neither down nor back up. Moving a group costs a miss on its new server
//! (and a split while the replicas' learned indexes disagree), and near capacity every
//! miss's prefill queues behind others, so the moves cost more than the evened load wins
//! (BENCHMARKS.md §10). Requests waiting at a server are the sign that it is full
//! (vLLM queues only beyond its concurrency or its KV cache), every replica scrapes the
//! same counts, and it needs no configured concurrency.

use super::snapshot::EndpointSnapshot;
use hashbrown::HashMap;

/// Averaging time of each endpoint's load (ms; an exponential moving average).
pub const AVERAGE_MS: f64 = 4_000.0;
/// Time for the weight to change by a factor e at a load ratio of e beyond the dead band.
pub const CONTROL_MS: f64 = 8_000.0;
/// Load ratios within `1 ± DEADBAND` of the mean let the weight drift back to full,
/// by a factor e per [`RECOVER_MS`].
pub const DEADBAND: f64 = 0.2;
/// Drift back to the full weight inside the dead band (see [`DEADBAND`]).
pub const RECOVER_MS: f64 = 60_000.0;
/// The lowest weight: a server keeps at least about a quarter of its groups.
pub const MIN_WEIGHT: f64 = 0.25;
/// Published weights are multiples of `1 / STEPS`.
pub const STEPS: f64 = 16.0;
/// The pool's mean `waiting` per endpoint (averaged) above which the weights hold still.
pub const NEAR_CAPACITY_WAITING: f64 = 0.25;
/// The full weight as published ([`EndpointSnapshot::prior_weight`]).
pub const FULL: u16 = crate::prefix::rendezvous::FULL_WEIGHT;

/// One endpoint's controller state.
#[derive(Debug, Clone, Copy)]
struct State {
    /// Average `running + waiting`.
    load: f64,
    /// Average `waiting`.
    waiting: f64,
    /// ln of the weight, in `[ln MIN_WEIGHT, 0]`.
    log_weight: f64,
}

/// The weights of the endpoints the scraper publishes, kept between rounds.
#[derive(Debug, Default)]
pub struct PriorWeights {
    state: HashMap<String, State>,
    last_ms: Option<i64>,
}

impl PriorWeights {
    /// Advances the controller to `now_ms` with the endpoints' latest scrapes and sets
    /// each one's [`EndpointSnapshot::prior_weight`]. Endpoints failing or never scraped
    /// keep the full weight and stay out of the mean; endpoints no longer listed are
    /// forgotten.
    pub fn update(&mut self, now_ms: i64, endpoints: &mut [EndpointSnapshot]) {
        let dt = self
            .last_ms
            .map_or(0.0, |t| now_ms.saturating_sub(t).max(0) as f64);
        self.last_ms = Some(now_ms);
        self.state
            .retain(|a, _| endpoints.iter().any(|e| &e.address == a));
        let alpha = 1.0 - (-dt / AVERAGE_MS).exp();
        let (mut sum, mut sum_waiting, mut n) = (0.0, 0.0, 0.0);
        for e in endpoints.iter() {
            if e.failing || e.updated_ms == 0 {
                continue;
            }
            let load = e.running.saturating_add(e.waiting) as f64;
            let waiting = e.waiting as f64;
            let s = match self.state.get_mut(e.address.as_str()) {
                Some(s) => {
                    s.load += alpha * (load - s.load);
                    s.waiting += alpha * (waiting - s.waiting);
                    *s
                }
                None => {
                    let fresh = State {
                        load,
                        waiting,
                        log_weight: 0.0,
                    };
                    self.state.insert(e.address.clone(), fresh);
                    fresh
                }
            };
            sum += s.load;
            sum_waiting += s.waiting;
            n += 1.0;
        }
        let mean = if n > 0.0 { sum / n } else { 0.0 };
        let near_capacity = n > 0.0 && sum_waiting / n > NEAR_CAPACITY_WAITING;
        let step = dt / CONTROL_MS;
        let band = (1.0 + DEADBAND).ln();
        for e in endpoints.iter_mut() {
            let live = !e.failing && e.updated_ms != 0;
            let s = self.state.get_mut(e.address.as_str()).filter(|_| live);
            e.prior_weight = match s {
                Some(s) => {
                    let error = ((s.load + 1.0) / (mean + 1.0)).ln();
                    let beyond = error.signum() * (error.abs() - band).max(0.0);
                    let change = if near_capacity {
                        0.0
                    } else if beyond == 0.0 {
                        dt / RECOVER_MS
                    } else {
                        -step * beyond
                    };
                    s.log_weight = (s.log_weight + change).clamp(MIN_WEIGHT.ln(), 0.0);
                    publish(s.log_weight.exp())
                }
                None => FULL,
            };
        }
    }
}

/// `weight` (0..=1) quantized to [`STEPS`], in 1/[`FULL`] of the full weight.
pub fn publish(weight: f64) -> u16 {
    let q = (weight.clamp(MIN_WEIGHT, 1.0) * STEPS).round() / STEPS;
    (q * f64::from(FULL)).round() as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn pool(loads: &[u64]) -> Vec<EndpointSnapshot> {
        loads
            .iter()
            .enumerate()
            .map(|(i, &l)| EndpointSnapshot {
                address: format!("10.0.0.{i}:8000"),
                running: l.min(8),
                waiting: l.saturating_sub(8),
                updated_ms: 1,
                ..EndpointSnapshot::default()
            })
            .collect()
    }

    /// Runs the controller every 50 ms for `seconds` on loads given by `load(i, t_ms)`;
    /// the last weights.
    fn run(
        w: &mut PriorWeights,
        n: usize,
        from_ms: i64,
        seconds: i64,
        load: impl Fn(usize, i64) -> u64,
    ) -> Vec<u16> {
        let mut eps = pool(&vec![0; n]);
        for t in (from_ms..from_ms + seconds * 1_000).step_by(50) {
            for (i, e) in eps.iter_mut().enumerate() {
                let l = load(i, t);
                (e.running, e.waiting) = (l.min(8), l.saturating_sub(8));
            }
            w.update(t, &mut eps);
        }
        eps.iter().map(|e| e.prior_weight).collect()
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn an_evenly_loaded_or_idle_pool_keeps_every_weight_full() {
        for level in [0, 1, 3, 8, 20] {
            let mut w = PriorWeights::default();
            // Loads that differ by a request between servers and over time.
            let got = run(&mut w, 16, 0, 60, |i, t| {
                level + ((i as i64 + t / 500) % 2) as u64
            });
            assert!(got.iter().all(|&q| q == FULL), "level {level}: {got:?}");
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_persistently_busier_server_loses_weight_slowly_down_to_the_floor() {
        let mut w = PriorWeights::default();
        let busy = |i: usize, _| if i == 0 { 12 } else { 2 };
        // Not at once: after a second it has lost at most a quarter.
        let early = run(&mut w, 16, 0, 1, busy);
        assert!(early[0] >= FULL * 3 / 4, "{early:?}");
        let later = run(&mut w, 16, 1_000, 60, busy);
        assert_eq!(later[0], publish(MIN_WEIGHT), "{later:?}");
        assert!(later[1..].iter().all(|&q| q == FULL), "{later:?}");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_weight_settles_where_the_load_evens_out_and_recovers_when_it_goes() {
        // A server whose load follows its weight (groups moved away take their load
        // along): 8 requests at full weight, the others 4. The integrator stops where
        // its load is within the dead band of the mean (a weight near 0.6), and stays.
        let mut w = PriorWeights::default();
        let weight_now = std::cell::Cell::new(1.0f64);
        let mut eps = pool(&[0; 16]);
        let mut history = Vec::new();
        for t in (0..120_000i64).step_by(50) {
            for (i, e) in eps.iter_mut().enumerate() {
                e.running = if i == 0 {
                    (8.0 * weight_now.get()).round() as u64
                } else {
                    4
                };
            }
            w.update(t, &mut eps);
            weight_now.set(f64::from(eps[0].prior_weight) / f64::from(FULL));
            history.push(eps[0].prior_weight);
        }
        let settled = &history[history.len() - 600..]; // the last 30 s
        let (lo, hi) = (
            settled.iter().min().copied().unwrap_or(0),
            settled.iter().max().copied().unwrap_or(0),
        );
        assert!(hi < FULL && lo > publish(MIN_WEIGHT), "{lo}..{hi}");
        assert!(hi - lo <= 64, "it settles within a step: {lo}..{hi}");
        // The extra load gone, the weight climbs back to full.
        let back = run(&mut w, 16, 120_000, 60, |_, _| 4);
        assert!(back.iter().all(|&q| q == FULL), "{back:?}");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn two_scrapers_at_different_instants_publish_the_same_weights() {
        // Two replicas' scrapers see the same noisy loads, sampled 20 ms apart.
        let load = |i: usize, t: i64| {
            let noise = ((t / 130 + i as i64 * 7) % 3) as u64;
            if i < 2 {
                9 + noise
            } else {
                2 + noise
            }
        };
        let (mut a, mut b) = (PriorWeights::default(), PriorWeights::default());
        let mut agree = 0;
        let mut rounds = 0;
        let mut eps_a = pool(&[0; 16]);
        let mut eps_b = pool(&[0; 16]);
        for t in (0..60_000i64).step_by(50) {
            for (i, (ea, eb)) in eps_a.iter_mut().zip(eps_b.iter_mut()).enumerate() {
                ea.running = load(i, t);
                eb.running = load(i, t + 20);
            }
            a.update(t, &mut eps_a);
            b.update(t + 20, &mut eps_b);
            if t >= 20_000 {
                rounds += 1;
                agree += usize::from(
                    eps_a
                        .iter()
                        .zip(&eps_b)
                        .all(|(x, y)| x.prior_weight == y.prior_weight),
                );
            }
        }
        assert!(eps_a[0].prior_weight < FULL, "the busy servers lose weight");
        assert!(
            agree * 100 >= rounds * 95,
            "identical weights in {agree} of {rounds} rounds"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_pool_near_capacity_holds_the_weights_where_they_are() {
        // `pool` puts a server's load beyond 8 in `waiting`: one server at 12, the rest
        // at 10, so every server has requests waiting (the mean is 2.1 per server).
        let mut w = PriorWeights::default();
        let full = run(&mut w, 16, 0, 60, |i, _| if i == 0 { 14 } else { 10 });
        assert!(full.iter().all(|&q| q == FULL), "nothing moves: {full:?}");
        // Lowered below capacity, a weight stays where it is once the pool fills up,
        // neither falling further nor drifting back while the queue lasts.
        let mut w = PriorWeights::default();
        let lowered = run(&mut w, 16, 0, 6, |i, _| if i == 0 { 7 } else { 2 });
        assert!(lowered[0] < FULL, "{lowered:?}");
        // (The first second: the averaged queue builds up past the threshold.)
        let busy = |i: usize, _| if i == 0 { 20 } else { 10 };
        let start = run(&mut w, 16, 6_000, 1, busy);
        let held = run(&mut w, 16, 7_000, 60, busy);
        assert_eq!(held[0], start[0], "{held:?}");
        assert!(held[0] > publish(MIN_WEIGHT), "{held:?}");
        assert!(held[1..].iter().all(|&q| q == FULL), "{held:?}");
        // The queue gone, the controller works as before.
        let after = run(&mut w, 16, 67_000, 60, |i, _| if i == 0 { 7 } else { 2 });
        assert_eq!(after[0], publish(MIN_WEIGHT), "{after:?}");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_short_queue_below_the_threshold_does_not_hold_the_weights() {
        // Only the busy server queues (1 waiting: a mean of 1/16 per server).
        let mut w = PriorWeights::default();
        let got = run(&mut w, 16, 0, 60, |i, _| if i == 0 { 9 } else { 2 });
        assert_eq!(got[0], publish(MIN_WEIGHT), "{got:?}");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn failing_never_scraped_and_departed_endpoints_count_for_nothing() {
        let mut w = PriorWeights::default();
        let mut eps = pool(&[30, 2, 2, 2]);
        eps[0].failing = true;
        eps[1].updated_ms = 0;
        for t in (0..30_000).step_by(50) {
            w.update(t, &mut eps);
        }
        assert!(eps.iter().all(|e| e.prior_weight == FULL));
        eps.truncate(2);
        w.update(30_050, &mut eps);
        assert_eq!(w.state.len(), 0, "neither is tracked");
        assert_eq!(publish(0.0), publish(MIN_WEIGHT));
        assert_eq!(publish(0.52), 512, "quantized to sixteenths");
    }
}
