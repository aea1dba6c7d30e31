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

    /// The earliest event at or before `until` for which `eligible` holds; the others keep
    /// their places.
    pub fn pop_matching(
        &mut self,
        until: Nanos,
        mut eligible: impl FnMut(&E) -> bool,
    ) -> Option<(Nanos, E)> {
        let mut skipped = Vec::new();
        let mut found = None;
        while let Some(Reverse(key)) = self.heap.peek().copied() {
            if key.0 > until {
                break;
            }
            self.heap.pop();
            let ok = self.slots[key.3].as_ref().is_some_and(&mut eligible);
            if ok {
                found = Some(key);
                break;
            }
            skipped.push(key);
        }
        for key in skipped {
            self.heap.push(Reverse(key));
        }
        let (at, _, _, slot) = found?;
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
