//! The scraper lease: one VM at a time scrapes and publishes.
//!
//! Every VM ticks, so each one calls [`try_acquire`] on its tick. The holder renews the
//! lease (expiry `now + ttl`); the others see it held and do nothing. When the holder dies
//! (VM crash, worker gone) its lease expires and the next VM to tick takes it over; the
//! CAS write makes the take-over exclusive. `epoch` counts hand-overs.

use crate::shared_store::{read, SharedStore, StoreError};
use prost::Message;

/// Shared-data key of the lease.
pub const LEASE_KEY: &str = "epp.v1.scrape-lease";

/// The lease record.
#[derive(Clone, PartialEq, Message)]
pub struct Lease {
    /// The VM holding it (0: nobody).
    #[prost(uint64, tag = "1")]
    pub holder: u64,
    /// When it expires unless renewed (ms).
    #[prost(int64, tag = "2")]
    pub expires_ms: i64,
    /// Incremented on every change of holder.
    #[prost(uint64, tag = "3")]
    pub epoch: u64,
}

/// Lease time-to-live for a scrape interval: 20 intervals, at least one second.
pub fn ttl_ms(interval_ms: u64) -> i64 {
    i64::try_from(interval_ms.saturating_mul(20).max(1_000)).unwrap_or(i64::MAX)
}

/// Takes or renews the lease for `vm`. `Ok(true)` when `vm` holds it afterwards.
pub fn try_acquire(
    store: &impl SharedStore,
    vm: u64,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<bool, StoreError> {
    let (lease, cas) = match store.get(LEASE_KEY)? {
        // A corrupt lease is taken over as an expired one (else nobody would scrape
        // again).
        Some(v) => (Lease::decode(v.bytes.as_slice()).unwrap_or_default(), v.cas),
        None => (Lease::default(), 0),
    };
    let mine = lease.holder == vm;
    if !mine && lease.holder != 0 && lease.expires_ms > now_ms {
        return Ok(false);
    }
    let next = Lease {
        holder: vm,
        expires_ms: now_ms.saturating_add(ttl_ms),
        epoch: if mine {
            lease.epoch
        } else {
            lease.epoch.wrapping_add(1)
        },
    };
    match store.set(LEASE_KEY, &next.encode_to_vec(), cas) {
        Ok(()) => Ok(true),
        Err(StoreError::CasMismatch) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The current holder (0 when none or expired).
pub fn holder(store: &impl SharedStore, now_ms: i64) -> Result<u64, StoreError> {
    Ok(read::<Lease>(store, LEASE_KEY)?
        .filter(|l| l.expires_ms > now_ms)
        .map_or(0, |l| l.holder))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared_store::MemoryStore;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn one_holder_at_a_time_and_the_lease_moves_when_it_dies() {
        let s = MemoryStore::default();
        let ttl = ttl_ms(50);
        assert_eq!(ttl, 1000);
        assert!(try_acquire(&s, 1, 0, ttl).unwrap());
        assert!(!try_acquire(&s, 2, 10, ttl).unwrap(), "held by VM 1");
        assert!(try_acquire(&s, 1, 500, ttl).unwrap(), "renewed");
        assert!(
            !try_acquire(&s, 2, 1400, ttl).unwrap(),
            "renewal extended it"
        );
        // VM 1 dies: no renewal after 500; at 1500 the lease has expired.
        assert!(try_acquire(&s, 2, 1501, ttl).unwrap());
        assert_eq!(holder(&s, 1502).unwrap(), 2);
        let l: Lease = read(&s, LEASE_KEY).unwrap().unwrap();
        assert_eq!(l.epoch, 2);
        assert!(
            !try_acquire(&s, 1, 1600, ttl).unwrap(),
            "the old holder does not take it back"
        );
    }
}
