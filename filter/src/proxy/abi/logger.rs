//! The `log` crate's lines to Envoy's log (`proxy_log`), and a panic's message too (a
//! panic aborts the VM: the line says why).

use super::super::host;

struct EnvoyLog;

static LOGGER: EnvoyLog = EnvoyLog;

/// Installs the logger (once: a second call only sets the level).
pub fn install(level: log::LevelFilter) {
    if log::set_logger(&LOGGER).is_ok() {
        std::panic::set_hook(Box::new(|info| {
            // 5: critical.
            let _ = host::log(5, &info.to_string());
        }));
    }
    log::set_max_level(level);
}

impl log::Log for EnvoyLog {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        // proxy-wasm LogLevel: trace 0, debug 1, info 2, warn 3, error 4.
        let level = match record.level() {
            log::Level::Trace => 0,
            log::Level::Debug => 1,
            log::Level::Info => 2,
            log::Level::Warn => 3,
            log::Level::Error => 4,
        };
        // Nothing to do if the host refuses a log line.
        let _ = host::log(level, &record.args().to_string());
    }

    fn flush(&self) {}
}
