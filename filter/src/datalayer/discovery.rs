//! Endpoints from Envoy's own cluster membership: the admin API's
//! `/clusters?format=json`, so that under Istio the pool follows service discovery.
//!
//! The hosts of the named cluster become endpoints; hosts Envoy marks unhealthy (EDS
//! health other than HEALTHY/UNKNOWN, or a failed health check flag) are left out. Each
//! host is one endpoint, so the several ports of a data-parallel pod are several endpoints.

use crate::endpoint::Endpoint;
use serde_json::Value;
use std::collections::BTreeMap;

/// Shared-data key of the discovered endpoint list (written by the lease holder).
pub const DISCOVERED_KEY: &str = "epp.v1.discovered";

/// The discovered endpoints, as stored.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Discovered {
    /// When the list was read (ms).
    #[prost(int64, tag = "1")]
    pub updated_ms: i64,
    /// `ip:port` of each healthy host.
    #[prost(string, repeated, tag = "2")]
    pub addresses: Vec<String>,
}

/// The healthy hosts of `cluster` in an admin `/clusters?format=json` body.
pub fn parse_clusters(body: &[u8], cluster: &str) -> Result<Vec<Endpoint>, String> {
    let doc: Value =
        serde_json::from_slice(body).map_err(|e| format!("admin /clusters is not JSON: {e}"))?;
    let statuses = doc
        .get("cluster_statuses")
        .and_then(Value::as_array)
        .ok_or("admin /clusters has no cluster_statuses")?;
    let Some(c) = statuses
        .iter()
        .find(|c| c.get("name").and_then(Value::as_str) == Some(cluster))
    else {
        return Err(format!(
            "cluster `{cluster}` is not in Envoy's configuration"
        ));
    };
    let mut out: Vec<Endpoint> = Vec::new();
    for h in c
        .get("host_statuses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let sa = h.pointer("/address/socket_address");
        let ip = sa.and_then(|s| s.get("address")).and_then(Value::as_str);
        let port = sa.and_then(|s| s.get("port_value")).and_then(Value::as_u64);
        let (Some(ip), Some(port)) = (ip, port) else {
            continue;
        };
        if !healthy(h.get("health_status")) {
            continue;
        }
        let address = match ip.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(v6)) => format!("[{v6}]:{port}"),
            Ok(v4) => format!("{v4}:{port}"),
            Err(_) => continue,
        };
        if !out.iter().any(|e| e.address == address) {
            out.push(Endpoint {
                address,
                labels: BTreeMap::new(),
            });
        }
    }
    Ok(out)
}

fn healthy(status: Option<&Value>) -> bool {
    let Some(s) = status.and_then(Value::as_object) else {
        return true;
    };
    let eds_ok = s
        .get("eds_health_status")
        .and_then(Value::as_str)
        .is_none_or(|v| v == "HEALTHY" || v == "UNKNOWN");
    let failed = s
        .iter()
        .any(|(k, v)| k.starts_with("failed_") && v.as_bool() == Some(true));
    eds_ok && !failed
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn healthy_hosts_of_the_named_cluster() {
        let body = br#"{"cluster_statuses":[
          {"name":"other","host_statuses":[{"address":{"socket_address":{"address":"10.9.9.9","port_value":1}}}]},
          {"name":"outbound|8000||vllm","host_statuses":[
            {"address":{"socket_address":{"address":"10.0.0.1","port_value":8000}},"health_status":{"eds_health_status":"HEALTHY"}},
            {"address":{"socket_address":{"address":"10.0.0.1","port_value":8001}},"health_status":{"eds_health_status":"HEALTHY"}},
            {"address":{"socket_address":{"address":"10.0.0.2","port_value":8000}},"health_status":{"eds_health_status":"UNHEALTHY"}},
            {"address":{"socket_address":{"address":"10.0.0.3","port_value":8000}},"health_status":{"failed_active_health_check":true}}
          ]}]}"#;
        let eps = parse_clusters(body, "outbound|8000||vllm").unwrap();
        let addrs: Vec<&str> = eps.iter().map(|e| e.address.as_str()).collect();
        assert_eq!(
            addrs,
            ["10.0.0.1:8000", "10.0.0.1:8001"],
            "DP ranks are separate endpoints"
        );
        assert!(parse_clusters(body, "missing")
            .unwrap_err()
            .contains("missing"));
        assert!(parse_clusters(b"nope", "x").is_err());
    }
}
