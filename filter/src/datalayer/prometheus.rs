//! A robust parser of the Prometheus text exposition format (what `/metrics` returns).
//!
//! Comments (`# HELP`, `# TYPE`, anything after `#`) and blank lines are skipped; a
//! sample is `name{label="value",...} value [timestamp]`. Label values may contain
//! escapes (`\\`, `\"`, `\n`), commas and braces; values may be `NaN`, `+Inf`, `-Inf` or
//! any float; a trailing comma in the label set is accepted. A malformed line is skipped
//! (and counted), never fatal: one bad series must not hide the others.

/// One sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name.
    pub name: String,
    /// Labels in order of appearance.
    pub labels: Vec<(String, String)>,
    /// Value.
    pub value: f64,
    /// Timestamp (ms), when given.
    pub timestamp: Option<i64>,
}

impl Sample {
    /// The value of label `name`.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The parsed samples and the number of lines skipped as malformed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Parsed {
    /// Every well-formed sample, in order.
    pub samples: Vec<Sample>,
    /// Malformed lines skipped.
    pub skipped: usize,
}

/// Parses an exposition.
pub fn parse(text: &str) -> Parsed {
    let mut out = Parsed::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match parse_line(line) {
            Some(s) => out.samples.push(s),
            None => out.skipped += 1,
        }
    }
    out
}

fn is_name_char(c: char, first: bool) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':' || (!first && c.is_ascii_digit())
}

fn parse_line(line: &str) -> Option<Sample> {
    let mut chars = line.char_indices().peekable();
    let mut end = 0;
    while let Some(&(i, c)) = chars.peek() {
        if is_name_char(c, i == 0) {
            end = i + c.len_utf8();
            chars.next();
        } else {
            break;
        }
    }
    if end == 0 {
        return None;
    }
    let name = line.get(..end)?.to_string();
    let mut rest = line.get(end..)?.trim_start();
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let (parsed, tail) = parse_labels(after)?;
        labels = parsed;
        rest = tail.trim_start();
    }
    let mut parts = rest.split_whitespace();
    let value = parse_value(parts.next()?)?;
    let timestamp = match parts.next() {
        Some(t) => Some(t.parse::<i64>().ok()?),
        None => None,
    };
    if parts.next().is_some() {
        return None;
    }
    Some(Sample {
        name,
        labels,
        value,
        timestamp,
    })
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "NaN" | "nan" => Some(f64::NAN),
        "+Inf" | "Inf" | "inf" | "+inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        _ => s.parse::<f64>().ok(),
    }
}

/// Parses `k="v",...}` and returns the labels and what follows the `}`.
fn parse_labels(s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start();
        if let Some(tail) = rest.strip_prefix('}') {
            return Some((labels, tail));
        }
        let eq = rest.find('=')?;
        let key = rest.get(..eq)?.trim();
        if key.is_empty()
            || !key
                .chars()
                .enumerate()
                .all(|(i, c)| is_name_char(c, i == 0))
        {
            return None;
        }
        rest = rest.get(eq + 1..)?.trim_start();
        rest = rest.strip_prefix('"')?;
        let mut value = String::new();
        let mut escaped = false;
        let mut close = None;
        for (i, c) in rest.char_indices() {
            if escaped {
                value.push(match c {
                    'n' => '\n',
                    other => other,
                });
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                close = Some(i);
                break;
            } else {
                value.push(c);
            }
        }
        let close = close?;
        labels.push((key.to_string(), value));
        rest = rest.get(close + 1..)?.trim_start();
        if let Some(tail) = rest.strip_prefix(',') {
            rest = tail;
        } else if !rest.starts_with('}') {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn parses_vllm_style_output() {
        let text = r#"
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llama"} 3.0
vllm:num_requests_waiting{model_name="llama"} 1
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.25 1700000000000
vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters=""} 1.7e9
"#;
        let p = parse(text);
        assert_eq!(p.skipped, 0);
        assert_eq!(p.samples.len(), 4);
        assert_eq!(p.samples[0].name, "vllm:num_requests_running");
        assert_eq!(p.samples[0].value, 3.0);
        assert_eq!(p.samples[2].label("engine"), Some("0"));
        assert_eq!(p.samples[2].timestamp, Some(1_700_000_000_000));
        assert_eq!(p.samples[3].label("running_lora_adapters"), Some("a,b"));
        assert_eq!(p.samples[3].value, 1.7e9);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn escapes_special_values_and_bad_lines() {
        let text = "m{a=\"x\\\"y,}\\\\z\\n\",b=\"\",} NaN\n\
                    inf_metric +Inf\n\
                    neg -Inf\n\
                    broken{a=\"unterminated} 1\n\
                    9starts_with_digit 1\n\
                    no_value\n\
                    ok 2 # trailing\n\
                    fine  4.5e-3\n";
        let p = parse(text);
        let m = &p.samples[0];
        assert_eq!(m.label("a"), Some("x\"y,}\\z\n"));
        assert_eq!(m.label("b"), Some(""));
        assert!(m.value.is_nan());
        assert_eq!(p.samples[1].value, f64::INFINITY);
        assert_eq!(p.samples[2].value, f64::NEG_INFINITY);
        assert_eq!(p.samples.last().unwrap().value, 4.5e-3);
        assert_eq!(p.skipped, 4, "{:?}", p.samples);
    }
}
