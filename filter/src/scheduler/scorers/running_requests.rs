//! `running-requests-size-scorer`: min-max over the candidates of the engine's running
//! requests, `(maxR − r)/(maxR − minR)`; all equal → 1.0.

use super::lower_is_better;
use crate::config::{ConfigError, Params};
use crate::scheduler::{Cycle, Scorer};
use serde_json::Value;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "running-requests-size-scorer";

/// The running-requests scorer.
#[derive(Debug, Default)]
pub struct RunningRequests;

impl Scorer for RunningRequests {
    fn score(&self, cx: &Cycle<'_>, endpoints: &[usize]) -> Vec<f64> {
        let r: Vec<f64> = endpoints
            .iter()
            .map(|&i| cx.candidate(i).map_or(0.0, |c| c.metrics.running as f64))
            .collect();
        lower_is_better(&r)
    }
}

impl RunningRequests {
    /// Builds the scorer from its `parameters` (it takes none).
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        Params::new(Some(v), path, &[])?;
        Ok(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn min_max_normalised_running_requests() {
        let c = candidates(&[(0, 1, 0.0), (0, 5, 0.0), (0, 2, 0.0)]);
        let s = with_cycle(&c, &[], |cx| RunningRequests.score(cx, &all(&c)));
        assert_eq!(s, vec![1.0, 0.0, 0.75]);
    }
}
