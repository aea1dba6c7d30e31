//! The tokenizer and chat template of `vllm-sim`, mirrored so the filter computes the same
//! token ids as the simulator (`host-sim/vllm-sim/src/tokenizer.rs` and its chat template):
//! text is cut into pieces of 4 characters, each hashed with 32-bit FNV-1a to a token id;
//! chat messages are rendered `<|role|>\ncontent\n` each, then `<|assistant|>\n`.
//!
//! A real model's tokenizer (Hugging Face `tokenizers`) and its Jinja chat template are not
//! in the filter: see the crate README ("Precise prefix cache") for what was measured.

const FNV_OFFSET: u32 = 0x811c_9dc5;
const FNV_PRIME: u32 = 0x0100_0193;
const CHARS_PER_TOKEN: usize = 4;

/// Token ids of `text`, at most `max` of them.
pub fn encode(text: &str, max: usize) -> Vec<u32> {
    let mut tokens = Vec::with_capacity((text.len() / CHARS_PER_TOKEN + 1).min(max));
    let mut hash = FNV_OFFSET;
    let mut chars = 0;
    for (i, byte) in text.bytes().enumerate() {
        if tokens.len() >= max {
            return tokens;
        }
        hash = (hash ^ u32::from(byte)).wrapping_mul(FNV_PRIME);
        if text.is_char_boundary(i + 1) {
            chars += 1;
            if chars == CHARS_PER_TOKEN {
                tokens.push(hash);
                hash = FNV_OFFSET;
                chars = 0;
            }
        }
    }
    if chars > 0 && tokens.len() < max {
        tokens.push(hash);
    }
    tokens
}

/// The simulator's chat template over `(role, content)` messages.
pub fn chat_template<'a>(messages: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::new();
    for (role, content) in messages {
        out.push_str("<|");
        out.push_str(role);
        out.push_str("|>\n");
        out.push_str(content);
        out.push('\n');
    }
    out.push_str("<|assistant|>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn four_character_pieces_hashed_with_fnv1a() {
        let t = encode("abcdefgh", usize::MAX);
        assert_eq!(t.len(), 2);
        let fnv = |s: &str| {
            s.bytes().fold(FNV_OFFSET, |h, b| {
                (h ^ u32::from(b)).wrapping_mul(FNV_PRIME)
            })
        };
        assert_eq!(t, vec![fnv("abcd"), fnv("efgh")]);
        // A final partial piece is a token; multi-byte characters count once.
        assert_eq!(encode("abcdé", usize::MAX), vec![fnv("abcd"), fnv("é")]);
        assert_eq!(encode("abcdefgh", 1).len(), 1);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn template_renders_roles_then_the_assistant_turn() {
        let s = chat_template([("system", "be brief"), ("user", "hi")].into_iter());
        assert_eq!(s, "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n");
    }
}
