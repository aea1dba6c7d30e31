//! Kubernetes quantities (`1k`, `10Gi`, `500`) and Go durations (`50ms`, `1m30s`), as the
//! reference's `EndpointPickerConfig` writes them.

/// Parses a Kubernetes quantity into an integer, rounding up (`q.Value()`), as the
/// reference's `resolveQuantity`: SI (`k`, `M`, `G`, `T`, `P`, `E`, `m`) and binary
/// (`Ki` … `Ei`) suffixes, decimal exponents (`1e3`), no negative values.
pub fn parse_quantity(text: &str) -> Result<u64, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty quantity".into());
    }
    if s.starts_with('-') {
        return Err(format!("`{text}` must be non-negative"));
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    if num.is_empty() || num.chars().filter(|c| *c == '.').count() > 1 || num == "." {
        return Err(format!("`{text}` is not a quantity (e.g. 500, 1k, 10Gi)"));
    }
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a quantity (e.g. 500, 1k, 10Gi)"))?;
    let multiplier: f64 = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e
                .get(1..)
                .and_then(|x| x.parse().ok())
                .ok_or_else(|| format!("`{text}` has a bad exponent"))?;
            10f64.powi(exp)
        }
        other => {
            return Err(format!(
                "`{text}` has an unknown suffix `{other}` (use k, M, G, T, P, E or Ki, Mi, Gi, Ti, Pi, Ei)"
            ))
        }
    };
    let v = (value * multiplier).ceil();
    if !v.is_finite() || v > 9.2e18 {
        return Err(format!("`{text}` is too large"));
    }
    // Round-off guard: 1.1k is 1100, not 1100.0000000000002 rounded up to 1101.
    let exact = value * multiplier;
    let nearest = exact.round();
    let v = if (exact - nearest).abs() < 1e-9 * nearest.max(1.0) {
        nearest
    } else {
        v
    };
    // The value is finite, non-negative and below 2^63 (checked above).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(v as u64)
}

/// Parses a Go duration (`300ms`, `1.5s`, `2m`, `1h30m`, `0`) into milliseconds (rounded up).
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let s = text.trim();
    if s == "0" {
        return Ok(0);
    }
    if s.starts_with('-') {
        return Err(format!("`{text}` must not be negative"));
    }
    if s.is_empty() {
        return Err("empty duration".into());
    }
    let mut rest = s;
    let mut total_ns: f64 = 0.0;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("`{text}` is missing a unit (ns, us, ms, s, m, h)"))?;
        let (num, tail) = rest.split_at(n);
        let value: f64 = num
            .parse()
            .map_err(|_| format!("`{text}` is not a duration (e.g. 50ms, 1s, 1m30s)"))?;
        let u = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(u);
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => {
                return Err(format!(
                    "`{text}` has an unknown unit `{unit}` (ns, us, ms, s, m, h)"
                ))
            }
        };
        total_ns += value * scale;
        rest = next;
    }
    let ms = (total_ns / 1e6).ceil();
    if !ms.is_finite() || ms > 9.2e15 {
        return Err(format!("`{text}` is too long"));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(ms as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn quantities_follow_kubernetes() {
        for (text, want) in [
            ("0", 0),
            ("500", 500),
            ("1k", 1000),
            ("1Ki", 1024),
            ("1G", 1_000_000_000),
            ("10Gi", 10_737_418_240),
            ("1.5k", 1500),
            ("1.1k", 1100),
            ("1e3", 1000),
            ("100m", 1), // 0.1 rounded up, as q.Value()
            ("+2M", 2_000_000),
        ] {
            assert_eq!(parse_quantity(text), Ok(want), "{text}");
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn bad_quantities_say_why() {
        assert!(parse_quantity("-1").unwrap_err().contains("non-negative"));
        assert!(parse_quantity("10GB")
            .unwrap_err()
            .contains("unknown suffix"));
        assert!(parse_quantity("abc")
            .unwrap_err()
            .contains("not a quantity"));
        assert!(parse_quantity("").is_err());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn durations_follow_go() {
        for (text, want) in [
            ("0", 0),
            ("50ms", 50),
            ("1s", 1000),
            ("1.5s", 1500),
            ("1m30s", 90_000),
            ("1h", 3_600_000),
            ("200us", 1),
        ] {
            assert_eq!(parse_duration_ms(text), Ok(want), "{text}");
        }
        assert!(parse_duration_ms("5").unwrap_err().contains("unit"));
        assert!(parse_duration_ms("-1s").unwrap_err().contains("negative"));
        assert!(parse_duration_ms("3d")
            .unwrap_err()
            .contains("unknown unit"));
    }
}
