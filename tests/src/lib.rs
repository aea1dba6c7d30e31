//! What the integration tests share: where the built artifacts are, processes that
//! stop when dropped ([`vllm_sim_server::VllmSimServer`], [`envoy::Envoy`] with the
//! filter), a small blocking HTTP/1.1 client that timestamps every piece of a streamed
//! body, and the requests the tests send ([`openai`]). Also the `loadgen` load generator.
//!
//! The artifacts are built by `scripts/test` (release `.wasm`, release `vllm-sim`,
//! Envoy in `.venv`); a missing one fails the test with the command that builds it.

pub mod adversarial;
pub mod envoy;
pub mod fault_proxy;
pub mod http;
pub mod loadgen;
pub mod openai;
pub mod paths;
pub mod vllm_sim_server;

/// A loopback port free at the time of the call (for a server the test configures with it).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local address").port()
}

/// Polls `cond` every 50 ms for up to `secs` seconds; whether it became true.
pub fn eventually(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    false
}

/// A fresh scratch directory for one test process's files.
pub fn scratch_dir(tag: &str) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "epp-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}
