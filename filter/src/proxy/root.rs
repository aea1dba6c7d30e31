//! The root context: loads the configuration (refusing a bad one, with the reason in
//! Envoy's log), runs the VM's periodic work (liveness, flow control, the scrape lease,
//! scrapes, discovery, pool gauges), receives messages from other VMs and the scrape
//! callouts, and creates one [`Http`] context per request.

use super::abi::{Context, ContextType, HttpContext, RootContext};
use super::http::Http;
use super::{flow, host, latency, scrape, stats, store::HostStore, vm};
use crate::inflight;
use crate::metrics;
use crate::prefix::shared::HEAD_KEY;
use crate::runtime::{self, Runtime};
use crate::shared_store::ensure;
use std::rc::Rc;

/// Tick period with flow control on: TTL expiry precision and the safety net for lost
/// wake-up messages.
const FLOW_TICK_MS: u64 = 20;
/// Tick period when nothing else needs one: the liveness heartbeat of this VM's ledger row.
const IDLE_TICK_MS: u64 = 1_000;
/// Tick period with a latency producer: how often samples are pushed and trained on.
const LATENCY_TICK_MS: u64 = 100;
/// The ledger heartbeat is written at most this often.
const HEARTBEAT_MS: i64 = 1_000;

/// One per plugin per VM.
pub struct Root {
    id: u32,
    runtime: Option<Rc<Runtime>>,
    last_heartbeat_ms: i64,
}

impl Root {
    pub fn new(id: u32) -> Self {
        Self {
            id,
            runtime: None,
            last_heartbeat_ms: 0,
        }
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
            super::kv_events::on_response(rt, token_id, body_size);
        }
    }

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
        let rt = match runtime::load(&String::from_utf8_lossy(&text)) {
            Ok(rt) => Rc::new(rt),
            Err(e) => {
                // Envoy refuses the filter and logs this line: the user sees why.
                log::error!("{e}");
                return false;
            }
        };
        if rt.pool.endpoints.is_empty() && rt.pool.discovery.is_none() {
            log::warn!(
                "pool.endpoints is empty and no discovery is configured: every request will get 503"
            );
        }
        // The models the configuration names are served from the start (metric labels).
        stats::served(&crate::model_rewrite::configured_models(&rt.pool));
        let plugin_vm_id = host::property(&["plugin_vm_id"])
            .ok()
            .flatten()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let root = self.id;
        let runtime = rt.clone();
        vm::with(|vm| {
            vm.runtime = Some(runtime);
            // The pool's endpoints may differ: the candidates are made afresh.
            vm.view.forget_pool();
            vm.root_context = root;
            vm.plugin_vm_id = plugin_vm_id;
        });
        // Created before the first id is taken: two VMs taking the first id at once would
        // both write a missing key unconditionally (Envoy has no conditional create). The
        // main thread's VM is configured before the workers' are cloned, so it creates it.
        if let Err(e) = ensure(&HostStore, vm::VM_SEQ_KEY) {
            log::warn!("cannot create {}: {e:?}", vm::VM_SEQ_KEY);
        }
        vm::id();
        for key in [inflight::LEDGER_KEY, HEAD_KEY] {
            if let Err(e) = ensure(&HostStore, key) {
                log::warn!("cannot create {key}: {e:?}");
            }
        }
        let mut tick = IDLE_TICK_MS;
        if rt.flow.enabled {
            flow::configure();
            tick = FLOW_TICK_MS;
        }
        if rt.data_layer.enabled {
            tick = tick.min(rt.data_layer.interval_ms);
        }
        if let Some(d) = &rt.pool.discovery {
            tick = tick.min(d.refresh_ms);
        }
        if rt.scheduler.latency.is_some() {
            tick = tick.min(LATENCY_TICK_MS);
        }
        if let Some(p) = &rt.scheduler.precise {
            tick = tick.min(p.poll_interval_ms);
        }
        if let Err(status) = host::set_tick_period_ms(u32::try_from(tick.max(1)).unwrap_or(1_000)) {
            log::warn!("cannot set the tick period: status {status}");
        }
        // A set, not an increment: every VM writing 1 still reads 1.
        stats::set(&metrics::INFO, &[metrics::COMMIT, metrics::BUILD_REF], 1);
        stats::flush();
        self.runtime = Some(rt);
        true
    }

    fn on_tick(&mut self) {
        let now = host::clock_ms();
        let id = vm::id();
        if now.saturating_sub(self.last_heartbeat_ms) >= HEARTBEAT_MS {
            self.last_heartbeat_ms = now;
            if let Err(e) = inflight::heartbeat(&HostStore, id, now) {
                log::warn!("in-flight ledger heartbeat failed: {e:?}");
            }
            // From every VM that routes (the scrape lease holder may not).
            scrape::prefix_index_size();
        }
        if let Some(rt) = &self.runtime {
            scrape::tick(rt, id, now);
            latency::tick(rt, id, now);
            super::kv_events::tick(rt, now);
            if rt.pool.metrics_endpoint.is_some() {
                stats::publish(id, now, false);
            }
            stats::expire(id, now, rt.pool.idle_series_ms());
        }
        stats::flush();
        flow::on_tick(self.id);
        // Finishing a shutdown that had more parked requests than one batch (a failed
        // `proxy_done` is retried on the next tick).
        if vm::with(|vm| vm.draining).unwrap_or(false) && flow::shutdown(self.id) {
            match host::done() {
                Ok(()) => {
                    vm::with(|vm| vm.draining = false);
                }
                Err(status) => {
                    log::warn!("cannot finish the shutdown (will retry): status {status}")
                }
            }
        }
    }

    fn on_queue_ready(&mut self, _queue_id: u32) {
        flow::on_inbox(self.id);
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let rt = self.runtime.clone()?;
        Some(Box::new(Http::new(context_id, rt)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
