//! Client text made safe to keep: every string a client chooses (a model name, a rewrite
//! target, a fairness id) is passed through [`text`] before it becomes a metric label (the
//! filter's own series and Envoy's stat names), a log field or anything else the gateway
//! keeps or shows. A leaf: it imports nothing of the crate.
//!
//! * **Size**: at most [`MAX_BYTES`] bytes. A longer value keeps its first bytes (cut at a
//!   character boundary) and ends in `~` and 8 hex digits of a hash of the whole value, so
//!   two long names that share a beginning stay apart. The cost of the hash is paid once
//!   per request (the proxy bounds a request's names once, when its body is parsed), never
//!   under a shared lock.
//! * **Characters**: control characters (`\0`, `\n`, `\r`, DEL, C1) and invisible
//!   formatting characters (zero-width, bidirectional overrides, line and paragraph
//!   separators, BOM) become `_`, so a value cannot add a line to `/stats`, start a new
//!   metric family in `/stats/prometheus`, or hide text in a dashboard or a log.
//!
//! A value that needs neither is borrowed as it is (the common case costs one pass over at
//! most [`MAX_BYTES`] bytes and no allocation).

use std::borrow::Cow;

/// The longest client-chosen value kept, in bytes (as fairness ids and objectives, which
/// `classify` cuts to the same length).
pub const MAX_BYTES: usize = 128;

/// Bytes of the suffix of a cut value: `~` and 8 hex digits.
const SUFFIX_BYTES: usize = 9;

/// Whether `c` is kept as it is.
fn printable(c: char) -> bool {
    !c.is_control()
        && !matches!(
            c,
            '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{206f}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
        )
}

/// `value` bounded: at most [`MAX_BYTES`] bytes, control and invisible formatting
/// characters replaced by `_`. Borrowed when it is already both.
pub fn text(value: &str) -> Cow<'_, str> {
    let fits = value.len() <= MAX_BYTES;
    if fits && value.chars().all(printable) {
        return Cow::Borrowed(value);
    }
    let keep = if fits {
        value.len()
    } else {
        MAX_BYTES - SUFFIX_BYTES
    };
    let mut end = keep.min(value.len());
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(MAX_BYTES);
    out.extend(value.get(..end).unwrap_or_default().chars().map(|c| {
        if printable(c) {
            c
        } else {
            '_'
        }
    }));
    if !fits {
        let h = xxhash_rust::xxh64::xxh64(value.as_bytes(), 0);
        out.push('~');
        out.push_str(&format!("{:08x}", h & 0xffff_ffff));
    }
    Cow::Owned(out)
}

/// [`text`], as an owned string.
pub fn owned(value: &str) -> String {
    text(value).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn a_plain_value_is_borrowed_as_it_is() {
        for v in ["meta-llama/Llama-3.1-8B-Instruct", "", "modèle-é", "a b"] {
            assert!(matches!(text(v), Cow::Borrowed(b) if b == v));
        }
        let exact = "x".repeat(MAX_BYTES);
        assert!(matches!(text(&exact), Cow::Borrowed(_)));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn control_and_invisible_characters_become_underscores() {
        assert_eq!(
            text("m\nwasm.epp.vm_reload: 999\0\r\x7f"),
            "m_wasm.epp.vm_reload: 999___"
        );
        assert_eq!(
            text("a\u{202e}b\u{200b}c\u{2028}d\u{feff}\u{85}"),
            "a_b_c_d__"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_long_value_is_cut_with_a_hash_of_the_whole() {
        let a = format!("{}a", "m".repeat(300));
        let b = format!("{}b", "m".repeat(300));
        let (ca, cb) = (text(&a), text(&b));
        assert_eq!(ca.len(), MAX_BYTES);
        assert_eq!(cb.len(), MAX_BYTES);
        assert_ne!(ca, cb, "same beginning, different names: different values");
        assert!(ca.starts_with(&"m".repeat(MAX_BYTES - SUFFIX_BYTES)));
        assert_eq!(text(&a), ca, "the same name, the same value");
        // A 4 MiB name with control characters in its kept part.
        let huge = format!("x\n{}", "y".repeat(4 << 20));
        let t = text(&huge);
        assert_eq!(t.len(), MAX_BYTES);
        assert!(t.starts_with("x_y"));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_cut_never_splits_a_character() {
        let v = "é".repeat(200);
        let t = text(&v);
        assert!(t.len() <= MAX_BYTES);
        assert!(t.starts_with("éé"));
        assert!(t
            .chars()
            .all(|c| c == 'é' || c == '~' || c.is_ascii_hexdigit()));
    }
}
