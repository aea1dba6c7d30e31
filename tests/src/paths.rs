//! Locations of the artifacts the end-to-end tests run.

use std::path::PathBuf;

/// The workspace root.
pub fn root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}

fn existing(path: PathBuf, builds_it: &str) -> PathBuf {
    assert!(
        path.exists(),
        "{} is missing; build it with `{builds_it}` (scripts/test does)",
        path.display()
    );
    path
}

/// The filter module as Envoy loads it.
pub fn wasm() -> PathBuf {
    existing(
        root().join("target/wasm32-wasip1/release/epp_filter.wasm"),
        "cargo build --release -p filter --lib --target wasm32-wasip1",
    )
}

/// The simulated model server.
pub fn vllm_sim() -> PathBuf {
    existing(
        root().join("target/release/vllm-sim"),
        "cargo build --release -p vllm-sim",
    )
}

/// Envoy 1.40 from the project venv.
pub fn envoy() -> PathBuf {
    existing(root().join(".venv/bin/envoy"), "scripts/setup")
}

/// The bootstrap renderer shared with `scripts/run`.
pub fn render() -> PathBuf {
    existing(root().join("scripts/lib/render.py"), "git checkout")
}
