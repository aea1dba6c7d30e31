//! The requests this VM holds paused, by flow and in the band's order, and by enqueue
//! time (queue-wait budgets expire the oldest first, `super::ttl`). Each worker VM has one; streams cannot move between workers, so the
//! global state ([`super::state`]) only counts them and publishes their best keys.
//! `T` is whatever the proxy layer needs to resume the request later.

use super::ordering::OrderKey;
use super::state::Head;
use hashbrown::HashMap;
use std::collections::{BTreeMap, BTreeSet};

/// A flow: (priority, fairness id).
pub type FlowId = (i32, String);

/// One parked request.
#[derive(Debug, Clone, PartialEq)]
pub struct ParkedRequest<T> {
    /// The stream's context id.
    pub ctx: u32,
    /// Its flow.
    pub flow: FlowId,
    /// Its place in the flow's order.
    pub key: OrderKey,
    /// Body bytes and token estimate, as published in heads.
    pub head: Head,
    /// When it entered flow control (ms).
    pub enqueue_ms: u64,
    /// The proxy layer's data.
    pub data: T,
}

/// The VM's parked requests.
#[derive(Debug)]
pub struct Parked<T> {
    items: HashMap<u32, ParkedRequest<T>>,
    /// Per flow: (key, arrival sequence) → ctx, best first.
    flows: HashMap<FlowId, BTreeMap<(OrderKey, u64), u32>>,
    /// (enqueue time, ctx) of every request.
    by_enqueue: BTreeSet<(u64, u32)>,
    seq: HashMap<u32, u64>,
    next_seq: u64,
}

impl<T> Default for Parked<T> {
    fn default() -> Self {
        Self {
            items: HashMap::new(),
            flows: HashMap::new(),
            by_enqueue: BTreeSet::new(),
            seq: HashMap::new(),
            next_seq: 0,
        }
    }
}

impl<T> Parked<T> {
    /// Number of parked requests.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether nothing is parked.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Whether `ctx` is parked here.
    pub fn contains(&self, ctx: u32) -> bool {
        self.items.contains_key(&ctx)
    }

    /// Parks a request (replacing one with the same ctx).
    pub fn park(&mut self, request: ParkedRequest<T>) {
        self.remove(request.ctx);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.flows
            .entry(request.flow.clone())
            .or_default()
            .insert((request.key, seq), request.ctx);
        self.by_enqueue.insert((request.enqueue_ms, request.ctx));
        self.seq.insert(request.ctx, seq);
        self.items.insert(request.ctx, request);
    }

    /// Removes a parked request (resumed elsewhere, cancelled or expired).
    pub fn remove(&mut self, ctx: u32) -> Option<ParkedRequest<T>> {
        let r = self.items.remove(&ctx)?;
        let seq = self.seq.remove(&ctx).unwrap_or(0);
        if let Some(flow) = self.flows.get_mut(&r.flow) {
            flow.remove(&(r.key, seq));
            if flow.is_empty() {
                self.flows.remove(&r.flow);
            }
        }
        self.by_enqueue.remove(&(r.enqueue_ms, ctx));
        Some(r)
    }

    /// Takes the best request of a flow.
    pub fn pop_best(&mut self, priority: i32, fairness_id: &str) -> Option<ParkedRequest<T>> {
        let ctx = self
            .flows
            .get(&(priority, fairness_id.to_string()))
            .and_then(|f| f.values().next().copied())?;
        self.remove(ctx)
    }

    /// The best `HEADS_PER_QUEUE`-or-fewer requests of a flow after skipping `skip`.
    pub fn heads(&self, priority: i32, fairness_id: &str, skip: usize, max: usize) -> Vec<Head> {
        self.flows
            .get(&(priority, fairness_id.to_string()))
            .map(|f| {
                f.values()
                    .skip(skip)
                    .take(max)
                    .filter_map(|ctx| self.items.get(ctx))
                    .map(|r| r.head)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Requests in a flow.
    pub fn flow_len(&self, priority: i32, fairness_id: &str) -> usize {
        self.flows
            .get(&(priority, fairness_id.to_string()))
            .map_or(0, BTreeMap::len)
    }

    /// Up to `max` requests enqueued at or before `cutoff_ms`, oldest first.
    pub fn expired(&self, cutoff_ms: u64, max: usize) -> Vec<u32> {
        self.by_enqueue
            .iter()
            .take_while(|(t, _)| *t <= cutoff_ms)
            .take(max)
            .map(|(_, ctx)| *ctx)
            .collect()
    }

    /// Up to `max` parked contexts, any order (for shutdown).
    pub fn some(&self, max: usize) -> Vec<u32> {
        self.items.keys().take(max).copied().collect()
    }

    /// A parked request.
    pub fn get(&self, ctx: u32) -> Option<&ParkedRequest<T>> {
        self.items.get(&ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn req(ctx: u32, fid: &str, key: u64, enqueue_ms: u64) -> ParkedRequest<()> {
        ParkedRequest {
            ctx,
            flow: (0, fid.into()),
            key: OrderKey {
                primary: key,
                secondary: key,
            },
            head: Head {
                primary: key,
                secondary: key,
                bytes: 10,
                tokens: 1,
            },
            enqueue_ms,
            data: (),
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn best_first_within_a_flow_with_arrival_breaking_ties() {
        let mut p = Parked::default();
        p.park(req(1, "a", 5, 0));
        p.park(req(2, "a", 3, 0));
        p.park(req(3, "a", 3, 0));
        p.park(req(4, "b", 1, 0));
        assert_eq!(
            p.heads(0, "a", 0, 8)
                .iter()
                .map(|h| h.primary)
                .collect::<Vec<_>>(),
            [3, 3, 5]
        );
        assert_eq!(p.heads(0, "a", 1, 1)[0].primary, 3);
        assert_eq!(p.pop_best(0, "a").unwrap().ctx, 2);
        assert_eq!(p.pop_best(0, "a").unwrap().ctx, 3);
        assert_eq!(p.pop_best(0, "a").unwrap().ctx, 1);
        assert!(p.pop_best(0, "a").is_none());
        assert_eq!(p.len(), 1);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn expiry_and_removal() {
        let mut p = Parked::default();
        p.park(req(1, "a", 0, 100));
        p.park(req(2, "a", 1, 50));
        p.park(req(3, "a", 2, 200));
        assert_eq!(p.expired(49, 10), Vec::<u32>::new());
        assert_eq!(p.expired(100, 10), [2, 1]);
        assert_eq!(p.expired(100, 1), [2]);
        p.remove(2);
        assert_eq!(p.expired(150, 10), [1]);
        assert_eq!(p.flow_len(0, "a"), 2);
        assert!(p.contains(3) && !p.contains(2));
    }
}
