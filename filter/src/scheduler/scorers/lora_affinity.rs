//! `lora-affinity-scorer`, for the target model (after rewrite):
//! 1.0 if the adapter is running; else 0.8 if `active + waiting < max_lora`; else 0.6 if
//! it is waiting; else 0.

use crate::config::{ConfigError, Params};
use crate::scheduler::{Cycle, Scorer};
use serde_json::Value;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "lora-affinity-scorer";

/// The LoRA affinity scorer.
#[derive(Debug, Default)]
pub struct LoraAffinity;

impl Scorer for LoraAffinity {
    fn score(&self, cx: &Cycle<'_>, endpoints: &[usize]) -> Vec<f64> {
        let model = cx.request.model;
        endpoints
            .iter()
            .map(|&i| {
                let Some(c) = cx.candidate(i) else { return 0.0 };
                let m = &c.metrics;
                let used = (m.active_models.len() + m.waiting_models.len()) as u64;
                if m.active_models.iter().any(|a| a == model) {
                    1.0
                } else if used < m.max_lora.unwrap_or(0) {
                    0.8
                } else if m.waiting_models.iter().any(|a| a == model) {
                    0.6
                } else {
                    0.0
                }
            })
            .collect()
    }
}

impl LoraAffinity {
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
    fn running_then_room_then_waiting_then_nothing() {
        let mut c = candidates(&[(0, 0, 0.0); 4]);
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        c[0].metrics.active_models = s(&["m"]);
        c[0].metrics.max_lora = Some(1);
        c[1].metrics.active_models = s(&["other"]);
        c[1].metrics.max_lora = Some(2);
        c[2].metrics.active_models = s(&["other"]);
        c[2].metrics.waiting_models = s(&["m"]);
        c[2].metrics.max_lora = Some(2);
        c[3].metrics.active_models = s(&["a", "b"]);
        c[3].metrics.max_lora = Some(2);
        let v = with_cycle(&c, &[], |cx| LoraAffinity.score(cx, &all(&c)));
        assert_eq!(v, vec![1.0, 0.8, 0.6, 0.0]);
    }
}
