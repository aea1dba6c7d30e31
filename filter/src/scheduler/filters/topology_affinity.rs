//! `topology-affinity-filter` (llm-d-router #1678) and the topology read from endpoint
//! labels that it and `topology-affinity-scorer` share (`topology-extractor`).
//!
//! In P/D, the prefill profile runs after the decode pick; this filter keeps the prefill
//! candidates co-located with the decode endpoint (the request's *peer*) at `minAffinity`
//! (`host`, the default, `rack`, `zone` or `region`) or tighter, so the KV transfer takes
//! the fastest path. It keeps every candidate when there is no peer (outside P/D's
//! prefill stage), when the peer has no topology label, or when none qualifies: locality
//! is a preference, never a reason to fail a request. A missing value never matches.
//!
//! The topology comes from each endpoint's labels (`pool.endpoints[].labels`, or discovered
//! metadata): `kubernetes.io/hostname`, `topology.kubernetes.io/rack`,
//! `topology.kubernetes.io/zone`, `topology.kubernetes.io/region`, or the label names the
//! `topology-extractor`'s parameters (`hostname`, `rack`, `zone`, `region`) give; the
//! runtime passes them to this filter and the scorer as `topologyLabels`. The reference
//! falls back to the pod's `spec.hostname`; here there is no pod object, so the label is
//! the only source.

use crate::config::validate::err;
use crate::config::{ConfigError, Params};
use crate::endpoint::Candidate;
use crate::rng::Rng;
use crate::scheduler::{Cycle, Filter};
use serde_json::Value;

/// The filter's type name.
pub const TYPE: &str = "topology-affinity-filter";
/// The extractor's type name (labels → topology).
pub const EXTRACTOR_TYPE: &str = "topology-extractor";
/// The parameter through which the runtime hands the extractor's label names over.
pub const LABELS_PARAMETER: &str = "topologyLabels";

/// Topology levels, tightest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Same host (NVLink).
    Host,
    /// Same rack.
    Rack,
    /// Same zone.
    Zone,
    /// Same region.
    Region,
    /// Nothing in common.
    None,
}

/// The label names of each level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Labels {
    /// Host, rack, zone, region label names.
    pub names: [String; 4],
}

impl Default for Labels {
    fn default() -> Self {
        Self {
            names: [
                "kubernetes.io/hostname".into(),
                "topology.kubernetes.io/rack".into(),
                "topology.kubernetes.io/zone".into(),
                "topology.kubernetes.io/region".into(),
            ],
        }
    }
}

impl Labels {
    /// The extractor's parameters (`hostname`, `rack`, `zone`, `region`: label names).
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(Some(v), path, &["hostname", "rack", "zone", "region"])?;
        let d = Self::default();
        let [h, r, z, g] = &d.names;
        Ok(Self {
            names: [
                p.string("hostname", h)?,
                p.string("rack", r)?,
                p.string("zone", z)?,
                p.string("region", g)?,
            ],
        })
    }

    /// Whether `c` has any topology label.
    pub fn known(&self, c: &Candidate) -> bool {
        self.names
            .iter()
            .any(|n| c.labels.get(n).is_some_and(|v| !v.is_empty()))
    }

    /// The tightest level `peer` and `c` share.
    pub fn compare(&self, peer: &Candidate, c: &Candidate) -> Level {
        let levels = [Level::Host, Level::Rack, Level::Zone, Level::Region];
        for (name, level) in self.names.iter().zip(levels) {
            match (peer.labels.get(name), c.labels.get(name)) {
                (Some(a), Some(b)) if !a.is_empty() && a == b => return level,
                _ => {}
            }
        }
        Level::None
    }

    /// Reads `topologyLabels` from a filter's or scorer's parameters.
    pub fn of(p: &Params<'_>) -> Result<Self, ConfigError> {
        match p.get(LABELS_PARAMETER) {
            Some(v) => Self::from_parameters(v, &p.path(LABELS_PARAMETER)),
            None => Ok(Self::default()),
        }
    }
}

/// The filter.
#[derive(Debug)]
pub struct TopologyAffinity {
    /// The loosest level kept.
    pub min: Level,
    /// Label names.
    pub labels: Labels,
}

impl TopologyAffinity {
    /// Builds the filter: `minAffinity`, `topologyProducerName` (checked by the runtime),
    /// `topologyLabels` (set by the runtime from the extractor).
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(
            Some(v),
            path,
            &["minAffinity", "topologyProducerName", LABELS_PARAMETER],
        )?;
        let min = match p.string("minAffinity", "host")?.as_str() {
            "host" => Level::Host,
            "rack" => Level::Rack,
            "zone" => Level::Zone,
            "region" => Level::Region,
            other => {
                return Err(err(
                    &p.path("minAffinity"),
                    format!("\"{other}\" is not a level: host, rack, zone or region"),
                ))
            }
        };
        p.string("topologyProducerName", EXTRACTOR_TYPE)?;
        Ok(Self {
            min,
            labels: Labels::of(&p)?,
        })
    }
}

impl Filter for TopologyAffinity {
    fn filter(&self, cx: &Cycle<'_>, endpoints: Vec<usize>, _rng: &mut Rng) -> Vec<usize> {
        let Some(peer) = cx.request.peer.and_then(|i| cx.candidate(i)) else {
            return endpoints;
        };
        if !self.labels.known(peer) {
            return endpoints;
        }
        let kept: Vec<usize> = endpoints
            .iter()
            .copied()
            .filter(|&i| {
                cx.candidate(i)
                    .is_some_and(|c| self.labels.compare(peer, c) <= self.min)
            })
            .collect();
        if kept.is_empty() {
            endpoints
        } else {
            kept
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::*;
    use crate::scheduler::Request;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn keeps_the_peers_neighbours_and_fails_open() {
        let mut c = candidates(&[(0, 0, 0.0); 4]);
        let set = |c: &mut Candidate, host: &str, zone: &str| {
            c.labels
                .insert("kubernetes.io/hostname".into(), host.into());
            c.labels
                .insert("topology.kubernetes.io/zone".into(), zone.into());
        };
        set(&mut c[0], "h1", "z1"); // the decode pick
        set(&mut c[1], "h1", "z1");
        set(&mut c[2], "h2", "z1");
        set(&mut c[3], "h3", "z2");
        let host = TopologyAffinity::from_parameters(&Value::Null, "p").unwrap();
        let zone = TopologyAffinity::from_parameters(&json!({"minAffinity": "zone"}), "p").unwrap();
        let run = |f: &TopologyAffinity, peer: Option<usize>, eps: Vec<usize>| {
            let request = Request {
                model: "m",
                peer,
                ..Request::default()
            };
            let cx = cycle_for(&request, &c);
            f.filter(&cx, eps, &mut Rng::new(0))
        };
        assert_eq!(run(&host, Some(0), vec![1, 2, 3]), vec![1]);
        assert_eq!(run(&zone, Some(0), vec![1, 2, 3]), vec![1, 2]);
        // No peer, or none qualifies: all kept.
        assert_eq!(run(&host, None, vec![1, 2, 3]), vec![1, 2, 3]);
        assert_eq!(run(&host, Some(0), vec![2, 3]), vec![2, 3]);
        let e = TopologyAffinity::from_parameters(&json!({"minAffinity": "city"}), "p");
        assert_eq!(e.unwrap_err().path, "p.minAffinity");
    }
}
