//! The request body's fast path: one pass over the bytes that builds only the top-level
//! fields routing reads ([`super::json::ROUTED`]) and checks the rest without building it.
//!
//! It gives exactly what `serde_json` gives (the same [`Json`] values, strings borrowed
//! from the body where they hold no escape) for the JSON it handles, and `None` for
//! anything else, which the caller then hands to `serde_json` (so every error message
//! and every corner of the grammar stays `serde_json`'s):
//!
//! * handled: a top-level object; strings with the short escapes and `\uXXXX` outside
//!   the surrogates; in the fields kept, non-negative integers that fit in a `u64`; in
//!   the fields skipped, any number; `true`, `false`, `null`; nesting up to [`MAX_DEPTH`];
//! * left to `serde_json`: invalid JSON, other top-level values, negative or fractional
//!   numbers and surrogate escapes in kept fields, escaped keys, deeper nesting.
//!
//! Strings are scanned eight bytes at a time for a quote, a backslash, a control character
//! or a non-ASCII byte; only strings with non-ASCII bytes that are kept are checked as
//! UTF-8 (`serde_json` checks no skipped string either when the body is not UTF-8).

#[cfg(test)]
use super::json::ROUTED;
use super::json::{Body, Json, Number};
use std::borrow::Cow;

/// Nesting handled here (objects and arrays, the top level included); deeper is left to
/// `serde_json` (whose limit is 128).
pub const MAX_DEPTH: u32 = 64;

/// The body's top-level object with its routed fields, or `None` when the fast path does
/// not handle this body (the caller parses it with `serde_json`).
pub fn body(bytes: &[u8]) -> Option<Body<'_>> {
    body_keeping(bytes, routed)
}

/// [`body`] keeping the top-level fields `keep` names instead (another API's fields).
#[inline]
pub fn body_keeping(bytes: &[u8], keep: impl Fn(&str) -> bool) -> Option<Body<'_>> {
    let mut p = Scanner { b: bytes, i: 0 };
    p.ws();
    p.eat(b'{')?;
    let mut pairs = Vec::new();
    p.ws();
    if p.eat(b'}').is_none() {
        loop {
            p.ws();
            let key = p.key()?;
            p.ws();
            p.eat(b':')?;
            p.ws();
            if keep(key) {
                pairs.push((Cow::Borrowed(key), p.value(1)?));
            } else {
                p.skip_value(1)?;
            }
            p.ws();
            match p.next()? {
                b',' => continue,
                b'}' => break,
                _ => return None,
            }
        }
    }
    p.ws();
    (p.i == bytes.len()).then_some(Body(Some(Json::Object(pairs))))
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

/// A string's raw bytes between its quotes, and what the scan saw in them.
struct Raw<'a> {
    bytes: &'a [u8],
    escaped: bool,
    ascii: bool,
}

impl<'a> Raw<'a> {
    /// The bytes as text: `None` when they are not UTF-8.
    fn text(&self) -> Option<&'a str> {
        if self.ascii {
            // SAFETY: the scan saw every byte of the string below 0x80: ASCII, which is
            // UTF-8 (no second pass over a long prompt).
            Some(unsafe { std::str::from_utf8_unchecked(self.bytes) })
        } else {
            std::str::from_utf8(self.bytes).ok()
        }
    }
}

const ONES: u64 = u64::MAX / 255;
const HIGH: u64 = ONES << 7;

/// The bytes of `w` that are a quote, a backslash or a control character: their high bits
/// (exact for the lowest such byte; the bytes above it may be flagged wrongly).
fn specials(w: u64) -> u64 {
    let zero = |x: u64| x.wrapping_sub(ONES) & !x;
    let quote = zero(w ^ (ONES * u64::from(b'"')));
    let backslash = zero(w ^ (ONES * u64::from(b'\\')));
    let control = w.wrapping_sub(ONES * 0x20) & !w;
    (quote | backslash | control) & HIGH
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\n' | b'\t' | b'\r')) {
            self.i += 1;
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i.checked_add(word.len())?;
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }

    /// A string, the opening quote next: its raw bytes, the closing quote consumed.
    fn raw_string(&mut self) -> Option<Raw<'a>> {
        self.eat(b'"')?;
        let start = self.i;
        let mut escaped = false;
        let mut high = 0u64;
        loop {
            high |= self.skip_plain();
            match self.next()? {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    match self.next()? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {}
                        b'u' => {
                            self.hex4()?;
                        }
                        _ => return None,
                    }
                }
                c if c < 0x20 => return None,
                c => high |= u64::from(c & 0x80),
            }
        }
        let bytes = self.b.get(start..self.i - 1)?;
        Some(Raw {
            bytes,
            escaped,
            ascii: high == 0,
        })
    }

    /// Skips the bytes of a string up to the next special one (a quote, a backslash, a
    /// control character): sixteen at a time while none is special (in a long string),
    /// then eight at a time. Returns the high bits of the bytes skipped.
    fn skip_plain(&mut self) -> u64 {
        let mut high = 0u64;
        if let Some(rest) = self.b.get(self.i..).filter(|r| r.len() >= 64) {
            for pair in rest.chunks_exact(16) {
                let Some(x) = pair.first_chunk::<16>().map(|b| u128::from_le_bytes(*b)) else {
                    break;
                };
                let (lo, hi) = (x as u64, (x >> 64) as u64);
                if specials(lo) | specials(hi) != 0 {
                    break;
                }
                high |= (lo | hi) & HIGH;
                self.i += 16;
            }
        }
        while let Some(chunk) = self.b.get(self.i..self.i + 8) {
            let Some(w) = chunk.first_chunk::<8>().map(|b| u64::from_le_bytes(*b)) else {
                break;
            };
            let hit = specials(w);
            if hit != 0 {
                let at = hit.trailing_zeros() / 8;
                // Only the bytes before the special one are skipped.
                high |= w & HIGH & (1u64 << (at * 8)).wrapping_sub(1);
                self.i += at as usize;
                break;
            }
            high |= w & HIGH;
            self.i += 8;
        }
        high
    }

    fn hex4(&mut self) -> Option<u16> {
        let digits = self.b.get(self.i..self.i + 4)?;
        let mut n = 0u16;
        for d in digits {
            n = n * 16 + u16::from(char::from(*d).to_digit(16)? as u8);
        }
        self.i += 4;
        Some(n)
    }

    /// An object key: unescaped keys only.
    fn key(&mut self) -> Option<&'a str> {
        let raw = self.raw_string()?;
        if raw.escaped {
            return None;
        }
        raw.text()
    }

    /// A string kept: borrowed, or decoded when it holds escapes.
    fn string(&mut self) -> Option<Cow<'a, str>> {
        let raw = self.raw_string()?;
        let text = raw.text()?;
        if !raw.escaped {
            return Some(Cow::Borrowed(text));
        }
        decode(text).map(Cow::Owned)
    }

    /// A value kept.
    fn value(&mut self, depth: u32) -> Option<Json<'a>> {
        match self.peek()? {
            b'"' => self.string().map(Json::Str),
            b'{' => {
                let depth = deeper(depth)?;
                self.i += 1;
                let mut pairs = Vec::new();
                self.ws();
                if self.eat(b'}').is_some() {
                    return Some(Json::Object(pairs));
                }
                loop {
                    self.ws();
                    let key = self.key()?;
                    self.ws();
                    self.eat(b':')?;
                    self.ws();
                    pairs.push((Cow::Borrowed(key), self.value(depth)?));
                    self.ws();
                    match self.next()? {
                        b',' => continue,
                        b'}' => return Some(Json::Object(pairs)),
                        _ => return None,
                    }
                }
            }
            b'[' => {
                let depth = deeper(depth)?;
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.eat(b']').is_some() {
                    return Some(Json::Array(items));
                }
                loop {
                    self.ws();
                    items.push(self.value(depth)?);
                    self.ws();
                    match self.next()? {
                        b',' => continue,
                        b']' => return Some(Json::Array(items)),
                        _ => return None,
                    }
                }
            }
            b't' => self.literal(b"true").map(|()| Json::Bool(true)),
            b'f' => self.literal(b"false").map(|()| Json::Bool(false)),
            b'n' => self.literal(b"null").map(|()| Json::Null),
            b'0'..=b'9' => self.integer().map(|n| Json::Number(Number::U64(n))),
            _ => None,
        }
    }

    /// A non-negative integer that fits in a `u64`, with nothing of a fraction or an
    /// exponent after it.
    fn integer(&mut self) -> Option<u64> {
        let first = self.next()?;
        let mut n = u64::from(first - b'0');
        if first != b'0' {
            while let Some(d @ b'0'..=b'9') = self.peek() {
                n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
                self.i += 1;
            }
        }
        match self.peek() {
            Some(b'0'..=b'9' | b'.' | b'e' | b'E') => None,
            _ => Some(n),
        }
    }

    /// A value skipped: checked, not built.
    fn skip_value(&mut self, depth: u32) -> Option<()> {
        match self.peek()? {
            b'"' => self.raw_string().map(|_| ()),
            b'{' => {
                let depth = deeper(depth)?;
                self.i += 1;
                self.ws();
                if self.eat(b'}').is_some() {
                    return Some(());
                }
                loop {
                    self.ws();
                    self.raw_string()?;
                    self.ws();
                    self.eat(b':')?;
                    self.ws();
                    self.skip_value(depth)?;
                    self.ws();
                    match self.next()? {
                        b',' => continue,
                        b'}' => return Some(()),
                        _ => return None,
                    }
                }
            }
            b'[' => {
                let depth = deeper(depth)?;
                self.i += 1;
                self.ws();
                if self.eat(b']').is_some() {
                    return Some(());
                }
                loop {
                    self.ws();
                    self.skip_value(depth)?;
                    self.ws();
                    match self.next()? {
                        b',' => continue,
                        b']' => return Some(()),
                        _ => return None,
                    }
                }
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.skip_number(),
            _ => None,
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.i += 1;
        }
        self.i - start
    }

    /// A number of JSON's grammar: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
    fn skip_number(&mut self) -> Option<()> {
        let _ = self.eat(b'-');
        match self.next()? {
            b'0' => {
                if matches!(self.peek(), Some(b'0'..=b'9')) {
                    return None;
                }
            }
            b'1'..=b'9' => {
                self.digits();
            }
            _ => return None,
        }
        if self.eat(b'.').is_some() && self.digits() == 0 {
            return None;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if self.digits() == 0 {
                return None;
            }
        }
        Some(())
    }
}

/// Whether `key` is one of [`super::json::ROUTED`] (a `match`: each name compared as
/// constants).
fn routed(key: &str) -> bool {
    matches!(
        key,
        "model"
            | "stream"
            | "stream_options"
            | "max_tokens"
            | "max_completion_tokens"
            | "max_output_tokens"
            | "prompt"
            | "messages"
            | "input"
            | "instructions"
            | "cache_salt"
            | "query"
            | "documents"
            | "text_1"
            | "text_2"
            | "queries"
    )
}

fn deeper(depth: u32) -> Option<u32> {
    (depth < MAX_DEPTH).then_some(depth + 1)
}

/// The text of a string with escapes (checked by the scan): `None` for a surrogate
/// escape (left to `serde_json`, which pairs them).
fn decode(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('\\') {
        out.push_str(rest.get(..at)?);
        let escape = rest.get(at + 1..)?;
        let mut chars = escape.chars();
        let c = match chars.next()? {
            '"' => '"',
            '\\' => '\\',
            '/' => '/',
            'b' => '\u{8}',
            'f' => '\u{c}',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'u' => {
                let hex = escape.get(1..5)?;
                let n = u32::from_str_radix(hex, 16).ok()?;
                rest = escape.get(5..)?;
                out.push(char::from_u32(n)?);
                continue;
            }
            _ => return None,
        };
        out.push(c);
        rest = escape.get(1..)?;
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    /// What the `serde_json` path gives.
    fn slow(body: &[u8]) -> Option<Json<'_>> {
        let parsed = match std::str::from_utf8(body) {
            Ok(text) => serde_json::from_str::<Body<'_>>(text),
            Err(_) => serde_json::from_slice::<Body<'_>>(body),
        };
        parsed.ok().and_then(|b| b.0)
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn gives_what_serde_json_gives_or_leaves_the_body_to_it() {
        let handled: &[&[u8]] = &[
            br#"{"model":"m","prompt":"hello","stream":true,"max_tokens":7}"#,
            br#" { "model" : "m" , "prompt" : [1, 2, 30] , "tools":[{"x":{"y":[1,-2.5e3,0.1]}}] } "#,
            br#"{"model":"a","model":"b","temperature":0.7,"top_p":1,"n":-1,"stop":null}"#,
            br#"{"messages":[{"role":"user","content":"line\nnext \"q\" \u00e9 \/ \\"},{"role":"a","content":[{"type":"text","text":"x"}]}]}"#,
            "{\"model\":\"mod\u{e8}le\",\"prompt\":\"caf\u{e9} \u{1F600}\",\"user\":\"\u{e9}\"}".as_bytes(),
            br#"{}"#,
            br#"{"stream_options":{"include_usage":true},"cache_salt":"s","logit_bias":{"1":-100}}"#,
            br#"{"prompt":"ab\u0000c","x":"\ud83d\ude00"}"#,
        ];
        for body in handled {
            let fast = body_of(body).unwrap_or_else(|| panic!("handled: {}", show(body)));
            assert_eq!(Some(fast), slow(body), "{}", show(body));
        }
        let left: &[&[u8]] = &[
            b"",
            b"[1]",
            b"\"text\"",
            b"{\"model\": ",
            b"{} trailing",
            b"{\"a\":1,}",
            b"{\"a\":01}",
            b"{\"a\":1.}",
            b"{\"a\":1e}",
            b"{\"a\":tru}",
            b"{\"a\":\"x\x01\"}",
            b"{\"a\":\"\\x\"}",
            b"{\"a\":\"\\u12\"}",
            br#"{"max_tokens":-1}"#,
            br#"{"max_tokens":1.5}"#,
            br#"{"max_tokens":99999999999999999999}"#,
            br#"{"prompt":"\ud83d\ude00"}"#,
            br#"{"mo\u0064el":"m"}"#,
            b"{\"prompt\":\"\xff\"}",
        ];
        for body in left {
            assert!(
                body_of(body).is_none(),
                "left to serde_json: {}",
                show(body)
            );
        }
        // Deep nesting is left to serde_json, which has its own limit.
        let deep = format!("{{\"x\":{}1{}}}", "[".repeat(70), "]".repeat(70));
        assert!(body_of(deep.as_bytes()).is_none());
        let ok = format!("{{\"x\":{}1{}}}", "[".repeat(10), "]".repeat(10));
        assert!(body_of(ok.as_bytes()).is_some());
        // A skipped string need not be UTF-8 (serde_json does not check it either).
        let latin1 = b"{\"user\":\"\xe9\",\"model\":\"m\"}";
        assert_eq!(body_of(latin1), slow(latin1));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_routed_fields_are_those_of_the_serde_json_path() {
        for key in ROUTED {
            assert!(routed(key), "{key}");
        }
        let count = ["model", "tools", "temperature", "user", "prompt_x", "n"]
            .iter()
            .filter(|k| routed(k))
            .count();
        assert_eq!(count, 1);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn strings_without_escapes_borrow_the_body() {
        let long = format!(
            r#"{{"prompt":"{}","model":"m"}}"#,
            "lorem ipsum ".repeat(100)
        );
        let Some(Json::Object(pairs)) = body_of(long.as_bytes()) else {
            panic!("an object")
        };
        assert!(pairs
            .iter()
            .all(|(_, v)| matches!(v, Json::Str(Cow::Borrowed(_)))));
    }

    /// Mutations of the fuzz corpus's request bodies (bytes flipped, JSON tokens spliced
    /// in, cut short): wherever the fast path answers, it answers what `serde_json` does.
    #[cfg(not(target_arch = "wasm32"))]
    #[test]
    fn agrees_with_serde_json_on_mutated_bodies() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/request_body");
        let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(dir)
            .expect("the request_body corpus")
            .map(|e| std::fs::read(e.expect("entry").path()).expect("a corpus file"))
            .collect();
        seeds.push(
            br#"{"model":"m","prompt":"a\u00e9\n","max_tokens":3,"x":[1,-2.5,{"y":null}]}"#
                .to_vec(),
        );
        const TOKENS: [&[u8]; 14] = [
            b"\"",
            b"\\",
            b"\\u00e9",
            b"\\ud83d",
            b"{",
            b"}",
            b"[",
            b"]",
            b",",
            b":",
            b"-1",
            b"1e5",
            b"\"model\":",
            b"\xc3\xa9",
        ];
        let mut rng = crate::rng::Rng::new(7);
        let (mut handled, mut total) = (0, 0);
        for _ in 0..20_000 {
            let mut body = seeds[rng.below(seeds.len())].clone();
            for _ in 0..1 + rng.below(3) {
                let at = rng.below(body.len() + 1);
                match rng.below(4) {
                    0 if at < body.len() => body[at] = rng.next_u64() as u8,
                    1 => {
                        let token = TOKENS[rng.below(TOKENS.len())];
                        body.splice(at..at, token.iter().copied());
                    }
                    2 if at < body.len() => {
                        body.remove(at);
                    }
                    _ => body.truncate(at),
                }
            }
            total += 1;
            if let Some(fast) = body_of(&body) {
                handled += 1;
                assert_eq!(Some(fast), slow(&body), "{}", show(&body));
            }
        }
        // Enough of the mutants stay valid for the comparison to mean something.
        assert!(handled * 20 > total, "{handled} of {total} handled");
    }

    fn body_of(b: &[u8]) -> Option<Json<'_>> {
        body(b).and_then(|b| b.0)
    }

    fn show(b: &[u8]) -> String {
        String::from_utf8_lossy(b).into_owned()
    }
}
