//! The root context: loads the configuration, keeps this VM alive in the ledger, and
//! creates one [`Http`] context per request.

use super::http::Http;
use super::{host, store::HostStore};
use crate::config::Config;
use crate::inflight;
use crate::shared_store::{ensure, update};
use prost::Message;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use std::cell::Cell;
use std::rc::Rc;

/// Shared-data key of the counter that hands out VM ids.
const VM_SEQ_KEY: &str = "epp.v1.vm-seq";
/// Tick period: the liveness heartbeat of this VM's ledger row.
const TICK_MS: u32 = 1_000;

#[derive(Clone, PartialEq, Message)]
struct Seq {
    #[prost(uint64, tag = "1")]
    next: u64,
}

thread_local! {
    static VM_ID: Cell<u64> = const { Cell::new(0) };
}

/// This VM's process-unique id (one VM per thread), allocated on first use.
pub fn vm_id() -> u64 {
    let id = VM_ID.with(Cell::get);
    if id != 0 {
        return id;
    }
    let allocated = update(&HostStore, VM_SEQ_KEY, |s: &mut Seq| {
        s.next += 1;
        s.next
    });
    match allocated {
        Ok(id) => {
            VM_ID.with(|c| c.set(id));
            id
        }
        Err(e) => {
            // Without a unique id this VM's counts could merge with another's; use a
            // random-ish id from the clock rather than fail requests.
            let fallback = host::now_ms().map_or(u64::MAX, |t| t.unsigned_abs() | (1 << 63));
            log::warn!("cannot allocate a VM id ({e:?}); using {fallback}");
            VM_ID.with(|c| c.set(fallback));
            fallback
        }
    }
}

/// One per plugin per VM.
#[derive(Default)]
pub struct Root {
    config: Option<Rc<Config>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let text = match host::plugin_configuration() {
            Ok(bytes) => bytes,
            Err(status) => {
                log::error!("cannot read the plugin configuration: status {status}");
                return false;
            }
        };
        let text = String::from_utf8_lossy(&text);
        match Config::parse(&text) {
            Ok(config) => {
                if config.pool.endpoints.is_empty() {
                    log::warn!("pool.endpoints is empty: every request will get 503");
                }
                if let Err(e) = ensure(&HostStore, inflight::LEDGER_KEY) {
                    log::warn!("cannot create the in-flight ledger: {e:?}");
                }
                if let Err(status) = host::set_tick_period_ms(TICK_MS) {
                    log::warn!("cannot set the tick period: status {status}");
                }
                self.config = Some(Rc::new(config));
                true
            }
            Err(e) => {
                // Envoy refuses the filter and logs this line: the user sees why.
                log::error!("{e}");
                false
            }
        }
    }

    fn on_tick(&mut self) {
        let Ok(now) = host::now_ms() else { return };
        if let Err(e) = inflight::heartbeat(&HostStore, vm_id(), now) {
            log::warn!("in-flight ledger heartbeat failed: {e:?}");
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let config = self.config.clone().unwrap_or_default();
        Some(Box::new(Http::new(context_id, config, vm_id())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
