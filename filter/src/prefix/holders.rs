//! The endpoints holding one block of the approximate index, each with the block's stamp in
//! that endpoint's LRU (its insertion position there).
//!
//! A block and everything the index knows of it sit in one map entry, so learning or
//! evicting a block touches one place in memory: with a prefix index of a few hundred
//! thousand blocks every entry touched is a cache miss, and a long prompt inserts hundreds
//! of blocks on every worker. Almost every block is held by one or two endpoints (affinity
//! keeps a prefix together), so up to [`INLINE`] holders live in the entry itself and only a
//! block held more widely allocates.

/// Holders kept without allocating.
pub const INLINE: usize = 2;

/// One holder: the endpoint's id in the index and the block's stamp in its LRU.
pub type Holder = (u32, u64);

/// A block's holders (insertion order kept, each endpoint once).
#[derive(Debug, Clone)]
pub enum Holders {
    /// Up to [`INLINE`] holders: the first `len`.
    Inline { len: u8, at: [Holder; INLINE] },
    /// More than [`INLINE`] holders at some point.
    Spilled(Vec<Holder>),
}

impl Default for Holders {
    fn default() -> Self {
        Holders::Inline {
            len: 0,
            at: [(0, 0); INLINE],
        }
    }
}

impl Holders {
    /// The holders, in insertion order.
    pub fn as_slice(&self) -> &[Holder] {
        match self {
            Holders::Inline { len, at } => at.get(..usize::from(*len)).unwrap_or_default(),
            Holders::Spilled(v) => v,
        }
    }

    fn as_mut_slice(&mut self) -> &mut [Holder] {
        match self {
            Holders::Inline { len, at } => at.get_mut(..usize::from(*len)).unwrap_or_default(),
            Holders::Spilled(v) => v,
        }
    }

    /// Whether no endpoint holds the block.
    pub fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    /// The endpoint ids.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.as_slice().iter().map(|(id, _)| *id)
    }

    /// The block's stamp in endpoint `id`'s LRU, when `id` holds it.
    pub fn stamp(&self, id: u32) -> Option<u64> {
        self.as_slice()
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, s)| *s)
    }

    /// Sets endpoint `id`'s stamp; returns whether `id` is a new holder.
    pub fn set(&mut self, id: u32, stamp: u64) -> bool {
        if let Some(h) = self.as_mut_slice().iter_mut().find(|(i, _)| *i == id) {
            h.1 = stamp;
            return false;
        }
        match self {
            Holders::Inline { len, at } => {
                if let Some(slot) = at.get_mut(usize::from(*len)) {
                    *slot = (id, stamp);
                    *len += 1;
                } else {
                    let mut v = Vec::with_capacity(INLINE * 2);
                    v.extend_from_slice(at);
                    v.push((id, stamp));
                    *self = Holders::Spilled(v);
                }
            }
            Holders::Spilled(v) => v.push((id, stamp)),
        }
        true
    }

    /// Removes endpoint `id` if its stamp is `stamp` (not refreshed since); returns whether
    /// it did.
    pub fn remove_if(&mut self, id: u32, stamp: u64) -> bool {
        let Some(at) = self.as_slice().iter().position(|h| *h == (id, stamp)) else {
            return false;
        };
        match self {
            Holders::Inline { len, at: held } => {
                if let Some(live) = held.get_mut(at..usize::from(*len)) {
                    live.rotate_left(1);
                }
                *len -= 1;
            }
            Holders::Spilled(v) => {
                v.remove(at);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn each_endpoint_holds_once_with_its_latest_stamp_inline_and_spilled() {
        let mut h = Holders::default();
        assert!(h.is_empty());
        assert!(h.set(4, 1) && h.set(7, 2));
        assert!(!h.set(4, 3), "a refresh, not a new holder");
        assert_eq!(h.as_slice(), [(4, 3), (7, 2)]);
        assert!(matches!(h, Holders::Inline { .. }));
        assert!(!h.remove_if(4, 1), "refreshed since: kept");
        assert!(h.remove_if(7, 2));
        assert_eq!(h.ids().collect::<Vec<_>>(), [4]);
        for id in [1, 2, 3] {
            h.set(id, 10 + u64::from(id));
        }
        assert!(matches!(h, Holders::Spilled(_)));
        assert_eq!(h.stamp(2), Some(12));
        assert_eq!(h.stamp(9), None);
        for (id, stamp) in [(4, 3), (1, 11), (2, 12), (3, 13)] {
            assert!(h.remove_if(id, stamp));
        }
        assert!(h.is_empty());
    }
}
