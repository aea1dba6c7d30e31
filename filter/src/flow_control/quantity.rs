//! Kubernetes quantities (`10Gi`, `1k`, `500`), as the reference reads `maxBytes` and
//! `maxRequests`: SI and binary suffixes, decimals and exponents, rounded up to an
//! integer; negative values are refused.

/// Parses a quantity given as a JSON string or number. `Err` says why.
pub fn parse(value: &serde_json::Value) -> Result<u64, String> {
    match value {
        serde_json::Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                Ok(u)
            } else if n.as_i64().is_some_and(|i| i < 0) {
                Err("must be non-negative".into())
            } else {
                n.as_f64()
                    .filter(|f| *f >= 0.0 && f.is_finite())
                    .map(|f| f.ceil() as u64)
                    .ok_or_else(|| "must be non-negative".into())
            }
        }
        serde_json::Value::String(s) => parse_str(s),
        serde_json::Value::Null => Ok(0),
        _ => Err("must be a quantity such as 1000, \"1k\" or \"10Gi\"".into()),
    }
}

fn parse_str(text: &str) -> Result<u64, String> {
    let s = text.trim();
    let bad = || format!("`{text}` is not a quantity (examples: 1000, 1k, 10Gi, 1.5M)");
    if s.starts_with('-') {
        return Err("must be non-negative".into());
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    if number.is_empty() {
        return Err(bad());
    }
    let mantissa: f64 = number.parse().map_err(|_| bad())?;
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
            let exp: i32 = e.get(1..).unwrap_or("").parse().map_err(|_| bad())?;
            10f64.powi(exp)
        }
        _ => return Err(bad()),
    };
    let value = mantissa * multiplier;
    if !value.is_finite() || value > u64::MAX as f64 {
        return Err(format!("`{text}` is too large"));
    }
    Ok(value.ceil() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn suffixes_as_kubernetes_reads_them() {
        for (q, want) in [
            (json!("1k"), 1000),
            (json!("1Ki"), 1024),
            (json!("10Gi"), 10_737_418_240),
            (json!("1G"), 1_000_000_000),
            (json!("1.5M"), 1_500_000),
            (json!("500"), 500),
            (json!(500), 500),
            (json!("1e3"), 1000),
            (json!("1500m"), 2),
            (json!(null), 0),
        ] {
            assert_eq!(parse(&q), Ok(want), "{q}");
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn nonsense_and_negatives_are_refused_with_a_reason() {
        assert!(parse(&json!("-1")).unwrap_err().contains("non-negative"));
        assert!(parse(&json!(-3)).unwrap_err().contains("non-negative"));
        assert!(parse(&json!("ten")).unwrap_err().contains("not a quantity"));
        assert!(parse(&json!("10Qi"))
            .unwrap_err()
            .contains("not a quantity"));
        assert!(parse(&json!(true)).is_err());
    }
}
