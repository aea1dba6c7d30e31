//! Driving the engine in virtual time: a minimal discrete-event loop over a
//! list of arrivals. Same seed and same arrivals give the same timings.

use crate::engine::{Engine, EngineRequest, EventKind, Finished, RequestId, SubmitError};
use std::time::Duration;

/// A request arriving at time `at`.
#[derive(Clone, Debug, PartialEq)]
pub struct Arrival {
    pub at: Duration,
    pub request: EngineRequest,
}

/// What happened to one arrival.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    pub arrival: Duration,
    /// The engine's id, or why it refused the request.
    pub outcome: Result<RequestId, SubmitError>,
    /// Time of each output token.
    pub token_times: Vec<Duration>,
    pub finished: Option<Finished>,
}

impl Trace {
    /// Time to first token.
    pub fn ttft(&self) -> Option<Duration> {
        self.token_times
            .first()
            .map(|t| t.saturating_sub(self.arrival))
    }

    /// Mean gap between tokens.
    pub fn mean_itl(&self) -> Option<Duration> {
        let n = self.token_times.len();
        if n < 2 {
            return None;
        }
        Some(self.token_times[n - 1].saturating_sub(self.token_times[0]) / (n as u32 - 1))
    }
}

/// Runs `arrivals` (any order) through `engine` until everything finished or
/// virtual time passes `horizon`. Returns one trace per arrival, in the order given.
pub fn run(engine: &mut Engine, arrivals: &[Arrival], horizon: Duration) -> Vec<Trace> {
    let mut order: Vec<usize> = (0..arrivals.len()).collect();
    order.sort_by_key(|&i| arrivals[i].at);
    let mut traces: Vec<Trace> = arrivals
        .iter()
        .map(|a| Trace {
            arrival: a.at,
            outcome: Err(SubmitError::QueueFull),
            token_times: Vec::new(),
            finished: None,
        })
        .collect();
    let mut by_id = std::collections::HashMap::new();
    let mut next = 0;
    // Set when a step at the wanted time scheduled nothing; cleared by a submission.
    let mut stalled_at: Option<Duration> = None;
    loop {
        let arrival_at = order.get(next).map(|&i| arrivals[i].at);
        let step_at = engine
            .next_step_at()
            .filter(|t| stalled_at.is_none_or(|s| *t > s));
        let now = match (arrival_at, step_at) {
            (None, None) => break,
            (Some(a), Some(s)) if s < a => s,
            (Some(a), _) => {
                let i = order[next];
                next += 1;
                let outcome = engine.submit(arrivals[i].request.clone(), a);
                if let Ok(id) = outcome {
                    by_id.insert(id, i);
                }
                traces[i].outcome = outcome;
                stalled_at = None;
                continue;
            }
            (None, Some(s)) => s,
        };
        if now > horizon {
            break;
        }
        let Some(step) = engine.step(now) else {
            stalled_at = Some(now);
            continue;
        };
        stalled_at = None;
        for event in step.events {
            let Some(&i) = by_id.get(&event.request) else {
                continue;
            };
            match event.kind {
                EventKind::Token { .. } => traces[i].token_times.push(event.at),
                EventKind::Finished(f) => traces[i].finished = Some(f),
            }
        }
    }
    traces
}
