//! The shared-queue imports. Queues are keyed by (`vm_id`, name); the last VM to
//! register one receives its `on_queue_ready`, which the world delivers after the
//! enqueueing callback returns. Enqueueing is a preemption point.

use super::memory::{arg, give, read, read_str, write_u32, C};
use super::preempt::maybe_yield;
use super::status::{EMPTY, NOT_FOUND, OK};
use crate::host::effects::Outgoing;
use crate::host::lock;
use crate::host::shared::QueueOwner;
use anyhow::Result;
use wasmtime::Val;

/// `proxy_register_shared_queue(name, name_size, out_token)`.
pub fn register(c: C, p: &[Val]) -> Result<u32> {
    let name = read_str(c, arg(p, 0), arg(p, 1))?;
    let token = {
        let h = c.data();
        let owner = QueueOwner {
            slot: h.slot,
            root: h.root_id,
        };
        lock(&h.shared).register_queue(&h.vm_id, &name, owner)
    };
    write_u32(c, arg(p, 2), token)?;
    Ok(OK)
}

/// `proxy_resolve_shared_queue(vm_id, vm_id_size, name, name_size, out_token)`; an
/// empty `vm_id` is the caller's.
pub fn resolve(c: C, p: &[Val]) -> Result<u32> {
    let vm_id = read_str(c, arg(p, 0), arg(p, 1))?;
    let name = read_str(c, arg(p, 2), arg(p, 3))?;
    let token = {
        let h = c.data();
        let vm_id = if vm_id.is_empty() {
            h.vm_id.clone()
        } else {
            vm_id
        };
        lock(&h.shared).resolve_queue(&vm_id, &name)
    };
    match token {
        Some(t) => {
            write_u32(c, arg(p, 4), t)?;
            Ok(OK)
        }
        None => Ok(NOT_FOUND),
    }
}

/// `proxy_enqueue_shared_queue(token, data, data_size)`: notifies the queue's owner.
pub async fn enqueue(c: C<'_, '_>, p: &[Val]) -> Result<u32> {
    maybe_yield(c).await;
    let token = arg(p, 0);
    let value = read(c, arg(p, 1), arg(p, 2))?;
    let h = c.data_mut();
    let owner = lock(&h.shared).enqueue(token, &value);
    match owner {
        Some(o) => {
            h.outgoing.push(Outgoing::QueueReady {
                slot: o.slot,
                root: o.root,
                token,
            });
            Ok(OK)
        }
        None => Ok(NOT_FOUND),
    }
}

/// `proxy_dequeue_shared_queue(token, out_ptr, out_size)`.
pub async fn dequeue(c: C<'_, '_>, p: &[Val]) -> Result<u32> {
    let token = arg(p, 0);
    let r = lock(&c.data().shared).dequeue(token);
    match r {
        Err(()) => Ok(NOT_FOUND),
        Ok(None) => Ok(EMPTY),
        Ok(Some(v)) => {
            give(c, &v, arg(p, 1), arg(p, 2)).await?;
            Ok(OK)
        }
    }
}
