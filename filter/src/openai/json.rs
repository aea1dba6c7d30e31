//! The request body as routing reads it: a JSON value whose strings borrow the body where
//! they can, and a top level that keeps only the fields routing looks at.
//!
//! `serde_json::Value` would copy every string and build a map for every object of the
//! body, `tools` and `logit_bias` included; here the fields routing never reads are skipped
//! by the parser without being built, and a prompt without escapes is never copied until
//! the prompt text is assembled. Duplicate keys: the last wins, as with `Value`.

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;

/// A JSON value.
#[derive(Debug, Clone, PartialEq)]
pub enum Json<'a> {
    Null,
    Bool(bool),
    /// A number, as `serde_json` gives it.
    Number(Number),
    Str(Cow<'a, str>),
    Array(Vec<Json<'a>>),
    /// Pairs in body order (a key may repeat: [`Json::get`] takes the last).
    Object(Vec<(Cow<'a, str>, Json<'a>)>),
}

/// A JSON number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    U64(u64),
    I64(i64),
    F64(f64),
}

impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Number::U64(n) => write!(f, "{n}"),
            Number::I64(n) => write!(f, "{n}"),
            Number::F64(n) => write!(f, "{n}"),
        }
    }
}

impl<'a> Json<'a> {
    /// Field `key` of an object (the last of that name); `None` for other values.
    pub fn get(&self, key: &str) -> Option<&Json<'a>> {
        match self {
            Json::Object(pairs) => pairs.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Json::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// A non-negative integer (as `Value::as_u64`).
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Json::Number(Number::U64(n)) => Some(*n),
            Json::Number(Number::I64(n)) => u64::try_from(*n).ok(),
            _ => None,
        }
    }
}

/// A string that borrows the body when it holds no escape.
struct Text<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s.to_string())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s)))
            }
        }
        d.deserialize_str(V)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Json<'de>, E> {
        Ok(Json::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Json<'de>, E> {
        Ok(Json::Null)
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Json<'de>, E> {
        Ok(Json::Bool(b))
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Json<'de>, E> {
        Ok(Json::Number(Number::U64(n)))
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Json<'de>, E> {
        Ok(Json::Number(Number::I64(n)))
    }
    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Json<'de>, E> {
        Ok(Json::Number(Number::F64(n)))
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Json<'de>, E> {
        Ok(Json::Str(Cow::Borrowed(s)))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Json<'de>, E> {
        Ok(Json::Str(Cow::Owned(s.to_string())))
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<Json<'de>, E> {
        Ok(Json::Str(Cow::Owned(s)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json<'de>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(v) = seq.next_element()? {
            items.push(v);
        }
        Ok(Json::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json<'de>, A::Error> {
        let mut pairs = Vec::new();
        while let Some(Text(k)) = map.next_key()? {
            pairs.push((k, map.next_value()?));
        }
        Ok(Json::Object(pairs))
    }
}

impl<'de> Deserialize<'de> for Json<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

/// A request body: its top-level object with only the fields in [`ROUTED`] kept, or
/// `None` when the body is valid JSON but not an object.
pub struct Body<'a>(pub Option<Json<'a>>);

/// The top-level fields any API's parsing reads (`super`): every other field is skipped.
pub const ROUTED: &[&str] = &[
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "prompt",
    "messages",
    "input",
    "instructions",
    "cache_salt",
    "query",
    "documents",
    "text_1",
    "text_2",
    "queries",
];

impl<'de> Deserialize<'de> for Body<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Body<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON document")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Body<'de>, A::Error> {
                let mut pairs = Vec::new();
                while let Some(Text(k)) = map.next_key()? {
                    if ROUTED.contains(&k.as_ref()) {
                        pairs.push((k, map.next_value()?));
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Body(Some(Json::Object(pairs))))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Body<'de>, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Body(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Body<'de>, E> {
                Ok(Body(None))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Body<'de>, E> {
                Ok(Body(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Body<'de>, E> {
                Ok(Body(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Body<'de>, E> {
                Ok(Body(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Body<'de>, E> {
                Ok(Body(None))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Body<'de>, E> {
                Ok(Body(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// Parses a body: `Err` when it is not JSON (the parser's message). The fast path
/// ([`super::scan`]) reads most bodies in one pass; the others go to `serde_json`: a body
/// that is UTF-8 (checked in one pass) is parsed as text, so the parser does not check
/// each string it reads again; any other is parsed as bytes, for the parser's own error.
pub fn parse_keeping(
    body: &[u8],
    keep: impl Fn(&str) -> bool,
) -> Result<Body<'_>, serde_json::Error> {
    if let Some(fast) = super::scan::body_keeping(body, &keep) {
        return Ok(fast);
    }
    // The rare body the fast path leaves: the whole value, then only the kept fields.
    let value: Json = match std::str::from_utf8(body) {
        Ok(text) => serde_json::from_str(text)?,
        Err(_) => serde_json::from_slice(body)?,
    };
    Ok(Body(match value {
        Json::Object(mut pairs) => {
            pairs.retain(|(k, _)| keep(k.as_ref()));
            Some(Json::Object(pairs))
        }
        _ => None,
    }))
}

/// Parses a body keeping the fields of the OpenAI APIs ([`ROUTED`]); see [`parse_keeping`]
/// for another API's.
pub fn parse(body: &[u8]) -> Result<Body<'_>, serde_json::Error> {
    if let Some(fast) = super::scan::body(body) {
        return Ok(fast);
    }
    match std::str::from_utf8(body) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn only_routed_fields_are_kept_strings_borrow_and_the_last_duplicate_wins() {
        let body = br#"{"model":"a","tools":[{"x":{"y":[1,2]}}],"prompt":"p\u00e9","model":"b",
            "max_tokens":7,"stream":null}"#;
        let Body(Some(doc)) = parse(body).unwrap() else {
            panic!("an object")
        };
        assert_eq!(doc.get("model").and_then(Json::as_str), Some("b"));
        assert!(doc.get("tools").is_none(), "skipped");
        assert!(matches!(
            doc.get("model"),
            Some(Json::Str(Cow::Borrowed(_)))
        ));
        assert_eq!(doc.get("prompt").and_then(Json::as_str), Some("pé"));
        assert_eq!(doc.get("max_tokens").and_then(Json::as_u64), Some(7));
        assert_eq!(doc.get("stream"), Some(&Json::Null));
        assert!(parse(b"[1, {\"a\": 2}]").unwrap().0.is_none());
        assert!(parse(b"\"text\"").unwrap().0.is_none());
        assert!(parse(b"{\"model\": ").is_err());
        assert!(parse(b"{} trailing").is_err());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn numbers_read_as_serde_json_reads_them() {
        let Body(Some(doc)) = parse(br#"{"prompt":[1,-2,3.5],"max_tokens":-1}"#).unwrap() else {
            panic!("an object")
        };
        let Some(Json::Array(items)) = doc.get("prompt") else {
            panic!("a list")
        };
        let text: Vec<String> = items
            .iter()
            .map(|i| match i {
                Json::Number(n) => n.to_string(),
                _ => String::new(),
            })
            .collect();
        assert_eq!(text, ["1", "-2", "3.5"]);
        assert_eq!(doc.get("max_tokens").and_then(Json::as_u64), None);
    }
}
