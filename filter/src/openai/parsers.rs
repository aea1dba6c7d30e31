//! Which parser reads a request: the reference's request parsers (`requestHandler.parsers`),
//! each claiming path suffixes, resolved by the longest claimed suffix; a parser that claims
//! no path (`passthrough-parser`) takes every path the others leave.
//!
//! Without `requestHandler.parsers` the list is `openai-parser`, `anthropic-parser`,
//! `vllmhttp-parser`, `sglanghttp-parser`, then `passthrough-parser`: an unknown path is
//! never refused by the gateway, it is routed by load (by prefix when its body holds a
//! prompt) and the server answers what it finds wrong. An explicit list is used as given:
//! a path no listed parser claims is answered 404 unless `passthrough-parser` ends the list.
//!
//! Suffixes match whole path segments (`/v1/messages` is Anthropic's, `/v1/xmessages` is
//! not); the query string and a trailing `/` are ignored.

use super::Api;

/// A request parser type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parser {
    /// `openai-parser`: the OpenAI APIs and vLLM's own pooling and tokenizer APIs.
    OpenAi,
    /// `anthropic-parser`: `messages`, `messages/count_tokens`.
    Anthropic,
    /// `vllmhttp-parser`: `inference/v1/generate` (token ids in).
    VllmHttp,
    /// `sglanghttp-parser`: SGLang's `generate`.
    SglangHttp,
    /// `passthrough-parser`: no path of its own; every path the others leave.
    Passthrough,
}

/// `anthropic-parser`.
pub const ANTHROPIC: &str = "anthropic-parser";
/// `vllmhttp-parser`.
pub const VLLM_HTTP: &str = "vllmhttp-parser";
/// `sglanghttp-parser`.
pub const SGLANG_HTTP: &str = "sglanghttp-parser";
/// `passthrough-parser`.
pub const PASSTHROUGH: &str = "passthrough-parser";

/// Every parser type, with its type name in `EndpointPickerConfig`.
pub const TYPES: [(&str, Parser); 5] = [
    (super::PARSER_TYPE, Parser::OpenAi),
    (ANTHROPIC, Parser::Anthropic),
    (VLLM_HTTP, Parser::VllmHttp),
    (SGLANG_HTTP, Parser::SglangHttp),
    (PASSTHROUGH, Parser::Passthrough),
];

/// The parsers used when the configuration lists none, in order.
pub const DEFAULT: [Parser; 5] = [
    Parser::OpenAi,
    Parser::Anthropic,
    Parser::VllmHttp,
    Parser::SglangHttp,
    Parser::Passthrough,
];

impl Parser {
    /// The parser of a plugin type name.
    pub fn of_type(name: &str) -> Option<Parser> {
        TYPES.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
    }

    /// Its type name.
    pub fn type_name(self) -> &'static str {
        TYPES
            .iter()
            .find(|(_, p)| *p == self)
            .map_or("", |(n, _)| n)
    }

    /// The API of `path` (query and trailing `/` removed) when this parser claims it, with
    /// the length of the suffix that matched (the longest claim wins).
    fn claim(self, path: &str) -> Option<(Api, usize)> {
        match self {
            Parser::OpenAi => Api::openai_claim(path),
            Parser::Anthropic => {
                if let Some(n) = suffix(path, "messages/count_tokens") {
                    Some((Api::CountTokens, n))
                } else {
                    suffix(path, "messages").map(|n| (Api::Messages, n))
                }
            }
            Parser::VllmHttp => suffix(path, "inference/v1/generate").map(|n| (Api::Generate, n)),
            Parser::SglangHttp => suffix(path, "generate").map(|n| (Api::SglangGenerate, n)),
            Parser::Passthrough => None,
        }
    }
}

/// `Some(len)` when `path` ends with the segments `s`.
pub(super) fn suffix(path: &str, s: &str) -> Option<usize> {
    let head = path.strip_suffix(s)?;
    (head.is_empty() || head.ends_with('/')).then_some(s.len())
}

/// The configured parsers: the ones claiming paths, in order, and whether a fallback takes
/// the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsers {
    claiming: Vec<Parser>,
    fallback: bool,
    openai: bool,
}

impl Default for Parsers {
    fn default() -> Self {
        match Parsers::new(&DEFAULT) {
            Ok(p) => p,
            Err(_) => Parsers {
                claiming: Vec::new(),
                fallback: true,
                openai: false,
            },
        }
    }
}

/// Why a list of parsers is refused: the index of the entry at fault and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListError {
    pub index: usize,
    pub reason: String,
}

impl Parsers {
    /// The parsers of a `requestHandler.parsers` list. Refused: an empty list, a type
    /// listed twice, an entry after `passthrough-parser` (it would never be used).
    pub fn new(list: &[Parser]) -> Result<Parsers, ListError> {
        if list.is_empty() {
            return Err(ListError {
                index: 0,
                reason: "must list at least one parser".into(),
            });
        }
        let mut claiming: Vec<Parser> = Vec::new();
        let mut fallback = false;
        for (index, p) in list.iter().enumerate() {
            if fallback {
                return Err(ListError {
                    index,
                    reason: format!(
                        "{} comes after passthrough-parser, which takes every path the \
                         parsers before it leave: it would never be used (put \
                         passthrough-parser last)",
                        p.type_name()
                    ),
                });
            }
            if claiming.contains(p) {
                return Err(ListError {
                    index,
                    reason: format!("{} is listed twice", p.type_name()),
                });
            }
            if *p == Parser::Passthrough {
                fallback = true;
            } else {
                claiming.push(*p);
            }
        }
        let openai = claiming.contains(&Parser::OpenAi);
        Ok(Parsers {
            claiming,
            fallback,
            openai,
        })
    }

    /// The API a request for `path` targets; `None` when no parser claims it and there
    /// is no fallback (the gateway answers 404).
    pub fn resolve(&self, path: &str) -> Option<Api> {
        let path = path
            .split_once('?')
            .map_or(path, |(p, _)| p)
            .trim_end_matches('/');
        // The two paths nearly every request takes, at once: no other parser claims a
        // longer suffix of either.
        if self.openai {
            match path {
                "/v1/completions" => return Some(Api::Completions),
                "/v1/chat/completions" => return Some(Api::ChatCompletions),
                _ => {}
            }
        }
        let mut best: Option<(Api, usize)> = None;
        for p in &self.claiming {
            if let Some((api, n)) = p.claim(path) {
                if best.is_none_or(|(_, m)| n > m) {
                    best = Some((api, n));
                }
            }
        }
        match best {
            Some((api, _)) => Some(api),
            None => self.fallback.then_some(Api::Passthrough),
        }
    }

    /// The parsers in use, in order (the fallback last).
    pub fn names(&self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = self.claiming.iter().map(|p| p.type_name()).collect();
        if self.fallback {
            out.push(Parser::Passthrough.type_name());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn the_default_parsers_route_every_api_and_pass_unknown_paths_through() {
        let p = Parsers::default();
        for (path, api) in [
            ("/v1/completions", Api::Completions),
            ("/v1/chat/completions?x=1", Api::ChatCompletions),
            ("/v1/chat/completions/", Api::ChatCompletions),
            ("/v1/messages", Api::Messages),
            ("/v1/messages?beta=true", Api::Messages),
            ("/v1/messages/count_tokens", Api::CountTokens),
            ("/inference/v1/generate", Api::Generate),
            ("/generate", Api::SglangGenerate),
            ("/v1/chat/completions/render", Api::Render),
            ("/v1/completions/render", Api::Render),
            ("/v1/responses", Api::Responses),
            ("/v1/embeddings", Api::Embeddings),
            ("/v1/xmessages", Api::Passthrough),
            ("/v1/images/generations", Api::Passthrough),
            ("/anything/else", Api::Passthrough),
            ("/", Api::Passthrough),
        ] {
            assert_eq!(p.resolve(path), Some(api), "{path}");
        }
        assert_eq!(
            p.names(),
            [
                "openai-parser",
                "anthropic-parser",
                "vllmhttp-parser",
                "sglanghttp-parser",
                "passthrough-parser"
            ]
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn an_explicit_list_claims_only_its_paths_and_the_longest_suffix_wins() {
        let p = Parsers::new(&[Parser::SglangHttp, Parser::VllmHttp]).unwrap();
        assert_eq!(p.resolve("/inference/v1/generate"), Some(Api::Generate));
        assert_eq!(p.resolve("/generate"), Some(Api::SglangGenerate));
        assert_eq!(p.resolve("/v1/completions"), None);
        assert_eq!(p.resolve("/v1/messages"), None);
        let only = Parsers::new(&[Parser::Passthrough]).unwrap();
        assert_eq!(only.resolve("/v1/completions"), Some(Api::Passthrough));
        assert_eq!(only.resolve("/v1/messages"), Some(Api::Passthrough));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_list_that_cannot_mean_what_it_says_is_refused_naming_the_entry() {
        let e = Parsers::new(&[Parser::Passthrough, Parser::OpenAi]).unwrap_err();
        assert_eq!(e.index, 1);
        assert!(
            e.reason.contains("after passthrough-parser"),
            "{}",
            e.reason
        );
        let e = Parsers::new(&[Parser::OpenAi, Parser::Anthropic, Parser::OpenAi]).unwrap_err();
        assert_eq!(e.index, 2);
        assert!(e.reason.contains("twice"));
        assert!(Parsers::new(&[]).is_err());
        assert_eq!(Parser::of_type("anthropic-parser"), Some(Parser::Anthropic));
        assert_eq!(Parser::of_type("vertexai-parser"), None);
    }
}
