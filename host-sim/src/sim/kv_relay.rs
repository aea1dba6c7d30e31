//! The KV-event relay's side of the world: [`Sim::add_kv_relay`] and the answers to the
//! filter's callouts on its cluster (see [`crate::world::kv_relay`]).

use super::Sim;
use crate::host::vm::{CalloutResponse, Cluster};
use crate::world::kv_relay::{KvRelayConfig, WorldRelay};

impl Sim {
    /// Runs `kv-relay` beside the servers: every server publishing KV events
    /// ([`VllmConfig::kv_events`](crate::VllmConfig::kv_events)) feeds it, and the filter's
    /// callouts to `cfg.cluster` are answered from its state (a cluster of that name is
    /// added if the configuration has none; call it before the run, as VMs take the
    /// cluster list when they start).
    pub fn add_kv_relay(&mut self, cfg: KvRelayConfig) {
        if !self.process.clusters.iter().any(|c| c.name == cfg.cluster) {
            let cluster = Cluster {
                name: cfg.cluster.clone(),
                dst_header: String::new(),
            };
            self.cfg.clusters.push(cluster.clone());
            let mut clusters = (*self.process.clusters).clone();
            clusters.push(cluster);
            self.process.clusters = std::sync::Arc::new(clusters);
        }
        self.upstreams.kv_relay = Some(WorldRelay::new(cfg));
    }

    /// Makes the relay know the server at `addr` (live, holding nothing) before it
    /// publishes anything — for servers that publish no events (e.g. `SimpleUpstream`).
    pub fn register_kv_relay_server(&mut self, addr: &str, model: &str) {
        if let Some(relay) = self.upstreams.kv_relay.as_mut() {
            relay.register(addr, model);
        }
    }

    /// The relay's state at the current virtual time, with every server's events taken
    /// (`None` without [`Sim::add_kv_relay`]).
    pub fn kv_relay(&mut self) -> Option<&kv_relay::state::Relay> {
        self.feed_kv_relay();
        let now = self.now;
        Some(self.upstreams.kv_relay.as_mut()?.state(now))
    }

    /// Hands the relay what every server published since the last time, and which are up.
    fn feed_kv_relay(&mut self) {
        let Some(relay) = self.upstreams.kv_relay.as_mut() else {
            return;
        };
        for ep in &mut self.upstreams.endpoints {
            if let Some(published) = ep.upstream.take_kv_events() {
                relay.collect(&ep.addr, published);
            }
            relay.set_up(&ep.addr, ep.up);
        }
    }

    /// The answer to a callout on the relay's cluster; `None` for any other cluster.
    pub(super) fn kv_relay_callout(
        &mut self,
        cluster: &str,
        headers: &[(String, String)],
    ) -> Option<CalloutResponse> {
        if self.upstreams.kv_relay.as_ref()?.cluster() != cluster {
            return None;
        }
        self.feed_kv_relay();
        let header = |n: &str| {
            headers
                .iter()
                .find(|(k, _)| k == n)
                .map_or("", |(_, v)| v.as_str())
        };
        let (status, body) = if header(":method") == "GET" {
            let (path, now) = (header(":path").to_string(), self.now);
            self.upstreams.kv_relay.as_mut()?.answer(now, &path)
        } else {
            (404, "not found\n".to_string())
        };
        Some(CalloutResponse {
            headers: vec![
                (":status".into(), status.to_string()),
                ("content-type".into(), "application/json".into()),
            ],
            body: body.into_bytes(),
        })
    }
}
