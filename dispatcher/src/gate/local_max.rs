//! `local-max-concurrency`: at most `M` requests in flight from this process, whatever
//! the pool says (a ceiling under the others in a `composite`).

use super::{Allowance, BoxFuture, Decision, Gate, Load};

pub struct LocalMax {
    pub max: u64,
}

impl Gate for LocalMax {
    fn decide(&mut self, _load: Load) -> BoxFuture<'_, Decision> {
        let a = Allowance {
            requests: Some(self.max),
            bytes: None,
        };
        Box::pin(async move { Decision::of(a) })
    }

    fn describe(&self) -> String {
        format!("local-max-concurrency({})", self.max)
    }
}
