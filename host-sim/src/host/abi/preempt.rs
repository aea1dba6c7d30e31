//! The preemption point inside shared-data and queue host calls (see
//! [`crate::sim::SimConfig::preempt_probability`]).

use super::memory::C;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Returns `Pending` once: the VM is suspended inside this host call, so that another
/// VM's callback can run in between.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            Poll::Pending
        }
    }
}

/// With the configured probability, suspends this VM here.
pub async fn maybe_yield(c: C<'_, '_>) {
    let yield_now = {
        let p = &mut c.data_mut().preempt;
        p.enabled && p.rng.unit() < p.probability
    };
    if yield_now {
        YieldOnce(false).await;
    }
}
