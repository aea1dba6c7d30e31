//! The discrete-event queue: events ordered by virtual time, ties broken by a seeded key
//! so that a different seed explores a different order of simultaneous events.

use super::clock::Nanos;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A queue of `E` ordered by (time, seeded tie-break, insertion order).
pub struct EventQueue<E> {
    heap: BinaryHeap<Reverse<(Nanos, u32, u64, usize)>>,
    slots: Vec<Option<E>>,
    free: Vec<usize>,
    seq: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self {
            heap: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            seq: 0,
        }
    }
}

impl<E> EventQueue<E> {
    /// Schedules `event` at `at`; `tie` orders it among events of the same time.
    pub fn push(&mut self, at: Nanos, tie: u32, event: E) {
        let slot = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(event);
                i
            }
            None => {
                self.slots.push(Some(event));
                self.slots.len() - 1
            }
        };
        self.seq += 1;
        self.heap.push(Reverse((at, tie, self.seq, slot)));
    }

    /// The earliest event and its time.
    pub fn pop(&mut self) -> Option<(Nanos, E)> {
        let Reverse((at, _, _, slot)) = self.heap.pop()?;
        let e = self.slots[slot].take()?;
        self.free.push(slot);
        Some((at, e))
    }

    /// Time of the earliest event.
    pub fn peek_time(&self) -> Option<Nanos> {
        self.heap.peek().map(|Reverse((t, ..))| *t)
    }

    /// Number of scheduled events.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// True when nothing is scheduled.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}
