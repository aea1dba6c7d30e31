//! Compiling the filter module once per process (and once per build on disk).

use anyhow::{Context, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use wasmtime::{Config, Engine, Module};

/// A compiled module and the engine it belongs to.
pub struct Compiled {
    /// The engine.
    pub engine: Engine,
    /// The module.
    pub module: Module,
    /// Where it was loaded from.
    pub path: PathBuf,
}

/// The workspace's filter build: `target/wasm32-wasip1/release/epp_filter.wasm`.
pub fn default_wasm_path() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = here.parent().map(Path::to_path_buf).unwrap_or(here);
    root.join("target/wasm32-wasip1/release/epp_filter.wasm")
}

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let mut c = Config::new();
        c.wasm_backtrace_max_frames(std::num::NonZeroUsize::new(64));
        if counting_fuel() {
            c.consume_fuel(true);
        }
        #[cfg(feature = "profiling")]
        if perf_map() {
            c.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        Engine::new(&c).unwrap_or_else(|e| panic!("wasmtime engine: {e}"))
    })
}

/// `HOST_SIM_FUEL=1`: every callback's wasm instructions are counted (wasmtime fuel: about
/// one unit per instruction executed; `memory.copy`/`memory.fill` count once whatever their
/// length). Off by default: the fuel checks slow every run a little.
pub fn counting_fuel() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("HOST_SIM_FUEL").is_some_and(|v| v != "0"))
}

/// `HOST_SIM_PERF_MAP=1` (with the `profiling` feature): the compiled module's functions
/// are written to `/tmp/perf-PID.map` so `perf report` names them.
fn perf_map() -> bool {
    cfg!(feature = "profiling") && std::env::var_os("HOST_SIM_PERF_MAP").is_some_and(|v| v != "0")
}

fn fnv(bytes: &[u8]) -> u64 {
    let mut h = crate::world::clock::Fnv::default();
    h.bytes(bytes);
    h.0
}

/// Loads and compiles `path`, cached in the process by path and content, and on disk
/// (next to the module, as `<name>.<hash>.host-sim.cwasm`) by content.
pub fn load(path: &Path) -> Result<Arc<Compiled>> {
    type Cache = Mutex<HashMap<(PathBuf, u64), Arc<Compiled>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let bytes = std::fs::read(path).with_context(|| {
        format!(
            "cannot read the filter module {}; build it with \
             `cargo build --release -p filter --lib --target wasm32-wasip1`",
            path.display()
        )
    })?;
    let hash = fnv(&bytes);
    let key = (path.to_path_buf(), hash);
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut guard = cache
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(c) = guard.get(&key) {
        return Ok(c.clone());
    }
    let engine = engine().clone();
    let cwasm = path.with_extension(format!(
        "{hash:016x}.{}{}.host-sim.cwasm",
        if cfg!(debug_assertions) { "dbg" } else { "rel" },
        if counting_fuel() { ".fuel" } else { "" }
    ));
    // SAFETY: the file is one this function wrote with `Module::serialize` for this engine
    // configuration; wasmtime checks the version and settings and refuses a mismatch.
    // Profiling compiles afresh, so the profiler sees the code being made.
    let cached = if perf_map() {
        None
    } else {
        unsafe { Module::deserialize_file(&engine, &cwasm) }.ok()
    };
    let module = match cached {
        Some(m) => m,
        None => {
            let m = Module::new(&engine, &bytes)
                .map_err(|e| anyhow::anyhow!("cannot compile {}: {e:?}", path.display()))?;
            if let Ok(ser) = m.serialize() {
                let tmp = cwasm.with_extension(format!("tmp{}", std::process::id()));
                if std::fs::write(&tmp, ser).is_ok() {
                    let _ = std::fs::rename(&tmp, &cwasm);
                }
            }
            m
        }
    };
    let c = Arc::new(Compiled {
        engine,
        module,
        path: path.to_path_buf(),
    });
    guard.insert(key, c.clone());
    Ok(c)
}
