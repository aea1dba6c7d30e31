//! `--trace`: where each class's requests and misses went and what the filter predicted
//! for them. The predictions are read from the filter's own shared record of running
//! SLO requests (`epp.v1.latency.running`: endpoint, dispatch time, the TTFT and TPOT
//! predicted at the pick), polled every [`POLL`] of virtual time while the load runs,
//! and joined to the outcomes by endpoint and dispatch millisecond. A request that ended
//! before a VM's tick published it has no prediction in the trace.

use super::{observed, CLASSES};
use epp_filter::latency::running::{RunningSlos, RUNNING_KEY};
use host_sim::world::clock::EPOCH_NANOS;
use host_sim::{Nanos, Outcome, Sim, MS};
use prost::Message;
use std::collections::HashMap;

/// How often the running record is read.
const POLL: Nanos = 50 * MS;

/// The predictions seen, by (endpoint, dispatch ms): (TTFT, TPOT) predicted.
#[derive(Default)]
pub struct Recorder {
    seen: HashMap<(String, i64), (f64, f64)>,
}

impl Recorder {
    /// Runs `sim` to `end`, reading the running record every [`POLL`].
    pub fn run_until(&mut self, sim: &mut Sim, end: Nanos) -> anyhow::Result<()> {
        let mut t = sim.now();
        while t < end {
            t = (t + POLL).min(end);
            sim.run_until(t)?;
            let Some(bytes) = sim.shared_data(RUNNING_KEY) else {
                continue;
            };
            let Ok(record) = RunningSlos::decode(bytes.as_slice()) else {
                continue;
            };
            for e in record.rows.iter().flat_map(|r| &r.entries) {
                self.seen
                    .entry((e.endpoint.clone(), e.started_ms))
                    .or_insert((e.predicted_ttft_ms, e.predicted_tpot_ms));
            }
        }
        Ok(())
    }

    fn prediction(&self, o: &Outcome) -> Option<(f64, f64)> {
        let ep = o.endpoint.as_deref()?;
        // The filter's clock is the virtual time as wall-clock time.
        let ms = ((EPOCH_NANOS + o.dispatched_at?) / MS) as i64;
        [ms, ms - 1, ms + 1]
            .iter()
            .find_map(|m| self.seen.get(&(ep.to_string(), *m)).copied())
    }

    /// Prints, per class of the measured window (labels `m<class>`): the share of its
    /// requests and of its misses per server speed; its misses by arrival phase and
    /// cause; the predictions made for the misses against what happened.
    pub fn report(
        &self,
        side: &str,
        sim: &Sim,
        eps: &[String],
        speeds: &[f64],
        measure_from: Nanos,
        high: &dyn Fn(Nanos) -> bool,
    ) {
        let speed: HashMap<&str, f64> = eps
            .iter()
            .map(String::as_str)
            .zip(speeds.iter().copied())
            .collect();
        println!("- {side}:");
        for (c, class) in CLASSES.iter().take(2).enumerate() {
            let label = format!("m{c}");
            let os: Vec<&Outcome> = sim.outcomes().iter().filter(|o| o.label == label).collect();
            if os.is_empty() {
                continue;
            }
            let mut by_speed: Vec<(f64, usize, usize)> = Vec::new();
            let (mut in_high, mut sent_high) = (0usize, 0usize);
            let (mut ttft_miss, mut tpot_miss, mut failed) = (0usize, 0usize, 0usize);
            let mut predicted_to_meet = 0usize;
            let mut with_prediction = 0usize;
            let mut misses = 0usize;
            let mut pred_vs_obs: Vec<(f64, f64, f64, f64)> = Vec::new();
            for o in &os {
                let f = o
                    .endpoint
                    .as_deref()
                    .and_then(|e| speed.get(e).copied())
                    .unwrap_or(0.0);
                let slot = match by_speed.iter_mut().find(|s| (s.0 - f).abs() < 1e-9) {
                    Some(s) => s,
                    None => {
                        by_speed.push((f, 0, 0));
                        let last = by_speed.len() - 1;
                        &mut by_speed[last]
                    }
                };
                slot.1 += 1;
                let phase_high = high(o.sent_at.max(measure_from));
                sent_high += usize::from(phase_high);
                let obs = observed(o);
                let met = obs.is_some_and(|(t, p)| t <= class.ttft && p <= class.tpot);
                if met {
                    continue;
                }
                misses += 1;
                slot.2 += 1;
                in_high += usize::from(phase_high);
                match obs {
                    None => failed += 1,
                    Some((t, p)) => {
                        ttft_miss += usize::from(t > class.ttft);
                        tpot_miss += usize::from(p > class.tpot);
                        if let Some((pt, pp)) = self.prediction(o) {
                            with_prediction += 1;
                            predicted_to_meet += usize::from(pt <= class.ttft && pp <= class.tpot);
                            pred_vs_obs.push((pt, t, pp, p));
                        }
                    }
                }
            }
            by_speed.sort_by(|a, b| a.0.total_cmp(&b.0));
            let total = os.len();
            let spread: Vec<String> = by_speed
                .iter()
                .map(|(f, n, m)| {
                    format!(
                        "{f:.2}×: {:.0} % of sent, {:.0} % of misses",
                        100.0 * *n as f64 / total as f64,
                        100.0 * *m as f64 / misses.max(1) as f64
                    )
                })
                .collect();
            let med = |k: fn(&(f64, f64, f64, f64)) -> f64| {
                let mut v: Vec<f64> = pred_vs_obs.iter().map(k).collect();
                v.sort_by(f64::total_cmp);
                v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
            };
            println!(
                "  - {}: {misses} of {total} missed; by server speed: {}; {in_high} misses in high phases \
                 ({sent_high} sent then); causes: TTFT {ttft_miss}, TPOT {tpot_miss}, failed {failed}; \
                 of the {with_prediction} misses with a recorded prediction {predicted_to_meet} were predicted \
                 to meet; their medians: TTFT predicted {:.0} / observed {:.0} ms, TPOT predicted {:.1} / observed {:.1} ms",
                class.name,
                spread.join(", "),
                med(|x| x.0),
                med(|x| x.1),
                med(|x| x.2),
                med(|x| x.3),
            );
        }
    }
}
