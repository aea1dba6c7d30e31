//! The waiting queue's order and the preemption victim (`--scheduling-policy`), as
//! vLLM v1's scheduler does them.
//!
//! - `fcfs` (the default): requests wait in arrival order; a preempted request goes
//!   back to the head of the queue; the victim of a preemption is the most recently
//!   admitted running request. A request with a `priority` other than 0 is refused
//!   (400 "Got priority N but Priority scheduling is not enabled.").
//! - `priority`: requests wait ordered by (`priority`, arrival), **the lower value
//!   first**, and a preempted request goes back to its place in that order; the
//!   victim of a preemption is the running request with the highest (`priority`,
//!   arrival), i.e. the least important, latest arrival. As in vLLM v1, a waiting
//!   request never preempts a running one by priority alone: preemption happens only
//!   when a running request needs a KV block and none is free. A full batch
//!   (`max-num-seqs`) makes a waiting request of any priority wait for a slot.

use std::time::Duration;

/// `--scheduling-policy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SchedulingPolicy {
    #[default]
    Fcfs,
    Priority,
}

impl SchedulingPolicy {
    /// `fcfs` or `priority` (vLLM's names).
    pub fn parse(name: &str) -> Option<SchedulingPolicy> {
        match name {
            "fcfs" => Some(SchedulingPolicy::Fcfs),
            "priority" => Some(SchedulingPolicy::Priority),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SchedulingPolicy::Fcfs => "fcfs",
            SchedulingPolicy::Priority => "priority",
        }
    }
}

/// The order of a request under `priority`: smaller is served first; the request id
/// breaks ties between equal arrival times (ids grow with submission order).
pub(crate) type OrderKey = (i64, Duration, u64);
