//! `random-picker`: a uniform shuffle, then the first N.

use crate::config::{ConfigError, Params};
use crate::rng::Rng;
use crate::scheduler::Picker;
use serde_json::Value;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "random-picker";

/// The random picker.
#[derive(Debug)]
pub struct Random {
    /// `maxNumOfEndpoints`.
    pub max_endpoints: usize,
}

impl Picker for Random {
    fn pick(&self, mut scored: Vec<(usize, f64)>, rng: &mut Rng) -> Vec<usize> {
        rng.shuffle(&mut scored);
        scored
            .into_iter()
            .take(self.max_endpoints)
            .map(|(i, _)| i)
            .collect()
    }
}

impl Random {
    /// Builds the picker from its `parameters`: `maxNumOfEndpoints` (default 1).
    pub fn from_parameters(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let p = Params::new(Some(v), path, &["maxNumOfEndpoints"])?;
        Ok(Self {
            max_endpoints: super::max_endpoints(p.i64("maxNumOfEndpoints", 1)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn ignores_scores_and_spreads_uniformly() {
        let p = Random { max_endpoints: 1 };
        let mut rng = Rng::new(3);
        let mut counts = [0u32; 3];
        for _ in 0..3000 {
            counts[p.pick(vec![(0, 9.0), (1, 0.0), (2, 0.0)], &mut rng)[0]] += 1;
        }
        assert!(counts.iter().all(|c| *c > 850), "{counts:?}");
    }
}
