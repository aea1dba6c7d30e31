//! Whether a request body carries multimodal input: a content part of type `image_url`,
//! `video_url` or `input_audio` (Chat Completions), or `input_image` (Responses). Read by
//! `always-disagg-multimodal-decider` (E/P/D). The check looks for the part's key or type
//! name as a JSON string token (not preceded by a backslash, so the words inside a text
//! string do not count); it reads at most the first [`MAX_SCAN_BYTES`] of the body.

/// Bytes of the body looked at.
pub const MAX_SCAN_BYTES: usize = 4 * 1024 * 1024;

const MARKERS: [&[u8]; 4] = [
    b"\"image_url\"",
    b"\"video_url\"",
    b"\"input_audio\"",
    b"\"input_image\"",
];

/// Whether `body` has a multimodal content part.
pub fn has_parts(body: &[u8]) -> bool {
    let body = body.get(..MAX_SCAN_BYTES).unwrap_or(body);
    // One pass over the quotes: a marker starts at an unescaped one.
    let mut escaped = false;
    for (i, &b) in body.iter().enumerate() {
        if b == b'"' && !escaped {
            let rest = body.get(i..).unwrap_or_default();
            if MARKERS.iter().any(|m| rest.starts_with(m)) {
                return true;
            }
        }
        escaped = b == b'\\' && !escaped;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn image_parts_count_and_words_in_text_do_not() {
        let image = br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is this"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}"#;
        assert!(has_parts(image));
        let audio = br#"{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"x","format":"wav"}}]}]}"#;
        assert!(has_parts(audio));
        let text = br#"{"messages":[{"role":"user","content":"say \"image_url\" twice"}]}"#;
        assert!(!has_parts(text));
        assert!(!has_parts(br#"{"prompt":"hello"}"#));
    }
}
