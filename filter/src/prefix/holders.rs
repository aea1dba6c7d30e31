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

/// A block's holders (insertion order kept, each endpoint once). Inline, ids and stamps
/// are kept apart so the entry packs into 32 bytes.
#[derive(Debug, Clone)]
pub enum Holders {
    /// Up to [`INLINE`] holders: the first `len` of each array.
    Inline {
        len: u8,
        ids: [u32; INLINE],
        stamps: [u64; INLINE],
    },
    /// More than [`INLINE`] holders at some point.
    Spilled(Vec<Holder>),
}

impl Default for Holders {
    fn default() -> Self {
        Holders::Inline {
            len: 0,
            ids: [0; INLINE],
            stamps: [0; INLINE],
        }
    }
}

impl Holders {
    fn len(&self) -> usize {
        match self {
            Holders::Inline { len, .. } => usize::from(*len),
            Holders::Spilled(v) => v.len(),
        }
    }

    fn at(&self, i: usize) -> Option<Holder> {
        match self {
            Holders::Inline { ids, stamps, .. } => Some((*ids.get(i)?, *stamps.get(i)?)),
            Holders::Spilled(v) => v.get(i).copied(),
        }
    }

    /// Whether no endpoint holds the block.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The holders, in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = Holder> + '_ {
        (0..self.len()).filter_map(|i| self.at(i))
    }

    /// The endpoint ids.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.iter().map(|(id, _)| id)
    }

    fn position(&self, id: u32) -> Option<usize> {
        match self {
            Holders::Inline { len, ids, .. } => ids
                .get(..usize::from(*len))
                .and_then(|live| live.iter().position(|i| *i == id)),
            Holders::Spilled(v) => v.iter().position(|(i, _)| *i == id),
        }
    }

    /// The block's stamp in endpoint `id`'s LRU, when `id` holds it.
    pub fn stamp(&self, id: u32) -> Option<u64> {
        self.at(self.position(id)?).map(|(_, s)| s)
    }

    /// Sets endpoint `id`'s stamp; returns whether `id` is a new holder.
    pub fn set(&mut self, id: u32, stamp: u64) -> bool {
        let found = self.position(id);
        match self {
            Holders::Inline { len, ids, stamps } => {
                if let Some(s) = found.and_then(|i| stamps.get_mut(i)) {
                    *s = stamp;
                    return false;
                }
                let n = usize::from(*len);
                match (ids.get_mut(n), stamps.get_mut(n)) {
                    (Some(i), Some(s)) => {
                        (*i, *s) = (id, stamp);
                        *len += 1;
                    }
                    _ => {
                        let mut v: Vec<Holder> = Vec::with_capacity(INLINE * 2);
                        v.extend(ids.iter().copied().zip(stamps.iter().copied()));
                        v.push((id, stamp));
                        *self = Holders::Spilled(v);
                    }
                }
            }
            Holders::Spilled(v) => {
                if let Some(h) = found.and_then(|i| v.get_mut(i)) {
                    h.1 = stamp;
                    return false;
                }
                v.push((id, stamp));
            }
        }
        true
    }

    /// Removes endpoint `id` if its stamp is `stamp` (not refreshed since); returns whether
    /// it did.
    pub fn remove_if(&mut self, id: u32, stamp: u64) -> bool {
        let Some(at) = self
            .position(id)
            .filter(|i| self.at(*i) == Some((id, stamp)))
        else {
            return false;
        };
        match self {
            Holders::Inline { len, ids, stamps } => {
                let n = usize::from(*len);
                if let (Some(i), Some(s)) = (ids.get_mut(at..n), stamps.get_mut(at..n)) {
                    i.rotate_left(1);
                    s.rotate_left(1);
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
        assert_eq!(h.iter().collect::<Vec<_>>(), [(4, 3), (7, 2)]);
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
        // The index's memory is mostly these entries.
        assert!(std::mem::size_of::<Holders>() <= 32);
    }
}
