//! `program-aware-fairness` (llm-d-router #2120), strategy `las` (least attained service):
//! a program (fairness id, e.g. one agentic workflow) that has received less service
//! recently goes first, so a program of a few large requests cannot crowd out one of many
//! small ones, and an idle program comes back on near-equal terms.
//!
//! Each flow's score is `lasWeightService × (1 − s / s_max) + lasWeightHeadWait × w`,
//! where `s` is the program's attained service decayed with half-life
//! `lasHalfLifeSeconds` (0: no decay) and `w` its head request's wait relative to the
//! other flows' heads (1 for the oldest head, 0 for the newest: the band's order key);
//! the highest score is served, ties by order key. Attained service is kept in the
//! shared flow-control record (`flow_control::state`) for every worker.
//!
//! Deliberate difference: the reference charges a request's `usage` (input + 2 × output
//! tokens) when it completes; here a request is charged its token estimate (the input
//! plus 1.5 × the input, as every load estimate here) when it is dispatched, because the
//! service must be known to every worker at the next dispatch and the shared record is
//! updated at dispatch anyway. Programs are kept at most [`MAX_PROGRAMS`] (the least
//! recently served is dropped first) and dropped after `evictionTtlSeconds` without
//! service; `evictionSweepSeconds` is checked and not needed (entries are dropped when
//! the record is next written).

use super::FlowHead;
use crate::config::validate::err;
use crate::config::{ConfigError, Params};
use serde_json::Value;

/// Plugin type name.
pub const TYPE: &str = "program-aware-fairness";
/// Programs whose attained service is kept (each costs ~40 bytes of the shared record,
/// copied on every flow-control operation).
pub const MAX_PROGRAMS: usize = 256;

/// The policy's settings (weights in thousandths, so the policy stays `Eq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Las {
    /// `lasWeightService` × 1000.
    pub weight_service_milli: u32,
    /// `lasWeightHeadWait` × 1000.
    pub weight_wait_milli: u32,
    /// `lasHalfLifeSeconds` in ms; 0 = no decay.
    pub half_life_ms: u64,
    /// `evictionTtlSeconds` in ms.
    pub ttl_ms: u64,
}

impl Default for Las {
    fn default() -> Self {
        Self {
            weight_service_milli: 800,
            weight_wait_milli: 200,
            half_life_ms: 60_000,
            ttl_ms: 3_600_000,
        }
    }
}

impl Las {
    /// Reads the parameters.
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(
            Some(v),
            path,
            &[
                "strategy",
                "lasWeightService",
                "lasWeightHeadWait",
                "lasHalfLifeSeconds",
                "evictionTtlSeconds",
                "evictionSweepSeconds",
            ],
        )?;
        p.only("strategy", "las")?;
        let ws = p.non_negative("lasWeightService", 0.8)?;
        let ww = p.non_negative("lasWeightHeadWait", 0.2)?;
        let half = p.non_negative("lasHalfLifeSeconds", 60.0)?;
        let ttl = p.non_negative("evictionTtlSeconds", 3600.0)?;
        if p.f64("evictionSweepSeconds", 300.0)? <= 0.0 {
            return Err(err(&p.path("evictionSweepSeconds"), "must be positive"));
        }
        Ok(Self {
            weight_service_milli: (ws * 1000.0).round() as u32,
            weight_wait_milli: (ww * 1000.0).round() as u32,
            half_life_ms: (half * 1000.0).round() as u64,
            ttl_ms: (ttl * 1000.0).round() as u64,
        })
    }

    /// `service` recorded at `at_ms`, decayed to `now_ms`.
    pub fn decayed(&self, service: f64, at_ms: u64, now_ms: u64) -> f64 {
        if self.half_life_ms == 0 {
            return service;
        }
        let halves = now_ms.saturating_sub(at_ms) as f64 / self.half_life_ms as f64;
        service * 0.5_f64.powf(halves)
    }

    /// The flow to serve: `service[i]` is flow `i`'s decayed attained service.
    pub fn pick(&self, flows: &[FlowHead<'_>], service: &[f64]) -> Option<usize> {
        let s_max = service.iter().copied().fold(0.0_f64, f64::max);
        let (lo, hi) = flows.iter().fold((u64::MAX, 0), |(lo, hi), f| {
            (lo.min(f.best.primary), hi.max(f.best.primary))
        });
        let ws = f64::from(self.weight_service_milli) / 1000.0;
        let ww = f64::from(self.weight_wait_milli) / 1000.0;
        let score = |i: usize, f: &FlowHead<'_>| {
            let s = service.get(i).copied().unwrap_or(0.0);
            let under = if s_max > 0.0 { 1.0 - s / s_max } else { 1.0 };
            let wait = if hi > lo {
                (hi - f.best.primary) as f64 / (hi - lo) as f64
            } else {
                1.0
            };
            ws * under + ww * wait
        };
        let mut best: Option<(usize, f64)> = None;
        for (i, f) in flows.iter().enumerate() {
            let sc = score(i, f);
            best = match best {
                Some((j, b)) => {
                    let keep =
                        b > sc || (b == sc && flows.get(j).is_some_and(|g| g.best <= f.best));
                    if keep {
                        Some((j, b))
                    } else {
                        Some((i, sc))
                    }
                }
                None => Some((i, sc)),
            };
        }
        best.map(|(i, _)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow_control::ordering::OrderKey;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn head(id: &str, primary: u64) -> FlowHead<'_> {
        FlowHead {
            fairness_id: id,
            best: OrderKey {
                primary,
                secondary: primary,
            },
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_least_served_program_goes_first_and_service_decays() {
        let las = Las::from_parameters(&json!({"lasHalfLifeSeconds": 10}), "p").unwrap();
        // "big" has had 10,000 tokens, "small" 100: small goes first although its head
        // is newer.
        let flows = [head("big", 100), head("small", 200)];
        assert_eq!(las.pick(&flows, &[10_000.0, 100.0]), Some(1));
        // Equal service: the older head goes first.
        assert_eq!(las.pick(&flows, &[0.0, 0.0]), Some(0));
        // Half-life 10 s: after 20 s, a quarter is left.
        assert_eq!(las.decayed(1000.0, 0, 20_000), 250.0);
        let none = Las::from_parameters(&json!({"lasHalfLifeSeconds": 0}), "p").unwrap();
        assert_eq!(none.decayed(1000.0, 0, 1_000_000), 1000.0);
        let e = Las::from_parameters(&json!({"strategy": "drr"}), "p").unwrap_err();
        assert_eq!(e.path, "p.strategy");
    }
}
