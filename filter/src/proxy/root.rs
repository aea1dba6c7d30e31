//! The root context: loads the configuration (refusing a bad one, with the reason in
//! Envoy's log), ticks (ledger heartbeat, scrape lease, scrapes, discovery, pool gauges),
//! receives the scrape callouts, and creates one [`Http`] context per request.

use super::http::Http;
use super::state::Runtime;
use super::{host, scrape, stats, store::HostStore};
use crate::config::Config;
use crate::metrics;
use crate::prefix::shared::HEAD_KEY;
use crate::shared_store::{ensure, update};
use crate::{inflight, registry};
use prost::Message;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use std::cell::Cell;
use std::rc::Rc;

/// Shared-data key of the counter that hands out VM ids.
const VM_SEQ_KEY: &str = "epp.v1.vm-seq";
/// Tick period when nothing is scraped: the liveness heartbeat of this VM's ledger row.
const IDLE_TICK_MS: u64 = 1_000;
/// The ledger heartbeat is written at most this often.
const HEARTBEAT_MS: i64 = 1_000;

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
    runtime: Option<Rc<Runtime>>,
    last_heartbeat_ms: i64,
}

impl Root {
    fn load(text: &str) -> Result<Runtime, String> {
        let config = Config::parse(text).map_err(|e| e.to_string())?;
        let scheduler = registry::build(&config).map_err(|e| e.to_string())?;
        let settings = registry::data_layer(&config).map_err(|e| e.to_string())?;
        let sessions = config
            .plugins
            .iter()
            .any(|p| p.type_name == "session-affinity-scorer");
        Ok(Runtime {
            config,
            scheduler,
            settings,
            sessions,
        })
    }
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        if let Some(rt) = &self.runtime {
            scrape::on_response(rt, token_id, body_size);
        }
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
        let text = String::from_utf8_lossy(&text);
        match Self::load(&text) {
            Ok(rt) => {
                if rt.config.pool.endpoints.is_empty() && rt.config.pool.discovery.is_none() {
                    log::warn!("pool.endpoints is empty and no discovery is configured: every request will get 503");
                }
                for key in [inflight::LEDGER_KEY, HEAD_KEY] {
                    if let Err(e) = ensure(&HostStore, key) {
                        log::warn!("cannot create {key}: {e:?}");
                    }
                }
                let period = if rt.settings.enabled || rt.config.pool.discovery.is_some() {
                    let mut p = rt.settings.interval_ms;
                    if let Some(d) = &rt.config.pool.discovery {
                        p = p.min(d.refresh_ms);
                    }
                    p.clamp(1, IDLE_TICK_MS)
                } else {
                    IDLE_TICK_MS
                };
                if let Err(status) =
                    host::set_tick_period_ms(u32::try_from(period).unwrap_or(1_000))
                {
                    log::warn!("cannot set the tick period: status {status}");
                }
                // A set, not an increment: every VM writing 1 still reads 1.
                stats::set(&metrics::INFO, &[metrics::COMMIT, metrics::BUILD_REF], 1);
                self.runtime = Some(Rc::new(rt));
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
        let vm = vm_id();
        if now.saturating_sub(self.last_heartbeat_ms) >= HEARTBEAT_MS {
            self.last_heartbeat_ms = now;
            if let Err(e) = inflight::heartbeat(&HostStore, vm, now) {
                log::warn!("in-flight ledger heartbeat failed: {e:?}");
            }
        }
        if let Some(rt) = &self.runtime {
            scrape::tick(rt, vm, now);
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let rt = self.runtime.clone()?;
        Some(Box::new(Http::new(context_id, rt, vm_id())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
