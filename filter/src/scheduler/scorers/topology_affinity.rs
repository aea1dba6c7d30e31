//! `topology-affinity-scorer` (llm-d-router #1678): in P/D's prefill profile, scores each
//! candidate by the tightest topology level it shares with the decode pick (the peer),
//! on the reference's fixed curve — host 1.0, rack 0.2, zone 0.05, region 0.02, none 0 —
//! and 0 for every candidate when there is no peer or it has no topology label. The
//! topology is read as `topology-affinity-filter` reads it.

use crate::config::{ConfigError, Params};
use crate::scheduler::filters::topology_affinity::{Labels, Level, LABELS_PARAMETER};
use crate::scheduler::{Cycle, Scorer};
use serde_json::Value;

/// The type name.
pub const TYPE: &str = "topology-affinity-scorer";

/// The scorer.
#[derive(Debug)]
pub struct TopologyAffinity {
    /// Label names.
    pub labels: Labels,
}

impl TopologyAffinity {
    /// Builds the scorer: `topologyProducerName` (checked by the runtime),
    /// `topologyLabels` (set by the runtime from the extractor).
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(Some(v), path, &["topologyProducerName", LABELS_PARAMETER])?;
        p.string("topologyProducerName", "")?;
        Ok(Self {
            labels: Labels::of(&p)?,
        })
    }
}

impl Scorer for TopologyAffinity {
    fn score(&self, cx: &Cycle<'_>, endpoints: &[usize]) -> Vec<f64> {
        let peer = cx
            .request
            .peer
            .and_then(|i| cx.candidate(i))
            .filter(|p| self.labels.known(p));
        endpoints
            .iter()
            .map(|&i| match (peer, cx.candidate(i)) {
                (Some(p), Some(c)) => match self.labels.compare(p, c) {
                    Level::Host => 1.0,
                    Level::Rack => 0.2,
                    Level::Zone => 0.05,
                    Level::Region => 0.02,
                    Level::None => 0.0,
                },
                _ => 0.0,
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
    fn the_reference_curve() {
        let mut c = candidates(&[(0, 0, 0.0); 5]);
        let labels = [
            ("h1", "r1", "z1", "g1"),
            ("h1", "r1", "z1", "g1"),
            ("h2", "r1", "z1", "g1"),
            ("h3", "r3", "z1", "g1"),
            ("h4", "r4", "z4", "g4"),
        ];
        for (cand, (h, r, z, g)) in c.iter_mut().zip(labels) {
            for (k, v) in Labels::default().names.iter().zip([h, r, z, g]) {
                cand.labels.insert(k.clone(), v.into());
            }
        }
        let s = TopologyAffinity::from_parameters(&Value::Null, "p").unwrap();
        let request = Request {
            model: "m",
            peer: Some(0),
            ..Request::default()
        };
        let cx = cycle_for(&request, &c);
        assert_eq!(s.score(&cx, &[1, 2, 3, 4]), vec![1.0, 0.2, 0.05, 0.0]);
        let alone = Request {
            model: "m",
            ..Request::default()
        };
        let cx = cycle_for(&alone, &c);
        assert_eq!(s.score(&cx, &[1, 2]), vec![0.0, 0.0]);
    }
}
