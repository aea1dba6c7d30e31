//! The published model as picks use it. A VM builds one per model version (when it
//! re-reads the model, about every training tick) and every pick until the next version
//! shares it: each endpoint's speed factors (`exp(endpoint term + residual)`, per target
//! and objective) are computed here once, so predicting a request over N endpoints costs
//! N map lookups and 2N dot products of the features, with no `exp` and no index built
//! per request.

use super::features::N;
use super::model::{Model, Objective, Target};
use hashbrown::HashMap;

/// The factors of one endpoint: `[mean, quantile]` per target, and its running error
/// per target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Factors {
    ttft: [f64; 2],
    tpot: [f64; 2],
    error: [f64; 2],
}

impl Factors {
    fn of(model: &Model, term: Option<&super::model::EndpointTerm>) -> Self {
        let both = |t| {
            [
                model.factor(t, term, Objective::Mean),
                model.factor(t, term, Objective::Quantile(0.0)),
            ]
        };
        // An endpoint without scored predictions yet: the pool's error.
        let error = |t| match term {
            Some(e) if e.scored(t) > 0 => e.error(t),
            _ => model.error(t),
        };
        Factors {
            ttft: both(Target::Ttft),
            tpot: both(Target::Tpot),
            error: [error(Target::Ttft), error(Target::Tpot)],
        }
    }

    /// The endpoint's running error for `t` (relative to the prediction).
    pub fn error(&self, t: Target) -> f64 {
        match t {
            Target::Ttft => self.error[0],
            Target::Tpot => self.error[1],
        }
    }

    fn get(&self, t: Target, obj: Objective) -> f64 {
        let pair = match t {
            Target::Ttft => &self.ttft,
            Target::Tpot => &self.tpot,
        };
        match obj {
            Objective::Mean => pair[0],
            Objective::Quantile(_) => pair[1],
        }
    }
}

/// A published [`Model`] with its per-endpoint factors.
#[derive(Debug, Clone, PartialEq)]
pub struct Predictor {
    model: Model,
    factors: HashMap<String, Factors>,
    /// For an endpoint the model has not learnt yet: the pool-wide factors.
    pool: Factors,
}

impl Predictor {
    /// Prepares `model` for picks.
    pub fn new(model: Model) -> Self {
        let factors = model
            .endpoints
            .iter()
            .map(|e| (e.address.clone(), Factors::of(&model, Some(e))))
            .collect();
        let pool = Factors::of(&model, None);
        Predictor {
            model,
            factors,
            pool,
        }
    }

    /// The model as published.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The factors of the endpoint at `address`.
    pub fn factors(&self, address: &str) -> &Factors {
        self.factors.get(address).unwrap_or(&self.pool)
    }

    /// The prediction of `t` (ms) at `x` on the endpoint with `factors`, or `None`
    /// before the model has enough samples for `t`: the same value as
    /// [`Model::predict`].
    pub fn predict(
        &self,
        t: Target,
        factors: &Factors,
        x: &[f64; N],
        obj: Objective,
    ) -> Option<f64> {
        self.model.predict_scaled(t, x, factors.get(t, obj))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latency::model::{Sample, MIN_SAMPLES};
    use wasm_bindgen_test::wasm_bindgen_test;

    fn sample(address: &str, load: f64, ttft: f64, tpot: f64) -> Sample {
        let mut x = [0.0; N];
        x[0] = 1.0;
        x[3] = load;
        Sample {
            address: address.into(),
            x: x.to_vec(),
            ttft_ms: ttft,
            tpot_ms: tpot,
            ..Sample::default()
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn predicts_what_the_model_predicts_for_known_and_unknown_endpoints() {
        let mut m = Model::default();
        for i in 0..(3 * MIN_SAMPLES) {
            let load = (i % 7) as f64;
            // b runs twice as slow as a.
            m.train(
                &sample("a", load, 50.0 + 10.0 * load, 10.0 + load),
                i as i64,
            );
            m.train(
                &sample("b", load, 100.0 + 20.0 * load, 20.0 + 2.0 * load),
                i as i64,
            );
        }
        let p = Predictor::new(m.clone());
        let mut x = [0.0; N];
        x[0] = 1.0;
        x[3] = 4.0;
        for address in ["a", "b", "never-seen"] {
            for t in [Target::Ttft, Target::Tpot] {
                for obj in [Objective::Mean, Objective::Quantile(0.9)] {
                    let want = m.predict(t, address, &x, obj);
                    assert!(want.is_some());
                    assert_eq!(
                        p.predict(t, p.factors(address), &x, obj),
                        want,
                        "{address} {t:?} {obj:?}"
                    );
                }
            }
        }
        let (a, b) = (
            p.predict(Target::Ttft, p.factors("a"), &x, Objective::Mean)
                .unwrap(),
            p.predict(Target::Ttft, p.factors("b"), &x, Objective::Mean)
                .unwrap(),
        );
        assert!(
            b > 1.5 * a,
            "the slow endpoint is predicted slower: {a} vs {b}"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn says_nothing_before_the_model_is_ready() {
        let p = Predictor::new(Model::default());
        let x = [1.0; N];
        assert_eq!(
            p.predict(Target::Ttft, p.factors("a"), &x, Objective::Mean),
            None
        );
    }
}
