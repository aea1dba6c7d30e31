//! The process-wide key/value store shared by every Envoy worker's VM, as the core sees it.
//!
//! Envoy's shared data is one map per `vm_id`, guarded by a lock, with a CAS token per
//! value. The proxy layer implements [`SharedStore`] on the host calls; tests use
//! [`MemoryStore`], which copies Envoy's semantics (CAS 0 means "unconditional", a
//! missing key can always be written, tokens come from one global counter).

use prost::Message;
use std::cell::RefCell;
use std::collections::HashMap;

/// Why a store operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreError {
    /// Another VM wrote the key since it was read.
    CasMismatch,
    /// The host refused the call; the proxy-wasm status code.
    Host(u32),
    /// The stored bytes are not a record this build understands.
    Corrupt,
    /// Every attempt of a CAS loop lost the race.
    Contended,
}

/// A value read from the store with its CAS token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    /// The stored bytes.
    pub bytes: Vec<u8>,
    /// The token to pass back to [`SharedStore::set`] for a conditional write.
    pub cas: u32,
}

/// Process-wide shared data with compare-and-swap.
pub trait SharedStore {
    /// Reads a key; `None` when it was never written.
    fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError>;
    /// Writes a key; with `cas != 0` only if nobody wrote it since the read that gave `cas`.
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError>;
}

/// How many times a CAS loop retries before giving up. Contention on one key between
/// a handful of workers resolves in a few attempts; this bound keeps a callback's work finite.
pub const MAX_CAS_ATTEMPTS: usize = 64;

/// Reads the record at `key` (default when absent or corrupt: a record that does not
/// decode is replaced), applies `change`, and writes it back with CAS, retrying on a
/// lost race. Returns what `change` returned on the attempt that won.
///
/// Envoy cannot create a key conditionally (a write to a missing key always succeeds),
/// so two first writers can race; create hot keys at configure time ([`ensure`]).
pub fn update<M, R>(
    store: &impl SharedStore,
    key: &str,
    change: impl FnMut(&mut M) -> R,
) -> Result<R, StoreError>
where
    M: Message + Default,
{
    update_record(store, key, |b| M::decode(b).ok(), M::encode_to_vec, change)
}

/// [`update`] for a record with its own byte layout: `decode` (`None`: corrupt, started
/// afresh) and `encode`.
pub fn update_record<M: Default, R>(
    store: &impl SharedStore,
    key: &str,
    decode: impl Fn(&[u8]) -> Option<M>,
    encode: impl Fn(&M) -> Vec<u8>,
    mut change: impl FnMut(&mut M) -> R,
) -> Result<R, StoreError> {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (mut record, cas) = match store.get(key)? {
            Some(v) => match decode(v.bytes.as_slice()) {
                Some(m) => (m, v.cas),
                None => {
                    // A corrupt or truncated record would fail every update forever:
                    // start it afresh (the write replaces it with its CAS token).
                    log::warn!("shared record {key} is corrupt; starting it afresh");
                    (M::default(), v.cas)
                }
            },
            None => (M::default(), 0),
        };
        let result = change(&mut record);
        match store.set(key, &encode(&record), cas) {
            Ok(()) => return Ok(result),
            Err(StoreError::CasMismatch) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Contended)
}

/// Creates `key` with an empty record if it does not exist yet.
pub fn ensure(store: &impl SharedStore, key: &str) -> Result<(), StoreError> {
    if store.get(key)?.is_none() {
        store.set(key, &[], 0)?;
    }
    Ok(())
}

/// Reads and decodes the record at `key`; `None` when absent.
pub fn read<M: Message + Default>(
    store: &impl SharedStore,
    key: &str,
) -> Result<Option<M>, StoreError> {
    match store.get(key)? {
        Some(v) => M::decode(v.bytes.as_slice())
            .map(Some)
            .map_err(|_| StoreError::Corrupt),
        None => Ok(None),
    }
}

/// An in-memory [`SharedStore`] with Envoy's semantics, for tests and native tools.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: RefCell<(HashMap<String, Versioned>, u32)>,
}

impl SharedStore for MemoryStore {
    fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
        Ok(self.inner.borrow().0.get(key).cloned())
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        let mut inner = self.inner.borrow_mut();
        let (map, counter) = &mut *inner;
        if let Some(existing) = map.get(key) {
            if cas != 0 && cas != existing.cas {
                return Err(StoreError::CasMismatch);
            }
        }
        *counter = counter.wrapping_add(1).max(1);
        map.insert(
            key.to_string(),
            Versioned {
                bytes: value.to_vec(),
                cas: *counter,
            },
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[derive(Clone, PartialEq, Message)]
    struct Counter {
        #[prost(uint64, tag = "1")]
        n: u64,
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn stale_cas_is_refused() {
        let s = MemoryStore::default();
        s.set("k", b"a", 0).unwrap();
        let first = s.get("k").unwrap().unwrap();
        s.set("k", b"b", first.cas).unwrap();
        assert_eq!(s.set("k", b"c", first.cas), Err(StoreError::CasMismatch));
        assert_eq!(s.get("k").unwrap().unwrap().bytes, b"b");
    }

    /// A store whose first `n` writes lose the race to another worker that increments.
    struct Racy {
        store: MemoryStore,
        losses: RefCell<u32>,
    }

    impl SharedStore for Racy {
        fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
            self.store.get(key)
        }
        fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
            if *self.losses.borrow() > 0 {
                *self.losses.borrow_mut() -= 1;
                // The other worker's increment lands first.
                update(&self.store, key, |c: &mut Counter| c.n += 1)?;
            }
            self.store.set(key, value, cas)
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn update_retries_until_its_change_applies_on_the_latest_value() {
        let s = Racy {
            store: MemoryStore::default(),
            losses: RefCell::new(3),
        };
        ensure(&s.store, "k").unwrap();
        for _ in 0..2 {
            update(&s, "k", |c: &mut Counter| c.n += 10).unwrap();
        }
        let c: Counter = read(&s, "k").unwrap().unwrap();
        assert_eq!(
            c.n, 23,
            "3 concurrent increments and our 2 additions of 10, none lost"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn update_gives_up_after_a_bounded_number_of_attempts() {
        let s = Racy {
            store: MemoryStore::default(),
            losses: RefCell::new(u32::MAX),
        };
        s.store.set("k", b"", 0).unwrap();
        assert_eq!(
            update(&s, "k", |c: &mut Counter| c.n += 1),
            Err(StoreError::Contended)
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn garbage_is_reported_not_misread() {
        let s = MemoryStore::default();
        s.set("k", &[0xff, 0xff, 0xff], 0).unwrap();
        assert_eq!(read::<Counter>(&s, "k"), Err(StoreError::Corrupt));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn an_update_replaces_a_corrupt_record_instead_of_failing_forever() {
        let s = MemoryStore::default();
        s.set("k", &[0xff, 0xff, 0xff], 0).unwrap();
        assert_eq!(update(&s, "k", |c: &mut Counter| c.n += 1), Ok(()));
        assert_eq!(read::<Counter>(&s, "k"), Ok(Some(Counter { n: 1 })));
    }
}
