//! Envoy's shared data as the core's [`SharedStore`].

use super::host;
use crate::shared_store::{SharedStore, StoreError, Versioned};

/// The process-wide shared data of this filter's `vm_id`.
pub struct HostStore;

impl SharedStore for HostStore {
    fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
        match host::get_shared(key) {
            Ok(v) => Ok(v.map(|(bytes, cas)| Versioned { bytes, cas })),
            Err(status) => Err(StoreError::Host(status)),
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        match host::set_shared(key, value, cas) {
            Ok(()) => Ok(()),
            Err(host::CAS_MISMATCH) => Err(StoreError::CasMismatch),
            Err(status) => Err(StoreError::Host(status)),
        }
    }
}
