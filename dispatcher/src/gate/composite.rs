//! `composite`: the minimum of several gates; a reading (saturation, ready endpoints) or
//! an error of any member is reported.

use super::{Allowance, BoxFuture, Decision, Gate, Load};

pub struct Composite {
    pub gates: Vec<Box<dyn Gate>>,
}

impl Gate for Composite {
    fn decide(&mut self, load: Load) -> BoxFuture<'_, Decision> {
        Box::pin(async move {
            let mut out = Decision::of(Allowance::default());
            for g in &mut self.gates {
                let d = g.decide(load).await;
                out.update &= d.update;
                out.allowance = out.allowance.min(d.allowance);
                out.saturation = out.saturation.or(d.saturation);
                out.ready = out.ready.or(d.ready);
                out.error = out.error.or(d.error);
            }
            out
        })
    }

    fn describe(&self) -> String {
        let parts: Vec<String> = self.gates.iter().map(|g| g.describe()).collect();
        format!("composite(min of {})", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{constant::Constant, local_max::LocalMax};
    use super::*;

    #[tokio::test]
    async fn the_tightest_member_wins() {
        let mut c = Composite {
            gates: vec![
                Box::new(Constant {
                    budget: 0.5,
                    workers: 64,
                }),
                Box::new(LocalMax { max: 8 }),
            ],
        };
        let d = c.decide(Load::default()).await;
        assert_eq!(d.allowance.requests, Some(8));
    }
}
