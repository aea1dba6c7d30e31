//! Time for the engine: the engine never reads a clock itself, it is handed
//! `now` (a [`Duration`] since the engine's epoch). A [`Clock`] supplies it:
//! [`RealClock`] for the HTTP server, [`ManualClock`] for virtual time.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// Something that says what time it is, as a duration since its epoch.
pub trait Clock {
    fn now(&self) -> Duration;
}

/// Wall-clock time since the clock was created.
#[derive(Clone, Copy, Debug)]
pub struct RealClock {
    epoch: Instant,
}

impl RealClock {
    pub fn new() -> Self {
        RealClock {
            epoch: Instant::now(),
        }
    }

    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// The wall-clock instant of an engine time.
    pub fn instant_at(&self, t: Duration) -> Instant {
        self.epoch + t
    }
}

impl Default for RealClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for RealClock {
    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }
}

/// Virtual time that only moves when told to.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: Cell<Duration>,
}

impl ManualClock {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn set(&self, t: Duration) {
        self.now.set(t);
    }

    pub fn advance(&self, d: Duration) {
        self.now.set(self.now.get() + d);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        self.now.get()
    }
}

/// Parses `100ms`, `1s`, `250us`, `1.5s`, `2m`, `500ns`; a bare number is milliseconds
/// (as in llm-d-inference-sim, where plain integers are deprecated milliseconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {text:?}"))?;
    let secs = match unit.trim() {
        "" | "ms" => value / 1e3,
        "s" => value,
        "us" | "µs" => value / 1e6,
        "ns" => value / 1e9,
        "m" => value * 60.0,
        _ => return Err(format!("invalid duration unit in {text:?}")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("invalid duration {text:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Formats a duration the way [`parse_duration`] reads it back.
pub fn format_duration(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us == 0.0 {
        "0ms".to_string()
    } else if us < 1000.0 {
        format!("{}us", round3(us))
    } else if us < 1e6 {
        format!("{}ms", round3(us / 1e3))
    } else {
        format!("{}s", round3(us / 1e6))
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_duration_forms() {
        assert_eq!(parse_duration("100ms").unwrap(), Duration::from_millis(100));
        assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("12").unwrap(), Duration::from_millis(12));
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("10 parsecs").is_err());
        for d in [0, 250, 12_000, 2_500_000] {
            let d = Duration::from_micros(d);
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new();
        assert_eq!(c.now(), Duration::ZERO);
        c.advance(Duration::from_millis(5));
        c.advance(Duration::from_millis(5));
        assert_eq!(c.now(), Duration::from_millis(10));
    }
}
