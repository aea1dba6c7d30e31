//! `--kv-events-config`: vLLM's `KVEventsConfig` as JSON (vLLM `vllm/config/kv_events.py`).

use serde::Deserialize;

/// The fields of vLLM's `KVEventsConfig`. Unknown fields are refused, so a typo is
/// not silently ignored.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvEventsConfig {
    #[serde(default)]
    pub enable_kv_cache_events: bool,
    /// `"zmq"` or `"null"`; when absent, `zmq` if events are enabled.
    #[serde(default)]
    pub publisher: Option<String>,
    /// Binds when it contains `*`, `::` or is `ipc://`/`inproc://`, else connects
    /// (vLLM's rule). Port 0 binds an ephemeral port (printed at start).
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    /// The replay ROUTER socket (always bound); none by default.
    #[serde(default)]
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay.
    #[serde(default = "default_buffer_steps")]
    pub buffer_steps: usize,
    /// Accepted for compatibility (the PUB socket's high-water mark).
    #[serde(default = "default_hwm")]
    pub hwm: usize,
    /// Batches waiting to be sent; more are dropped (counted in the log).
    #[serde(default = "default_max_queue_size")]
    pub max_queue_size: usize,
    /// The first frame of every message.
    #[serde(default)]
    pub topic: String,
}

fn default_endpoint() -> String {
    "tcp://*:5557".into()
}
fn default_buffer_steps() -> usize {
    10_000
}
fn default_hwm() -> usize {
    100_000
}
fn default_max_queue_size() -> usize {
    100_000
}

impl KvEventsConfig {
    /// Parses the flag's value; `Ok(None)` when events are off (disabled, or the
    /// `null` publisher).
    pub fn parse(json: &str) -> Result<Option<Self>, String> {
        let c: KvEventsConfig =
            serde_json::from_str(json).map_err(|e| format!("--kv-events-config: {e}"))?;
        match c.publisher.as_deref() {
            None | Some("zmq") => {}
            Some("null") => return Ok(None),
            Some(other) => {
                return Err(format!(
                    "--kv-events-config: publisher {other:?} is not supported (zmq or null)"
                ))
            }
        }
        if !c.enable_kv_cache_events {
            return Ok(None);
        }
        if c.buffer_steps == 0 || c.max_queue_size == 0 {
            return Err("--kv-events-config: buffer_steps and max_queue_size must be > 0".into());
        }
        Ok(Some(c))
    }

    /// The endpoint of data-parallel rank `rank`: the port offset by the rank, as vLLM.
    pub fn endpoint_for_rank(endpoint: &str, rank: usize) -> Result<String, String> {
        if rank == 0 {
            return Ok(endpoint.to_string());
        }
        let (base, port) = endpoint
            .rsplit_once(':')
            .ok_or_else(|| format!("--kv-events-config: endpoint {endpoint:?} has no port"))?;
        let port: u16 = port
            .parse()
            .map_err(|_| format!("--kv-events-config: endpoint {endpoint:?}: bad port"))?;
        if port == 0 {
            return Ok(endpoint.to_string());
        }
        let port = port
            .checked_add(rank as u16)
            .ok_or_else(|| format!("--kv-events-config: endpoint {endpoint:?}: port overflow"))?;
        Ok(format!("{base}:{port}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vllm_spelling_with_defaults() {
        let c = KvEventsConfig::parse(
            r#"{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","topic":"kv-events"}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint, "tcp://*:5557");
        assert_eq!(c.topic, "kv-events");
        assert_eq!(c.buffer_steps, 10_000);
        assert_eq!(c.replay_endpoint, None);
        assert!(KvEventsConfig::parse(r#"{"enable_kv_cache_events":false}"#)
            .unwrap()
            .is_none());
        assert!(
            KvEventsConfig::parse(r#"{"enable_kv_cache_events":true,"publisher":"null"}"#)
                .unwrap()
                .is_none()
        );
        assert!(KvEventsConfig::parse(r#"{"enable_kv_cache_events":true,"topik":"x"}"#).is_err());
        assert!(
            KvEventsConfig::parse(r#"{"enable_kv_cache_events":true,"publisher":"kafka"}"#)
                .is_err()
        );
    }

    #[test]
    fn ranks_offset_the_port() {
        assert_eq!(
            KvEventsConfig::endpoint_for_rank("tcp://*:5557", 2).unwrap(),
            "tcp://*:5559"
        );
        assert_eq!(
            KvEventsConfig::endpoint_for_rank("tcp://127.0.0.1:0", 1).unwrap(),
            "tcp://127.0.0.1:0"
        );
    }
}
