//! A deterministic stand-in tokenizer: no model files, no downloads.
//!
//! Text is cut into pieces of [`CHARS_PER_TOKEN`] characters (about what BPE
//! tokenizers give for English) and each piece is hashed (FNV-1a, 32 bit) to a
//! token id. The same text therefore always gives the same tokens, and a text
//! that starts with another text whose length is a multiple of 4 characters
//! starts with its tokens, which is what prefix caching needs.

/// Characters per token.
pub const CHARS_PER_TOKEN: usize = 4;

/// Token ids of `text`.
pub fn encode(text: &str) -> Vec<u32> {
    let mut tokens = Vec::with_capacity(text.len() / CHARS_PER_TOKEN + 1);
    let mut hash = FNV_OFFSET;
    let mut chars = 0;
    for (i, byte) in text.bytes().enumerate() {
        hash = (hash ^ u32::from(byte)).wrapping_mul(FNV_PRIME);
        let next_is_char_start = text.is_char_boundary(i + 1);
        if next_is_char_start {
            chars += 1;
            if chars == CHARS_PER_TOKEN {
                tokens.push(hash);
                hash = FNV_OFFSET;
                chars = 0;
            }
        }
    }
    if chars > 0 {
        tokens.push(hash);
    }
    tokens
}

/// The text of each token of `text`: pieces of [`CHARS_PER_TOKEN`] characters (the
/// last may be shorter). `encode(piece)` is that piece's one token.
pub fn pieces(text: &str) -> Vec<&str> {
    let mut out = Vec::with_capacity(text.len() / CHARS_PER_TOKEN + 1);
    let mut start = 0;
    for (chars, (i, _)) in text.char_indices().enumerate() {
        if chars > 0 && chars % CHARS_PER_TOKEN == 0 {
            out.push(&text[start..i]);
            start = i;
        }
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

/// The output word of an id from [`output_token_id`], if it is one.
pub fn output_word(id: u32) -> Option<&'static str> {
    if id & 0x4000_0000 == 0 {
        return None;
    }
    VOCABULARY.get((id & !0x4000_0000) as usize).copied()
}

/// Number of tokens of `text` without building them.
pub fn count(text: &str) -> usize {
    text.chars().count().div_ceil(CHARS_PER_TOKEN)
}

const FNV_OFFSET: u32 = 0x811c_9dc5;
const FNV_PRIME: u32 = 0x0100_0193;

/// The words output tokens are drawn from. Each entry is one output token.
pub const VOCABULARY: &[&str] = &[
    " the",
    " model",
    " server",
    " is",
    " a",
    " simulated",
    " response",
    " to",
    " your",
    " request",
    " and",
    " it",
    " has",
    " no",
    " meaning",
    ".",
    " Tokens",
    " arrive",
    " one",
    " at",
    " time",
    ",",
    " like",
    " a",
    " real",
    " language",
    " model",
    " would",
    " stream",
    " them",
    " back",
    " over",
    " HTTP",
    " with",
    " server",
    "-sent",
    " events",
    " Today",
    " we",
    " test",
    " routing",
    " cache",
    " prefix",
    " latency",
    " batch",
    " queue",
    " of",
    " in",
    " for",
    " on",
    " this",
    " that",
    " fast",
    " slow",
    " good",
    " data",
    " path",
    " gateway",
    " Envoy",
    " vLLM",
    " token",
    "!",
    " yes",
    " maybe",
];

/// Token id used for output word `index` (kept out of the hash range's low end
/// only by convention; ids are opaque anyway).
pub fn output_token_id(index: usize) -> u32 {
    0x4000_0000 | index as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_text_same_tokens_and_about_four_chars_per_token() {
        let text = "You are a helpful assistant. Answer briefly.";
        assert_eq!(encode(text), encode(text));
        assert_eq!(encode(text).len(), text.len().div_ceil(4));
        assert_eq!(count(text), encode(text).len());
        assert_ne!(encode("abcd"), encode("abce"));
        assert!(encode("").is_empty());
    }

    #[test]
    fn text_prefixes_give_token_prefixes() {
        let system = "System: you are a router test.  "; // 32 chars
        let a = encode(&format!("{system}Question one?"));
        let b = encode(&format!("{system}Another question entirely"));
        let prefix = encode(system);
        assert_eq!(&a[..prefix.len()], &prefix[..]);
        assert_eq!(&b[..prefix.len()], &prefix[..]);
    }

    #[test]
    fn pieces_are_the_tokens_texts() {
        let text = "Hello, wörld! A longer text";
        let pieces = pieces(text);
        assert_eq!(pieces.concat(), text);
        assert_eq!(pieces.len(), encode(text).len());
        for (piece, id) in pieces.iter().zip(encode(text)) {
            assert_eq!(encode(piece), vec![id]);
        }
        assert!(super::pieces("").is_empty());
        assert_eq!(output_word(output_token_id(3)), Some(VOCABULARY[3]));
        assert_eq!(output_word(encode("abcd")[0] & !0x4000_0000), None);
    }

    #[test]
    fn multibyte_text_counts_characters() {
        assert_eq!(encode("ééééé").len(), 2);
        assert_eq!(count("日本語のテキスト"), 2);
    }
}
