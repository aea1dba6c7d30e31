//! An incremental scanner of an OpenAI server-sent-event stream: counts the events that
//! carry a token and picks up the usage chunk, whatever the body's framing (an event
//! may be split across reads, or several may arrive in one).

use serde_json::Value;

/// Token counts of a response, as the server reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
}

impl Usage {
    /// From a response's `usage` object (`None` when it is absent or null).
    pub fn from_json(v: &Value) -> Option<Usage> {
        let u = v.get("usage")?;
        if u.is_null() {
            return None;
        }
        let n = |x: &Value| x.as_u64().unwrap_or(0);
        Some(Usage {
            prompt_tokens: n(&u["prompt_tokens"]),
            completion_tokens: n(&u["completion_tokens"]),
            cached_tokens: n(&u["prompt_tokens_details"]["cached_tokens"]),
        })
    }
}

/// What one read of the body contained.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// Events carrying a (non-empty) token.
    pub tokens: u32,
    /// `data: [DONE]` was seen.
    pub done: bool,
}

#[derive(Debug, Default)]
pub struct Scanner {
    buf: Vec<u8>,
    /// The usage chunk, once seen.
    pub usage: Option<Usage>,
    /// Token events so far.
    pub tokens: u64,
}

/// Whether `payload` has `"key":"<non-empty>"` (whitespace after the colon allowed).
fn has_nonempty_string(payload: &str, key: &str) -> bool {
    let needle = format!("\"{key}\":");
    let mut rest = payload;
    while let Some(i) = rest.find(&needle) {
        rest = &rest[i + needle.len()..];
        let v = rest.trim_start();
        if let Some(after) = v.strip_prefix('"') {
            if !after.starts_with('"') {
                return true;
            }
        }
    }
    false
}

impl Scanner {
    /// Feeds the next piece of the body.
    pub fn feed(&mut self, data: &[u8]) -> Scan {
        self.buf.extend_from_slice(data);
        let mut scan = Scan::default();
        while let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = self.buf.drain(..end + 2).collect();
            let event = String::from_utf8_lossy(&event);
            for line in event.lines() {
                let Some(payload) = line.strip_prefix("data:") else {
                    continue;
                };
                let payload = payload.trim();
                if payload == "[DONE]" {
                    scan.done = true;
                    continue;
                }
                if has_nonempty_string(payload, "text") || has_nonempty_string(payload, "content") {
                    scan.tokens += 1;
                }
                if payload.contains("\"usage\":{") || payload.contains("\"usage\": {") {
                    if let Ok(v) = serde_json::from_str::<Value>(payload) {
                        self.usage = Usage::from_json(&v).or(self.usage);
                    }
                }
            }
        }
        self.tokens += u64::from(scan.tokens);
        scan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = concat!(
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\"alpha\",\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\" beta\",\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}],\"usage\":null}\n\n",
        "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":2,\"total_tokens\":14,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n",
        "data: [DONE]\n\n",
    );

    #[test]
    fn counts_tokens_and_reads_usage_whatever_the_framing() {
        for split in [1, 2, 7, 50, STREAM.len()] {
            let mut s = Scanner::default();
            let mut done = false;
            for piece in STREAM.as_bytes().chunks(split) {
                done |= s.feed(piece).done;
            }
            assert!(done, "split {split}");
            assert_eq!(s.tokens, 2, "split {split}");
            assert_eq!(
                s.usage,
                Some(Usage {
                    prompt_tokens: 12,
                    completion_tokens: 2,
                    cached_tokens: 8
                })
            );
        }
    }

    #[test]
    fn chat_deltas_count_and_role_or_empty_chunks_do_not() {
        let mut s = Scanner::default();
        let scan = s.feed(concat!(
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"hi\"}}],\"usage\":null}\n\n",
            "data: {\"choices\":[{\"delta\": {\"content\": \"there\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"\"}}]}\n\n",
        ).as_bytes());
        assert_eq!(
            scan,
            Scan {
                tokens: 2,
                done: false
            }
        );
        assert!(s.usage.is_none());
    }

    #[test]
    fn usage_of_a_whole_response() {
        let v: Value = serde_json::from_str(
            r#"{"usage":{"prompt_tokens":3,"completion_tokens":4,"prompt_tokens_details":null}}"#,
        )
        .unwrap();
        assert_eq!(
            Usage::from_json(&v),
            Some(Usage {
                prompt_tokens: 3,
                completion_tokens: 4,
                cached_tokens: 0
            })
        );
        assert_eq!(Usage::from_json(&serde_json::json!({"usage": null})), None);
    }
}
