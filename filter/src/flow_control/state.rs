//! The global flow-control state, shared by every Envoy worker through one CAS record.
//!
//! Streams cannot move between workers, so each worker VM keeps its parked streams
//! itself ([`super::parked`]); what is global lives here, small enough to copy on every
//! update:
//! * per (priority, fairness id, VM) queue: how many requests are **queued** (waiting,
//!   not yet granted), how many are **granted** (chosen for dispatch, the owner VM has not
//!   resumed them yet), their bytes, and the ordering keys of the VM's best few queued
//!   requests (**heads**), so any VM can run the dispatch cycle in global order;
//! * per VM: requests dispatched and not finished (**in flight**), and a liveness time;
//! * per band: the round-robin cursor.
//!
//! Every operation is one read-modify-CAS of this record, so priority, fairness,
//! capacity limits and the saturation gate hold across workers exactly: two workers
//! cannot both take the last free slot. A VM's rows disappear when it stops refreshing
//! them (it died), with its queued and in-flight counts.
//!
//! Invariant kept by the owner VM: for each of its queues, local parked = queued + granted.

use super::config::{Band, FlowControlConfig};
use super::fairness::program_aware::{self, Las};
use super::fairness::{FairnessPolicy, FlowHead};
use super::ordering::OrderKey;
use prost::Message;

/// Shared-data key of the record (versioned: a new layout gets a new key).
pub const STATE_KEY: &str = "epp.v1.flow-control";
/// Heads published per queue: how many of a VM's requests of one flow other VMs can
/// grant before the owner refreshes the list.
pub const HEADS_PER_QUEUE: usize = 8;
/// A VM that has not refreshed its row for this long is dead: its rows are dropped with
/// their counts. Live VMs refresh theirs on every tick (20 ms with flow control on).
pub const VM_STALE_MS: u64 = 1_000;
/// A VM silent for this long gets no new grants (it may be dead; a grant would hold
/// capacity it cannot use).
pub const VM_SUSPECT_MS: u64 = 200;

/// The whole record.
#[derive(Clone, PartialEq, Message)]
pub struct FlowState {
    /// One row per VM with requests queued or in flight.
    #[prost(message, repeated, tag = "1")]
    pub vms: Vec<VmRow>,
    /// One entry per (priority, fairness id, VM) with requests queued or granted.
    #[prost(message, repeated, tag = "2")]
    pub queues: Vec<Queue>,
    /// Round-robin cursors, one per band that has used one.
    #[prost(message, repeated, tag = "3")]
    pub cursors: Vec<Cursor>,
    // Tag 4 held the dispatch times one by one (up to 5 KB copied on every operation);
    // it is not reused, so an older build's record still reads.
    /// Start (ms) of the first bucket of [`FlowState::recent_counts`].
    #[prost(uint64, tag = "5")]
    pub recent_from_ms: u64,
    /// Dispatches per [`RECENT_BUCKET_MS`] from `recent_from_ms`, oldest first, within
    /// [`RECENT_WINDOW_MS`]: the load that scraped metrics cannot show yet. At most
    /// `RECENT_WINDOW_MS / RECENT_BUCKET_MS` small counts, whatever the rate.
    #[prost(uint32, repeated, tag = "6")]
    pub recent_counts: Vec<u32>,
    /// Attained service per program, for bands with `program-aware-fairness` (at most
    /// [`program_aware::MAX_PROGRAMS`]).
    #[prost(message, repeated, tag = "7")]
    pub services: Vec<Service>,
}

/// One program's attained service (`program-aware-fairness`).
#[derive(Clone, PartialEq, Message)]
pub struct Service {
    /// The fairness id.
    #[prost(string, tag = "1")]
    pub fairness_id: String,
    /// Estimated tokens served, decayed to `at_ms`.
    #[prost(double, tag = "2")]
    pub tokens: f64,
    /// When `tokens` was last updated (ms).
    #[prost(uint64, tag = "3")]
    pub at_ms: u64,
}

/// How far back dispatches are counted (ms).
pub const RECENT_WINDOW_MS: u64 = 2_000;
/// Dispatches are counted per this many ms.
pub const RECENT_BUCKET_MS: u64 = 5;

/// A VM's dispatched requests and liveness.
#[derive(Clone, PartialEq, Message)]
pub struct VmRow {
    /// Process-unique VM id.
    #[prost(uint64, tag = "1")]
    pub vm: u64,
    /// Last time the VM wrote or refreshed its row (ms).
    #[prost(uint64, tag = "2")]
    pub seen_ms: u64,
    /// Requests dispatched through this VM and not finished (includes grants not yet resumed).
    #[prost(uint64, tag = "3")]
    pub in_flight: u64,
    /// Their estimated tokens.
    #[prost(uint64, tag = "4")]
    pub in_flight_tokens: u64,
}

/// One VM's share of one flow.
#[derive(Clone, PartialEq, Message)]
pub struct Queue {
    /// Band priority.
    #[prost(sint32, tag = "1")]
    pub priority: i32,
    /// Flow (tenant).
    #[prost(string, tag = "2")]
    pub fairness_id: String,
    /// The VM holding the streams.
    #[prost(uint64, tag = "3")]
    pub vm: u64,
    /// Waiting, not granted.
    #[prost(uint32, tag = "4")]
    pub queued: u32,
    /// Granted, not yet resumed by the owner.
    #[prost(uint32, tag = "5")]
    pub granted: u32,
    /// Body bytes of the queued requests.
    #[prost(uint64, tag = "6")]
    pub bytes: u64,
    /// The best queued requests, best first (at most [`HEADS_PER_QUEUE`]).
    #[prost(message, repeated, tag = "7")]
    pub heads: Vec<Head>,
}

/// A queued request as the dispatcher sees it.
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub struct Head {
    /// Ordering key, primary part.
    #[prost(uint64, tag = "1")]
    pub primary: u64,
    /// Ordering key, tie-breaker.
    #[prost(uint64, tag = "2")]
    pub secondary: u64,
    /// Body bytes.
    #[prost(uint64, tag = "3")]
    pub bytes: u64,
    /// Estimated tokens.
    #[prost(uint64, tag = "4")]
    pub tokens: u64,
}

impl Head {
    /// The ordering key.
    pub fn key(&self) -> OrderKey {
        OrderKey {
            primary: self.primary,
            secondary: self.secondary,
        }
    }
}

/// A band's round-robin position.
#[derive(Clone, PartialEq, Message)]
pub struct Cursor {
    /// Band priority.
    #[prost(sint32, tag = "1")]
    pub priority: i32,
    /// Fairness id served last.
    #[prost(string, tag = "2")]
    pub last: String,
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `flowControl.maxRequests`.
    GlobalRequests,
    /// `flowControl.maxBytes`.
    GlobalBytes,
    /// The band's `maxRequests`.
    BandRequests,
    /// The band's `maxBytes`.
    BandBytes,
}

/// What happens to a new request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Nothing ahead of it and the pool has room: go now (counted in flight).
    Dispatch,
    /// Parked: wait for a grant.
    Queued,
    /// Over a capacity limit: 429.
    Rejected(Limit),
}

/// A dispatch decision for a VM's queue: the owner resumes one request of that flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The VM that holds the stream.
    pub vm: u64,
    /// Band priority.
    pub priority: i32,
    /// Flow.
    pub fairness_id: String,
}

/// A request's identity in the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowRef<'a> {
    /// Band priority.
    pub priority: i32,
    /// Flow.
    pub fairness_id: &'a str,
}

/// What a cancelled (or expired) request gave back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// It was still queued.
    Dequeued,
    /// A grant was already on its way: its reservation is returned, capacity freed.
    GrantReturned,
    /// The record did not know it (already gone).
    Unknown,
}

impl FlowState {
    fn row(&mut self, vm: u64, now_ms: u64) -> Option<&mut VmRow> {
        if !self.vms.iter().any(|r| r.vm == vm) {
            self.vms.push(VmRow {
                vm,
                seen_ms: now_ms,
                in_flight: 0,
                in_flight_tokens: 0,
            });
        }
        let row = self.vms.iter_mut().find(|r| r.vm == vm)?;
        row.seen_ms = row.seen_ms.max(now_ms);
        Some(row)
    }

    fn queue_index(&self, vm: u64, flow: FlowRef<'_>) -> Option<usize> {
        self.queues.iter().position(|q| {
            q.vm == vm && q.priority == flow.priority && q.fairness_id == flow.fairness_id
        })
    }

    fn note_dispatch(&mut self, now_ms: u64) {
        let bucket = now_ms - now_ms % RECENT_BUCKET_MS;
        let oldest = now_ms.saturating_sub(RECENT_WINDOW_MS);
        if self.recent_counts.is_empty() || bucket < self.recent_from_ms {
            // First dispatch, or the clock went back: start again.
            self.recent_counts.clear();
            self.recent_from_ms = bucket;
        }
        // Buckets that ended before the window leave it.
        let expired = (oldest.saturating_sub(self.recent_from_ms) / RECENT_BUCKET_MS) as usize;
        if expired >= self.recent_counts.len() {
            self.recent_counts.clear();
            self.recent_from_ms = bucket;
        } else if expired > 0 {
            self.recent_counts.drain(..expired);
            self.recent_from_ms += expired as u64 * RECENT_BUCKET_MS;
        }
        let index = ((bucket - self.recent_from_ms) / RECENT_BUCKET_MS) as usize;
        if self.recent_counts.len() <= index {
            self.recent_counts.resize(index + 1, 0);
        }
        if let Some(c) = self.recent_counts.get_mut(index) {
            *c = c.saturating_add(1);
        }
    }

    /// A request dispatched at `dispatched_ms` finished, or never reached a server: it is
    /// no longer load the metrics cannot see. It leaves the bucket it was counted in (or,
    /// if that one is already empty, the nearest earlier one still counting).
    pub fn forget_dispatch(&mut self, dispatched_ms: u64) {
        if dispatched_ms < self.recent_from_ms {
            return;
        }
        let Some(last) = self.recent_counts.len().checked_sub(1) else {
            return;
        };
        let index = (((dispatched_ms - self.recent_from_ms) / RECENT_BUCKET_MS) as usize).min(last);
        if let Some(c) = self
            .recent_counts
            .get_mut(..=index)
            .and_then(|b| b.iter_mut().rev().take(3).find(|c| **c > 0))
        {
            *c -= 1;
        }
    }

    /// Requests dispatched at or after `since_ms` and not finished (within the kept
    /// window): load that metrics scraped at `since_ms` cannot show yet. Counted by bucket, so dispatches up
    /// to [`RECENT_BUCKET_MS`] before `since_ms` count too: the gate errs on the side of
    /// not flooding.
    pub fn dispatched_since(&self, since_ms: u64) -> u64 {
        self.recent_counts
            .iter()
            .enumerate()
            .filter(|(i, _)| self.recent_from_ms + (*i as u64 + 1) * RECENT_BUCKET_MS > since_ms)
            .map(|(_, c)| u64::from(*c))
            .sum()
    }

    /// Requests dispatched and not finished, pool-wide.
    pub fn in_flight(&self) -> u64 {
        self.vms.iter().map(|r| r.in_flight).sum()
    }

    /// Their estimated tokens.
    pub fn in_flight_tokens(&self) -> u64 {
        self.vms.iter().map(|r| r.in_flight_tokens).sum()
    }

    /// Requests queued (not granted) at `priority`, or in every band.
    pub fn queued(&self, priority: Option<i32>) -> u64 {
        self.queues
            .iter()
            .filter(|q| priority.is_none_or(|p| q.priority == p))
            .map(|q| u64::from(q.queued))
            .sum()
    }

    fn queued_bytes(&self, priority: Option<i32>) -> u64 {
        self.queues
            .iter()
            .filter(|q| priority.is_none_or(|p| q.priority == p))
            .map(|q| q.bytes)
            .sum()
    }

    /// Drops the rows and queues of VMs that stopped refreshing them, and empty entries.
    pub fn drop_dead(&mut self, now_ms: u64) {
        let dead: Vec<u64> = self
            .vms
            .iter()
            .filter(|r| now_ms.saturating_sub(r.seen_ms) >= VM_STALE_MS)
            .map(|r| r.vm)
            .collect();
        self.vms.retain(|r| !dead.contains(&r.vm));
        self.queues
            .retain(|q| !dead.contains(&q.vm) && (q.queued > 0 || q.granted > 0));
        let queues = &self.queues;
        self.vms
            .retain(|r| r.in_flight > 0 || queues.iter().any(|q| q.vm == r.vm));
    }

    /// Refreshes `vm`'s liveness.
    pub fn heartbeat(&mut self, vm: u64, now_ms: u64) {
        if let Some(r) = self.vms.iter_mut().find(|r| r.vm == vm) {
            r.seen_ms = r.seen_ms.max(now_ms);
        }
        self.drop_dead(now_ms);
    }

    /// Admits a new request of `vm`: capacity check (429), then the fast path when no
    /// request of its band or above is waiting and `saturation` is under the ceiling,
    /// else a place in its queue. `heads` gives the VM's best queued requests of the
    /// flow (after adding this one), skipping the given number taken by pending grants.
    #[allow(clippy::too_many_arguments)]
    pub fn admit(
        &mut self,
        vm: u64,
        flow: FlowRef<'_>,
        item: Head,
        config: &FlowControlConfig,
        band: &Band,
        now_ms: u64,
        saturation: &dyn Fn(&FlowState) -> f64,
        heads: &dyn Fn(usize) -> Vec<Head>,
    ) -> Admission {
        self.drop_dead(now_ms);
        let over = |limit: u64, used: u64, add: u64| limit > 0 && used.saturating_add(add) > limit;
        if over(config.max_requests, self.queued(None), 1) {
            return Admission::Rejected(Limit::GlobalRequests);
        }
        if over(config.max_bytes, self.queued_bytes(None), item.bytes) {
            return Admission::Rejected(Limit::GlobalBytes);
        }
        if over(band.max_requests, self.queued(Some(flow.priority)), 1) {
            return Admission::Rejected(Limit::BandRequests);
        }
        if over(
            band.max_bytes,
            self.queued_bytes(Some(flow.priority)),
            item.bytes,
        ) {
            return Admission::Rejected(Limit::BandBytes);
        }
        let waiting_ahead = self
            .queues
            .iter()
            .any(|q| q.priority >= flow.priority && (q.queued > 0 || q.granted > 0));
        if !waiting_ahead && self.open(config, flow.priority, saturation(self), now_ms) {
            if let Some(row) = self.row(vm, now_ms) {
                row.in_flight += 1;
                row.in_flight_tokens += item.tokens;
            }
            if let FairnessPolicy::ProgramAware(las) = band.fairness {
                self.charge(&las, flow.fairness_id, item.tokens, now_ms);
            }
            self.note_dispatch(now_ms);
            return Admission::Dispatch;
        }
        self.row(vm, now_ms);
        let i = match self.queue_index(vm, flow) {
            Some(i) => i,
            None => {
                self.queues.push(Queue {
                    priority: flow.priority,
                    fairness_id: flow.fairness_id.to_string(),
                    vm,
                    queued: 0,
                    granted: 0,
                    bytes: 0,
                    heads: Vec::new(),
                });
                self.queues.len() - 1
            }
        };
        if let Some(q) = self.queues.get_mut(i) {
            q.queued += 1;
            q.bytes += item.bytes;
            q.heads = heads(q.granted as usize);
        }
        Admission::Queued
    }

    /// One dispatch cycle: while the pool is under the ceiling, grant the next request
    /// by strict priority (tier 1), the band's fairness policy (tier 2) and the VM
    /// holding the best head of that flow (tier 3). A band that is waiting but cannot be
    /// served now blocks the bands below it (head-of-line blocking). At most `max` grants.
    pub fn dispatch(
        &mut self,
        config: &FlowControlConfig,
        now_ms: u64,
        max: usize,
        saturation: &dyn Fn(&FlowState) -> f64,
    ) -> Vec<Grant> {
        self.drop_dead(now_ms);
        let mut grants = Vec::new();
        while grants.len() < max {
            let Some(priority) = self
                .queues
                .iter()
                .filter(|q| self.servable(q, now_ms))
                .map(|q| q.priority)
                .max()
            else {
                break;
            };
            if !self.open(config, priority, saturation(self), now_ms) {
                break;
            }
            match self.grant_in_band(config, priority, now_ms) {
                Some(g) => {
                    self.note_dispatch(now_ms);
                    grants.push(g);
                }
                None => break,
            }
        }
        grants
    }

    /// A program's attained service now (`program-aware-fairness`).
    fn service_of(&self, las: &Las, fairness_id: &str, now_ms: u64) -> f64 {
        self.services
            .iter()
            .find(|s| s.fairness_id == fairness_id)
            .map_or(0.0, |s| las.decayed(s.tokens, s.at_ms, now_ms))
    }

    /// Adds `tokens` to a program's attained service; drops programs not served within
    /// the TTL, and the least recently served beyond [`program_aware::MAX_PROGRAMS`].
    fn charge(&mut self, las: &Las, fairness_id: &str, tokens: u64, now_ms: u64) {
        self.services.retain(|s| {
            now_ms.saturating_sub(s.at_ms) <= las.ttl_ms || s.fairness_id == fairness_id
        });
        match self
            .services
            .iter_mut()
            .find(|s| s.fairness_id == fairness_id)
        {
            Some(s) => {
                s.tokens = las.decayed(s.tokens, s.at_ms, now_ms) + tokens as f64;
                s.at_ms = now_ms;
            }
            None => {
                if self.services.len() >= program_aware::MAX_PROGRAMS {
                    if let Some(i) = (0..self.services.len())
                        .min_by_key(|&i| self.services.get(i).map_or(0, |s| s.at_ms))
                    {
                        self.services.swap_remove(i);
                    }
                }
                self.services.push(Service {
                    fairness_id: fairness_id.to_string(),
                    tokens: tokens as f64,
                    at_ms: now_ms,
                });
            }
        }
    }

    /// Whether the band of `priority` may dispatch at `saturation` under the usage-limit
    /// policy: its rank among the active bands (the configured ones, those with requests
    /// queued or granted, and its own), highest priority first.
    fn open(
        &self,
        config: &FlowControlConfig,
        priority: i32,
        saturation: f64,
        now_ms: u64,
    ) -> bool {
        let mut active: Vec<i32> = config.bands.iter().map(|b| b.priority).collect();
        active.extend(
            self.queues
                .iter()
                .filter(|q| q.queued > 0 || q.granted > 0)
                .map(|q| q.priority),
        );
        active.push(priority);
        active.sort_unstable_by(|a, b| b.cmp(a));
        active.dedup();
        let rank = active.iter().position(|p| *p == priority).unwrap_or(0);
        config
            .usage_limit
            .open(rank, active.len(), saturation, now_ms)
    }

    /// Whether a queue has requests a grant can be given for now: queued, on a VM that
    /// is not suspected dead.
    fn servable(&self, q: &Queue, now_ms: u64) -> bool {
        q.queued > 0
            && self
                .vms
                .iter()
                .any(|r| r.vm == q.vm && now_ms.saturating_sub(r.seen_ms) < VM_SUSPECT_MS)
    }

    fn grant_in_band(
        &mut self,
        config: &FlowControlConfig,
        priority: i32,
        now_ms: u64,
    ) -> Option<Grant> {
        let band = config.band(priority);
        // Flows of the band with a known head, each with its best head over the VMs.
        let mut flows: Vec<FlowHead<'_>> = Vec::new();
        for q in self
            .queues
            .iter()
            .filter(|q| q.priority == priority && self.servable(q, now_ms))
        {
            let Some(head) = q.heads.first() else {
                continue;
            };
            match flows.iter_mut().find(|f| f.fairness_id == q.fairness_id) {
                Some(f) => f.best = f.best.min(head.key()),
                None => flows.push(FlowHead {
                    fairness_id: &q.fairness_id,
                    best: head.key(),
                }),
            }
        }
        let last = self
            .cursors
            .iter()
            .find(|c| c.priority == priority)
            .map(|c| c.last.as_str());
        let service: Vec<f64> = match band.fairness {
            FairnessPolicy::ProgramAware(las) => flows
                .iter()
                .map(|f| self.service_of(&las, f.fairness_id, now_ms))
                .collect(),
            _ => Vec::new(),
        };
        let fairness_id = flows
            .get(band.fairness.pick(&flows, last, &service)?)?
            .fairness_id
            .to_string();
        let qi = (0..self.queues.len())
            .filter(|&i| {
                self.queues.get(i).is_some_and(|q| {
                    q.priority == priority
                        && q.fairness_id == fairness_id
                        && self.servable(q, now_ms)
                        && !q.heads.is_empty()
                })
            })
            .min_by_key(|&i| {
                self.queues
                    .get(i)
                    .and_then(|q| q.heads.first())
                    .map(Head::key)
            })?;
        let q = self.queues.get_mut(qi)?;
        let head = q.heads.remove(0);
        q.queued -= 1;
        q.granted += 1;
        q.bytes = q.bytes.saturating_sub(head.bytes);
        let vm = q.vm;
        if let Some(row) = self.row(vm, 0) {
            row.in_flight += 1;
            row.in_flight_tokens += head.tokens;
        }
        if let FairnessPolicy::ProgramAware(las) = band.fairness {
            self.charge(&las, &fairness_id, head.tokens, now_ms);
        }
        match self.cursors.iter_mut().find(|c| c.priority == priority) {
            Some(c) => c.last.clone_from(&fairness_id),
            None => self.cursors.push(Cursor {
                priority,
                last: fairness_id.clone(),
            }),
        }
        Some(Grant {
            vm,
            priority,
            fairness_id,
        })
    }

    /// Takes up to `max` of `vm`'s pending grants: returns (priority, fairness id, count)
    /// per queue, and republishes each queue's heads (`heads(priority, id, skip)` gives the
    /// best queued requests after skipping the `skip` granted ones, taken now or later).
    pub fn take_grants(
        &mut self,
        vm: u64,
        now_ms: u64,
        max: usize,
        heads: &dyn Fn(i32, &str, usize) -> Vec<Head>,
    ) -> Vec<(i32, String, u32)> {
        let mut budget = u32::try_from(max).unwrap_or(u32::MAX);
        let mut taken = Vec::new();
        for q in self.queues.iter_mut().filter(|q| q.vm == vm) {
            let skip = q.granted as usize;
            let n = q.granted.min(budget);
            q.granted -= n;
            budget -= n;
            q.heads = heads(q.priority, &q.fairness_id, skip);
            if n > 0 {
                taken.push((q.priority, q.fairness_id.clone(), n));
            }
        }
        self.heartbeat(vm, now_ms);
        taken
    }

    /// Whether `vm` has grants it has not taken yet.
    pub fn has_grants(&self, vm: u64) -> bool {
        self.queues.iter().any(|q| q.vm == vm && q.granted > 0)
    }

    /// A queued request of `vm` left (client gone or TTL): dequeue it, or if a grant for
    /// its queue is already pending (nothing else queued), return that grant's reservation.
    /// `heads(skip)` gives the VM's best queued requests of the flow after its removal.
    pub fn cancel(
        &mut self,
        vm: u64,
        flow: FlowRef<'_>,
        item: Head,
        now_ms: u64,
        heads: &dyn Fn(usize) -> Vec<Head>,
    ) -> Cancelled {
        let Some(i) = self.queue_index(vm, flow) else {
            return Cancelled::Unknown;
        };
        let Some(q) = self.queues.get_mut(i) else {
            return Cancelled::Unknown;
        };
        let outcome = if q.queued > 0 {
            q.queued -= 1;
            q.bytes = q.bytes.saturating_sub(item.bytes);
            Cancelled::Dequeued
        } else if q.granted > 0 {
            q.granted -= 1;
            Cancelled::GrantReturned
        } else {
            Cancelled::Unknown
        };
        q.heads = heads(q.granted as usize);
        if outcome == Cancelled::GrantReturned {
            self.finish(vm, item.tokens, now_ms);
        }
        self.heartbeat(vm, now_ms);
        outcome
    }

    /// A dispatched request of `vm` finished (or a reservation is given back).
    pub fn finish(&mut self, vm: u64, tokens: u64, now_ms: u64) {
        if let Some(r) = self.vms.iter_mut().find(|r| r.vm == vm) {
            r.in_flight = r.in_flight.saturating_sub(1);
            r.in_flight_tokens = r.in_flight_tokens.saturating_sub(tokens);
        }
        self.heartbeat(vm, now_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn a_silent_vm_gets_no_grants_and_a_dead_one_frees_its_capacity() {
        let config = FlowControlConfig::default();
        let band = config.band(0);
        let mut s = FlowState::default();
        let flow = FlowRef {
            priority: 0,
            fairness_id: "a",
        };
        let head = |k| Head {
            primary: k,
            secondary: k,
            bytes: 1,
            tokens: 1,
        };
        let full = |s: &FlowState| if s.in_flight() >= 1 { 1.0 } else { 0.0 };
        // VM 1 runs the only request, then VM 1 and VM 2 each park one; VM 1's is older.
        assert_eq!(
            s.admit(1, flow, head(0), &config, &band, 0, &full, &|_| Vec::new()),
            Admission::Dispatch
        );
        assert_eq!(
            s.admit(1, flow, head(1), &config, &band, 1, &full, &|_| vec![head(
                1
            )]),
            Admission::Queued
        );
        assert_eq!(
            s.admit(2, flow, head(2), &config, &band, 2, &full, &|_| vec![head(
                2
            )]),
            Admission::Queued
        );
        // VM 1 goes silent (it crashed). VM 2 keeps ticking.
        s.heartbeat(2, VM_SUSPECT_MS + 5);
        assert!(
            s.dispatch(&config, VM_SUSPECT_MS + 5, 8, &full).is_empty(),
            "VM 1 still holds the slot"
        );
        s.heartbeat(2, VM_STALE_MS + 5);
        let grants = s.dispatch(&config, VM_STALE_MS + 5, 8, &full);
        assert_eq!(grants.len(), 1, "the dead VM's slot came back");
        assert_eq!(
            grants[0].vm, 2,
            "and went to the live VM, not the dead one's older request"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn recent_dispatches_are_counted_after_a_scrape_time_and_bounded() {
        let config = FlowControlConfig::default();
        let band = config.band(0);
        let mut s = FlowState::default();
        let flow = FlowRef {
            priority: 0,
            fairness_id: "a",
        };
        let head = Head {
            primary: 0,
            secondary: 0,
            bytes: 1,
            tokens: 1,
        };
        for t in 0..600u64 {
            let a = s.admit(1, flow, head, &config, &band, 1_000 + t, &|_| 0.0, &|_| {
                Vec::new()
            });
            assert_eq!(a, Admission::Dispatch);
        }
        // One count per bucket, whatever the rate.
        assert_eq!(
            s.recent_counts.len() as u64,
            RECENT_WINDOW_MS.min(600) / RECENT_BUCKET_MS
        );
        assert_eq!(s.dispatched_since(1_000 + 590), 10);
        assert_eq!(s.dispatched_since(0), 600);
        // Finished requests are no load the next scrape has to show.
        for t in 590..595 {
            s.forget_dispatch(1_000 + t);
        }
        assert_eq!(s.dispatched_since(1_000 + 590), 5);
        assert_eq!(s.dispatched_since(0), 595);
        // Old dispatches leave the window.
        s.admit(
            1,
            flow,
            head,
            &config,
            &band,
            1_000 + 600 + RECENT_WINDOW_MS,
            &|_| 0.0,
            &|_| Vec::new(),
        );
        assert_eq!(s.recent_counts, [1]);
        assert_eq!(s.dispatched_since(0), 1);
    }
}
