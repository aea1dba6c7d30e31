//! The shape of a model's chat template, learnt once so the filter can render a
//! conversation by concatenation (no Jinja, no tokenizer in the filter).
//!
//! vLLM renders a chat request with the model's Jinja template before tokenizing it. For
//! the templates of most chat models (ChatML — Qwen 2/2.5, many fine-tunes —, Llama 3 /
//! 3.1, Phi-3…) the rendered text is a head, then each message's content with a separator
//! depending only on the roles of the messages around it, then a tail after the last
//! message (the generation prompt included):
//!
//! `head(first is system?) · c₁ · sep(r₁>r₂) · c₂ · … · cₙ · tail(rₙ)`
//!
//! [`learn`] renders probe conversations whose contents are sentinels, cuts the output at
//! the sentinels, then renders other conversations of real-looking text both ways and
//! requires them equal. A template that does more (moves the system prompt into the last
//! user message, drops earlier reasoning, inserts the date) is refused with the first
//! difference, and chat requests then fall back to the approximate index. Templates that
//! trim contents (Llama 3) are recognised (`trim`).

use serde::Serialize;
use std::collections::BTreeMap;

/// A learnt template shape (published to the filter as is).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ChatShape {
    /// Before the first content when the conversation starts with a system message.
    #[serde(rename = "headSystem", skip_serializing_if = "Option::is_none")]
    pub head_system: Option<String>,
    /// Before the first content otherwise (a default system prompt included).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
    /// Between two messages, by `"role>role"`.
    pub seps: BTreeMap<String, String>,
    /// After the last message, by its role (the generation prompt included).
    pub tails: BTreeMap<String, String>,
    /// Contents are trimmed of surrounding whitespace.
    pub trim: bool,
}

/// A conversation: `(role, content)` pairs.
pub type Messages<'a> = [(&'a str, &'a str)];

impl ChatShape {
    /// The conversation rendered by concatenation; `None` when a role sequence was not
    /// learnt.
    pub fn render(&self, messages: &Messages<'_>) -> Option<String> {
        let (first, _) = messages.first()?;
        let mut out = if *first == "system" {
            self.head_system.clone()?
        } else {
            self.head.clone()?
        };
        let mut prev: Option<&str> = None;
        for (role, content) in messages {
            if let Some(p) = prev {
                out.push_str(self.seps.get(&format!("{p}>{role}"))?);
            }
            out.push_str(if self.trim { content.trim() } else { content });
            prev = Some(role);
        }
        out.push_str(self.tails.get(prev?)?);
        Some(out)
    }
}

/// Probe conversations. All end with a user turn, as chat requests do: a template may
/// render the turns after the last user message differently (Qwen3's reasoning), so a
/// conversation ending with the assistant is not learnt (it falls back).
const PROBES: &[&[&str]] = &[
    &["system", "user", "assistant", "user"],
    &["user", "assistant", "user"],
    &["user"],
    &["system", "user"],
];

fn sentinel(i: usize) -> String {
    format!(" \u{27e6}{i}\u{27e7} ")
}

/// Learns the shape of `render` (the Jinja template with the generation prompt), or says
/// why it cannot.
pub fn learn(
    render: &dyn Fn(&Messages<'_>) -> Result<String, String>,
) -> Result<ChatShape, String> {
    let mut shape = ChatShape::default();
    let mut trim = None;
    let mut rendered_any = false;
    for roles in PROBES {
        let contents: Vec<String> = (0..roles.len()).map(sentinel).collect();
        let messages: Vec<(&str, &str)> = roles
            .iter()
            .zip(&contents)
            .map(|(r, c)| (*r, c.as_str()))
            .collect();
        // A template may refuse a role sequence (e.g. no system role): not learnt then.
        let Ok(text) = render(&messages) else {
            continue;
        };
        rendered_any = true;
        let t = *trim.get_or_insert_with(|| !text.contains(contents[0].as_str()));
        let mut pieces = Vec::with_capacity(roles.len() + 1);
        let mut at = 0;
        for c in &contents {
            let c = if t { c.trim() } else { c.as_str() };
            let Some(i) = text[at..].find(c) else {
                return Err(format!(
                    "the template changes or drops message contents (probe {roles:?})"
                ));
            };
            pieces.push(&text[at..at + i]);
            at += i + c.len();
        }
        pieces.push(&text[at..]);
        let mut set = |map: &str, key: String, piece: &str| -> Result<(), String> {
            let slot = match map {
                "head" if key == "system" => &mut shape.head_system,
                "head" => &mut shape.head,
                "sep" => {
                    return agree(
                        shape
                            .seps
                            .entry(key.clone())
                            .or_insert_with(|| piece.into()),
                        piece,
                        &key,
                    )
                }
                _ => {
                    return agree(
                        shape
                            .tails
                            .entry(key.clone())
                            .or_insert_with(|| piece.into()),
                        piece,
                        &key,
                    )
                }
            };
            agree(slot.get_or_insert_with(|| piece.into()), piece, &key)
        };
        set("head", roles[0].to_string(), pieces[0])?;
        for (i, w) in roles.windows(2).enumerate() {
            set("sep", format!("{}>{}", w[0], w[1]), pieces[i + 1])?;
        }
        set(
            "tail",
            roles[roles.len() - 1].to_string(),
            pieces[roles.len()],
        )?;
    }
    if !rendered_any {
        return Err("the template renders none of the probe conversations".into());
    }
    shape.trim = trim.unwrap_or(false);
    verify(&shape, render)?;
    Ok(shape)
}

fn agree(held: &mut String, piece: &str, key: &str) -> Result<(), String> {
    if held == piece {
        Ok(())
    } else {
        Err(format!(
            "the template renders {key:?} differently by position ({held:?} vs {piece:?})"
        ))
    }
}

fn verify(
    shape: &ChatShape,
    render: &dyn Fn(&Messages<'_>) -> Result<String, String>,
) -> Result<(), String> {
    let texts = [
        "You are a careful assistant.\nAnswer briefly.",
        "  What is the capital of France?  ",
        "Paris.\n\nIt has been the capital since 987.",
        "And of Italy? {{ not a template }} <b>",
        "Rome.",
        "Thanks!\n",
    ];
    let conversations: [&[&str]; 4] = [
        &["system", "user", "assistant", "user", "assistant", "user"],
        &["user", "assistant", "user"],
        &["user"],
        &["system", "user"],
    ];
    for roles in conversations {
        let messages: Vec<(&str, &str)> = roles.iter().copied().zip(texts).collect();
        let Ok(expected) = render(&messages) else {
            continue;
        };
        let Some(ours) = shape.render(&messages) else {
            continue;
        };
        if ours != expected {
            let at = ours
                .bytes()
                .zip(expected.bytes())
                .take_while(|(a, b)| a == b)
                .count();
            let around = |s: &str| {
                let end = (at + 40).min(s.len());
                let start = (0..=at.min(s.len())).rev().find(|i| s.is_char_boundary(*i));
                let end = (end..=s.len()).find(|i| s.is_char_boundary(*i));
                s[start.unwrap_or(0)..end.unwrap_or(s.len())].to_string()
            };
            return Err(format!(
                "the template is not a concatenation of its messages ({roles:?} differs at byte {at}: {:?} vs {:?})",
                around(&expected),
                around(&ours)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chatml(m: &Messages<'_>) -> Result<String, String> {
        let mut out = String::new();
        if m[0].0 != "system" {
            out.push_str("<|im_start|>system\nYou are helpful.<|im_end|>\n");
        }
        for (r, c) in m {
            out.push_str(&format!("<|im_start|>{r}\n{c}<|im_end|>\n"));
        }
        out.push_str("<|im_start|>assistant\n");
        Ok(out)
    }

    #[test]
    fn chatml_with_a_default_system_prompt() {
        let shape = learn(&chatml).unwrap();
        assert!(!shape.trim);
        let m = [("user", "hi"), ("assistant", "yo"), ("user", "ok")];
        assert_eq!(shape.render(&m).unwrap(), chatml(&m).unwrap());
        assert_eq!(
            shape.head.as_deref(),
            Some("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n")
        );
        // A role never probed cannot be rendered, nor a conversation ending with the
        // assistant.
        assert_eq!(shape.render(&[("user", "a"), ("tool", "b")]), None);
        assert_eq!(shape.render(&[("user", "a"), ("assistant", "b")]), None);
    }

    #[test]
    fn trimming_templates_are_recognised() {
        let llama = |m: &Messages<'_>| -> Result<String, String> {
            let mut out = "<|begin_of_text|>".to_string();
            for (r, c) in m {
                out.push_str(&format!(
                    "<|start_header_id|>{r}<|end_header_id|>\n\n{}<|eot_id|>",
                    c.trim()
                ));
            }
            out.push_str("<|start_header_id|>assistant<|end_header_id|>\n\n");
            Ok(out)
        };
        let shape = learn(&llama).unwrap();
        assert!(shape.trim);
        let m = [("system", " s "), ("user", "u\n")];
        assert_eq!(shape.render(&m).unwrap(), llama(&m).unwrap());
    }

    #[test]
    fn templates_inserting_the_date_are_refused() {
        let source =
            "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}\
                      [date {{ strftime_now('%d %b %Y') }}][assistant]";
        let render = crate::model::renderer(source.into(), "<s>".into(), "</s>".into()).unwrap();
        assert!(learn(&render).is_err());
        // The same template without the date is learnt.
        let source = "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}[assistant]";
        let render = crate::model::renderer(source.into(), "<s>".into(), "</s>".into()).unwrap();
        let shape = learn(&render).unwrap();
        assert_eq!(shape.head.as_deref(), Some("<s>[user]"));
    }

    #[test]
    fn templates_that_move_contents_are_refused() {
        // Mistral-like: the system prompt goes into the last user message.
        let moving = |m: &Messages<'_>| -> Result<String, String> {
            let system = m.iter().find(|(r, _)| *r == "system").map(|x| x.1);
            let rest: Vec<_> = m.iter().filter(|(r, _)| *r != "system").collect();
            let mut out = "<s>".to_string();
            for (i, (r, c)) in rest.iter().enumerate() {
                match (*r, system) {
                    ("user", Some(s)) if i + 1 == rest.len() => {
                        out.push_str(&format!("[INST] {s}\n\n{c}[/INST]"))
                    }
                    ("user", _) => out.push_str(&format!("[INST] {c}[/INST]")),
                    _ => out.push_str(&format!("{c}</s>")),
                }
            }
            Ok(out)
        };
        let e = learn(&moving).unwrap_err();
        assert!(e.contains("template"), "{e}");
    }
}
