//! The endpoints holding one block of the approximate index: a small set of endpoint ids.
//!
//! Almost every block is held by one or two endpoints (affinity keeps a prefix together),
//! so up to [`INLINE`] ids live in the entry itself and only a block held more widely
//! allocates. A unique 64 KiB prompt inserts 256 new blocks on every worker; without the
//! inline case that was an allocation and a free per block.

/// Ids held without allocating.
pub const INLINE: usize = 3;

/// A set of endpoint ids (insertion order kept).
#[derive(Debug, Clone)]
pub enum Holders {
    /// Up to [`INLINE`] ids: the first `len`.
    Inline { len: u8, ids: [u32; INLINE] },
    /// More than [`INLINE`] ids at some point.
    Spilled(Vec<u32>),
}

impl Default for Holders {
    fn default() -> Self {
        Holders::Inline {
            len: 0,
            ids: [0; INLINE],
        }
    }
}

impl Holders {
    /// The ids, in insertion order.
    pub fn as_slice(&self) -> &[u32] {
        match self {
            Holders::Inline { len, ids } => ids.get(..usize::from(*len)).unwrap_or_default(),
            Holders::Spilled(v) => v,
        }
    }

    /// Whether no endpoint holds the block.
    pub fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    /// Adds `id` unless present.
    pub fn insert(&mut self, id: u32) {
        if self.as_slice().contains(&id) {
            return;
        }
        match self {
            Holders::Inline { len, ids } => {
                if let Some(slot) = ids.get_mut(usize::from(*len)) {
                    *slot = id;
                    *len += 1;
                } else {
                    let mut v = Vec::with_capacity(INLINE * 2);
                    v.extend_from_slice(ids);
                    v.push(id);
                    *self = Holders::Spilled(v);
                }
            }
            Holders::Spilled(v) => v.push(id),
        }
    }

    /// Removes `id` if present.
    pub fn remove(&mut self, id: u32) {
        match self {
            Holders::Inline { len, ids } => {
                let n = usize::from(*len);
                if let Some(at) = ids.get(..n).and_then(|s| s.iter().position(|x| *x == id)) {
                    if let Some(live) = ids.get_mut(at..n) {
                        live.rotate_left(1);
                    }
                    *len -= 1;
                }
            }
            Holders::Spilled(v) => v.retain(|x| *x != id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn a_set_keeps_order_and_each_id_once_inline_and_spilled() {
        let mut h = Holders::default();
        assert!(h.is_empty());
        for id in [4, 7, 4, 9] {
            h.insert(id);
        }
        assert_eq!(h.as_slice(), [4, 7, 9]);
        assert!(matches!(h, Holders::Inline { .. }));
        h.remove(7);
        assert_eq!(h.as_slice(), [4, 9]);
        h.remove(42);
        assert_eq!(h.as_slice(), [4, 9]);
        for id in [1, 2, 3] {
            h.insert(id);
        }
        assert!(matches!(h, Holders::Spilled(_)));
        assert_eq!(h.as_slice(), [4, 9, 1, 2, 3]);
        for id in [4, 9, 1, 2, 3] {
            h.remove(id);
        }
        assert!(h.is_empty());
    }
}
