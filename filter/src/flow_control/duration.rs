//! Go duration strings (`30s`, `1m30s`, `250ms`, `1.5h`), as the reference reads
//! `defaultRequestTTL`. Returned in milliseconds, rounded up.

/// Parses a Go duration; `Err` says why.
pub fn parse_ms(text: &str) -> Result<u64, String> {
    let s = text.trim();
    let bad = || format!("`{text}` is not a duration (examples: 30s, 1m30s, 250ms)");
    if s.starts_with('-') {
        return Err("must be non-negative".into());
    }
    if s == "0" {
        return Ok(0);
    }
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total_ns: f64 = 0.0;
    while !rest.is_empty() {
        let n_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (number, tail) = rest.split_at(n_end);
        let value: f64 = number.parse().map_err(|_| bad())?;
        let u_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(u_end);
        let ns = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(bad()),
        };
        total_ns += value * ns;
        rest = next;
    }
    Ok((total_ns / 1e6).ceil() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn go_durations() {
        for (d, ms) in [
            ("30s", 30_000),
            ("1m30s", 90_000),
            ("250ms", 250),
            ("1.5h", 5_400_000),
            ("0", 0),
            ("0s", 0),
            ("1500us", 2),
        ] {
            assert_eq!(parse_ms(d), Ok(ms), "{d}");
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn bad_durations_say_why() {
        assert!(parse_ms("-1s").unwrap_err().contains("non-negative"));
        assert!(parse_ms("30").unwrap_err().contains("not a duration"));
        assert!(parse_ms("10 days").unwrap_err().contains("not a duration"));
        assert!(parse_ms("").is_err());
    }
}
