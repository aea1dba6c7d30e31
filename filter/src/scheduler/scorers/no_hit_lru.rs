//! `no-hit-lru-scorer` (router): spreads *cold* requests (no candidate holds any of the
//! prompt's blocks) over endpoints that have not taken a cold request recently.
//!
//! * warm request: every endpoint 0.5 (no effect);
//! * cold request with n candidates: never-used endpoints score `1 − i/(n−1)` in list
//!   order; used ones `1 − (neverUsed + lruPos)/(n−1)` (clamped ≥ 0), `lruPos` 0 the
//!   least recently used; a single candidate scores 1.
//!
//! After a cold request, the chosen primary and prefill endpoints move to the front of
//! the LRU (`lruSize` entries, default 1024). The LRU is this VM's (each worker spreads
//! its own cold requests).

use crate::config::{ConfigError, Params};
use crate::scheduler::{Cycle, Decision, Scorer};
use serde_json::Value;
use std::cell::RefCell;
use std::collections::VecDeque;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "no-hit-lru-scorer";

/// Default `lruSize`.
pub const DEFAULT_LRU_SIZE: usize = 1024;

/// The no-hit LRU scorer.
#[derive(Debug)]
pub struct NoHitLru {
    size: usize,
    /// Most recently used first.
    lru: RefCell<VecDeque<String>>,
}

impl NoHitLru {
    /// With an LRU of `size` endpoints.
    pub fn new(size: usize) -> Self {
        Self {
            size: size.max(1),
            lru: RefCell::new(VecDeque::new()),
        }
    }

    fn is_cold(cx: &Cycle<'_>) -> bool {
        cx.prefix.iter().all(|m| m.matched == 0)
    }
}

impl Scorer for NoHitLru {
    fn score(&self, cx: &Cycle<'_>, endpoints: &[usize]) -> Vec<f64> {
        let n = endpoints.len();
        if !Self::is_cold(cx) {
            return vec![0.5; n];
        }
        if n <= 1 {
            return vec![1.0; n];
        }
        let lru = self.lru.borrow();
        let denom = (n - 1) as f64;
        // Position in the LRU (0 = most recent) of each endpoint, if used.
        let pos: Vec<Option<usize>> = endpoints
            .iter()
            .map(|&i| {
                cx.candidate(i)
                    .and_then(|c| lru.iter().position(|a| *a == c.address))
            })
            .collect();
        let never_used = pos.iter().filter(|p| p.is_none()).count();
        // Used endpoints ranked oldest first.
        let mut used: Vec<(usize, usize)> = pos
            .iter()
            .enumerate()
            .filter_map(|(k, p)| p.map(|p| (k, p)))
            .collect();
        used.sort_by_key(|u| std::cmp::Reverse(u.1));
        let mut scores = vec![0.0; n];
        let mut fresh = 0usize;
        for (k, p) in pos.iter().enumerate() {
            if p.is_none() {
                if let Some(s) = scores.get_mut(k) {
                    *s = 1.0 - fresh as f64 / denom;
                }
                fresh += 1;
            }
        }
        for (rank, (k, _)) in used.iter().enumerate() {
            if let Some(s) = scores.get_mut(*k) {
                *s = (1.0 - (never_used + rank) as f64 / denom).max(0.0);
            }
        }
        scores
    }

    fn pre_request(&self, cx: &Cycle<'_>, decision: &Decision) {
        if !Self::is_cold(cx) {
            return;
        }
        let mut lru = self.lru.borrow_mut();
        for i in [decision.prefill, decision.primary()].into_iter().flatten() {
            if let Some(c) = cx.candidate(i) {
                lru.retain(|a| *a != c.address);
                lru.push_front(c.address.clone());
            }
        }
        lru.truncate(self.size);
    }
}

impl NoHitLru {
    /// Builds the scorer from its `parameters`: `lruSize` (positive), and the prefix
    /// plugin's type and name (read for compatibility; the prefix index is shared).
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(
            Some(v),
            path,
            &[
                "prefixPluginType",
                "prefixPluginName",
                "lruSize",
                super::prefix_cache::PRODUCER_NAME,
            ],
        )?;
        p.string(super::prefix_cache::PRODUCER_NAME, "")?;
        p.string("prefixPluginType", "prefix-cache-scorer")?;
        p.string("prefixPluginName", "prefix-cache-scorer")?;
        let size = p.positive("lruSize", 1024)?;
        Ok(Self::new(usize::try_from(size).unwrap_or(DEFAULT_LRU_SIZE)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prefix::index::PrefixMatch;
    use crate::scheduler::testing::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn decision(primary: usize) -> Decision {
        Decision {
            profile: "p".into(),
            targets: vec![primary],
            prefill: None,
            hashes: vec![],
            prefix: vec![],
            prior: vec![],
            block_size_tokens: 16,
            disaggregated: false,
            encoders: vec![],
            estimates: vec![],
            precise_keys: vec![],
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn cold_requests_prefer_never_used_then_least_recently_used() {
        let c = candidates(&[(0, 0, 0.0); 4]);
        let s = NoHitLru::new(1024);
        let cold = vec![PrefixMatch::default(); 4];
        // Nothing used yet: 1, 2/3, 1/3, 0 in list order.
        let v = with_cycle(&c, &cold, |cx| s.score(cx, &all(&c)));
        let want = [1.0, 2.0 / 3.0, 1.0 / 3.0, 0.0];
        for (a, b) in v.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{v:?}");
        }
        // Endpoint 0 then endpoint 2 take cold requests.
        with_cycle(&c, &cold, |cx| s.pre_request(cx, &decision(0)));
        with_cycle(&c, &cold, |cx| s.pre_request(cx, &decision(2)));
        // Never used (1, 3): 1 and 2/3; used, oldest first (0 then 2): 1/3 and 0.
        let v = with_cycle(&c, &cold, |cx| s.score(cx, &all(&c)));
        let want = [1.0 / 3.0, 1.0, 0.0, 2.0 / 3.0];
        for (a, b) in v.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{v:?}");
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn warm_requests_are_neutral_and_do_not_touch_the_lru() {
        let c = candidates(&[(0, 0, 0.0); 2]);
        let s = NoHitLru::new(1024);
        let warm = vec![
            PrefixMatch {
                matched: 1,
                total: 2,
                block_size_tokens: 16,
            },
            PrefixMatch::default(),
        ];
        assert_eq!(
            with_cycle(&c, &warm, |cx| s.score(cx, &all(&c))),
            vec![0.5, 0.5]
        );
        with_cycle(&c, &warm, |cx| s.pre_request(cx, &decision(0)));
        assert!(s.lru.borrow().is_empty());
    }
}
