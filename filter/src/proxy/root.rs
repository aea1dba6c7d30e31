//! The root context: loads the configuration, runs the VM's periodic work (liveness,
//! flow control), receives messages from other VMs, and creates one [`Http`] context
//! per request.

use super::http::Http;
use super::{flow, host, store::HostStore, vm};
use crate::config::Config;
use crate::inflight;
use crate::shared_store::ensure;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use std::rc::Rc;

/// Tick period with flow control on: TTL expiry precision and the safety net for lost
/// wake-up messages.
const FLOW_TICK_MS: u32 = 20;
/// Tick period otherwise: the liveness heartbeat of this VM's in-flight counts.
const TICK_MS: u32 = 1_000;

/// One per plugin per VM.
pub struct Root {
    id: u32,
    config: Option<Rc<Config>>,
}

impl Root {
    pub fn new(id: u32) -> Self {
        Self { id, config: None }
    }
}

impl Context for Root {
    fn on_done(&mut self) -> bool {
        // Envoy is removing the plugin: answer what is parked (500), a batch at a time;
        // the tick finishes the rest and then tells Envoy we are done.
        let done = flow::shutdown(self.id);
        if done {
            vm::with(|vm| vm.draining = false);
        }
        done
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let text = match host::plugin_configuration() {
            Ok(bytes) => bytes,
            Err(status) => {
                log::error!("cannot read the plugin configuration: status {status}");
                return false;
            }
        };
        let config = match Config::parse(&String::from_utf8_lossy(&text)) {
            Ok(c) => Rc::new(c),
            Err(e) => {
                // Envoy refuses the filter and logs this line: the user sees why.
                log::error!("{e}");
                return false;
            }
        };
        if config.pool.endpoints.is_empty() {
            log::warn!("pool.endpoints is empty: every request will get 503");
        }
        let plugin_vm_id = host::property(&["plugin_vm_id"])
            .ok()
            .flatten()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let root = self.id;
        vm::with(|vm| {
            vm.config = config.clone();
            vm.root_context = root;
            vm.plugin_vm_id = plugin_vm_id;
        });
        vm::id();
        if let Err(e) = ensure(&HostStore, inflight::LEDGER_KEY) {
            log::warn!("cannot create the in-flight ledger: {e:?}");
        }
        let tick = if config.flow.enabled {
            flow::configure();
            FLOW_TICK_MS
        } else {
            TICK_MS
        };
        if let Err(status) = host::set_tick_period_ms(tick) {
            log::warn!("cannot set the tick period: status {status}");
        }
        self.config = Some(config);
        true
    }

    fn on_tick(&mut self) {
        if let Ok(now) = host::now_ms() {
            if let Err(e) = inflight::heartbeat(&HostStore, vm::id(), now) {
                log::warn!("in-flight ledger heartbeat failed: {e:?}");
            }
        }
        flow::on_tick(self.id);
        // Finishing a shutdown that had more parked requests than one batch.
        if vm::with(|vm| vm.draining).unwrap_or(false) && flow::shutdown(self.id) {
            vm::with(|vm| vm.draining = false);
            if let Err(status) = host::done() {
                log::warn!("cannot finish the shutdown: status {status}");
            }
        }
    }

    fn on_queue_ready(&mut self, _queue_id: u32) {
        flow::on_inbox(self.id);
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let config = self.config.clone().unwrap_or_default();
        Some(Box::new(Http::new(context_id, config)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
