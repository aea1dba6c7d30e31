//! Where batch requests wait and results go, behind one trait:
//!
//! * [`file`]: the embedded default, an OpenAI Batch JSONL input and a results JSONL
//!   output; the output is the progress record, so a restart resumes where it stopped.
//! * [`redis`]: llm-d-async's `redis-sortedset` transport, with leases so a crashed
//!   processor loses nothing and a marker per request so nothing is answered twice.

pub mod file;
pub mod redis;

use crate::gate::BoxFuture;
use crate::message::{Job, Outcome};
use std::time::Duration;

/// How much work the queue holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Requests not yet answered, including those taken by any processor.
    pub unanswered: u64,
    /// Answered by this process.
    pub answered: u64,
    /// All requests, when the queue knows (a file).
    pub total: Option<u64>,
}

pub trait Queue: Send {
    /// Takes up to `n` requests for this processor (a lease on Redis).
    fn take(&mut self, n: usize) -> BoxFuture<'_, Result<Vec<Job>, String>>;
    /// Records a request's result; a request is answered at most once. Returns whether
    /// this call wrote the result (false: it had been answered already).
    fn finish(&mut self, job: Job, outcome: Outcome) -> BoxFuture<'_, Result<bool, String>>;
    /// Puts a request back, to be taken again no earlier than `after`.
    fn retry(&mut self, job: Job, after: Duration) -> BoxFuture<'_, Result<(), String>>;
    /// Gives back requests taken but not dispatched (at shutdown).
    fn release(&mut self, jobs: Vec<Job>) -> BoxFuture<'_, Result<(), String>>;
    /// Upkeep, called every turn of the loop (lease renewal, due retries, expired leases).
    fn tick(&mut self) -> BoxFuture<'_, Result<(), String>>;
    /// What is left.
    fn backlog(&mut self) -> BoxFuture<'_, Result<Backlog, String>>;
}
