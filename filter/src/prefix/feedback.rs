//! Cached-token feedback: what the approximate index predicted for a request on the endpoint
//! it chose, against what that server reports in `usage.prompt_tokens_details.cached_tokens`.
//!
//! * At the pick, an [`Expectation`]: the blocks the index credited the endpoint with,
//!   and where each sat in the endpoint's LRU (its stamp) before the pick refreshed it.
//! * From the response, a [`Report`] ([`parse_usage`]): `prompt_tokens` and, when the
//!   server gives it, `cached_tokens`. vLLM writes `prompt_tokens_details` only when
//!   started with `--enable-prompt-tokens-details`, and leaves it out (or `null`) when
//!   nothing was cached; so a server that has reported `cached_tokens` once is taken to
//!   mean 0 when it leaves it out ([`Reporters`]; known to every worker through the
//!   shared record [`REPORTERS_KEY`]), and one that never did teaches nothing.
//! * [`judge`] turns both into a [`Verdict`]: predicted and reported hit tokens (the
//!   metrics), and a [`Correction`]: the server *missed* blocks the index credited (it
//!   evicted them: the index drops that block and everything older on that endpoint, and
//!   the endpoint's capacity becomes what is left), or it *hit* more than was credited
//!   (the capacity was too small: it grows by an eighth, up to the configured one).
//!
//! The index counts in its own blocks (`blockSizeTokens × 4` characters), the server in
//! tokens: the request's own `prompt_tokens / prompt characters` converts one into the
//! other, and a tolerance of two blocks (or an eighth of the prediction) absorbs the
//! rounding at block edges (vLLM never counts the prompt's last token as cached, and the
//! index's last block is partial).

use super::index::PrefixIndex;
use crate::openai::usage_number;
use crate::shared_store::{read, update, SharedStore, StoreError};
use hashbrown::HashSet;
use prost::Message;

/// Shared-data key of the endpoints known to report `cached_tokens` (any worker's finding).
pub const REPORTERS_KEY: &str = "epp.v1.prefix.reporters";

/// The shared record of endpoints known to report `cached_tokens`.
#[derive(Clone, PartialEq, Message)]
pub struct ReportersRecord {
    /// `ip:port` of each (at most [`Reporters::MAX`]; past that it starts over).
    #[prost(string, repeated, tag = "1")]
    pub endpoints: Vec<String>,
}

/// What the index predicted for a request on its primary endpoint.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Expectation {
    /// The endpoint (`ip:port`).
    pub endpoint: String,
    /// The request's block hashes (the server holds them once it has served the request).
    pub hashes: Vec<u64>,
    /// Leading blocks the index credited the endpoint with.
    pub matched: u32,
    /// LRU stamps of those blocks before the pick refreshed them (`matched` of them).
    pub stamps: Vec<u64>,
    /// The endpoint's LRU clock at the pick (the stamp of its latest insertion).
    pub clock: u64,
    /// Insertions within which a block may belong to a request still in flight on the
    /// endpoint (its prefill not done, so not cached yet): requests in flight there at the
    /// pick × this request's blocks. A miss on such a block is no evidence of eviction.
    pub unsettled: u64,
    /// Characters per block.
    pub block_chars: u64,
    /// Characters of the prompt.
    pub prompt_chars: u64,
    /// The endpoint's configured capacity (the most the learned one grows to).
    pub ceiling: u64,
    /// Whether the report corrects the index (`cachedTokensFeedback`), or is only counted.
    pub correct: bool,
}

/// What the server reported in `usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Report {
    /// `usage.prompt_tokens`.
    pub prompt_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: Option<u64>,
}

/// How the index is corrected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Correction {
    /// The prediction held (within the tolerance).
    None,
    /// The server evicted the block of this stamp: drop it and everything older on the
    /// endpoint, then credit the endpoint with the request's blocks again.
    Evicted {
        /// Stamp of the first credited block the server did not have.
        stamp: u64,
    },
    /// The server missed a block the index credited, inserted so recently that it may be
    /// another request's still in prefill: nothing is corrected.
    Unsettled,
    /// The server held more than the index credited: grow the endpoint's capacity.
    Grow {
        /// The most it may grow to.
        ceiling: u64,
    },
}

/// The comparison of one request's prediction with its report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Prompt tokens the index predicted cached on the endpoint.
    pub predicted_tokens: u64,
    /// Prompt tokens the server reported cached.
    pub reported_tokens: u64,
    /// What to do to the index.
    pub correction: Correction,
}

/// Endpoints that have reported `cached_tokens` at least once (so an absent one means 0):
/// this VM's copy of [`REPORTERS_KEY`]. Bounded: past [`Reporters::MAX`] it starts over.
#[derive(Debug, Default)]
pub struct Reporters {
    seen: HashSet<String>,
}

/// Records in shared data that `endpoint` reports `cached_tokens`.
pub fn publish_reporter(store: &impl SharedStore, endpoint: &str) -> Result<(), StoreError> {
    update(store, REPORTERS_KEY, |r: &mut ReportersRecord| {
        if !r.endpoints.iter().any(|e| e == endpoint) {
            if r.endpoints.len() >= Reporters::MAX {
                r.endpoints.clear();
            }
            r.endpoints.push(endpoint.to_string());
        }
    })
}

/// Whether any worker found that `endpoint` reports `cached_tokens`.
pub fn is_reporter(store: &impl SharedStore, endpoint: &str) -> Result<bool, StoreError> {
    Ok(read::<ReportersRecord>(store, REPORTERS_KEY)?
        .is_some_and(|r| r.endpoints.iter().any(|e| e == endpoint)))
}

impl Reporters {
    /// Most endpoints remembered.
    pub const MAX: usize = 4096;

    /// Whether this VM knows `endpoint` reports `cached_tokens`.
    pub fn knows(&self, endpoint: &str) -> bool {
        self.seen.contains(endpoint)
    }

    /// Notes that `endpoint` reports `cached_tokens`; `true` when it was new to this VM.
    pub fn learn(&mut self, endpoint: &str) -> bool {
        if self.seen.contains(endpoint) {
            return false;
        }
        if self.seen.len() >= Self::MAX {
            self.seen.clear();
        }
        self.seen.insert(endpoint.to_string());
        true
    }

    /// The cached tokens `endpoint` reported, resolving an absent field: 0 from a server
    /// known to report them (`shared`: asked only then, whether another worker knows it),
    /// unknown (`None`) otherwise. `learned`: set when the endpoint became known here from
    /// its own report (to publish).
    pub fn resolve(
        &mut self,
        endpoint: &str,
        report: Report,
        shared: impl FnOnce(&str) -> bool,
        learned: &mut bool,
    ) -> Option<u64> {
        match report.cached_tokens {
            Some(n) => {
                *learned = self.learn(endpoint);
                Some(n)
            }
            None if report.prompt_tokens.is_none() => None,
            None if self.knows(endpoint) => Some(0),
            None if shared(endpoint) => {
                self.learn(endpoint);
                Some(0)
            }
            None => None,
        }
    }
}

/// Compares `e` with the server's report of `prompt_tokens` and `cached_tokens`.
pub fn judge(e: &Expectation, prompt_tokens: u64, cached_tokens: u64) -> Option<Verdict> {
    if prompt_tokens == 0 || e.prompt_chars == 0 || e.block_chars == 0 {
        return None;
    }
    let matched = u64::from(e.matched);
    let predicted_chars = (matched * e.block_chars).min(e.prompt_chars);
    let predicted_tokens = scale(predicted_chars, prompt_tokens, e.prompt_chars);
    let cached_tokens = cached_tokens.min(prompt_tokens);
    let reported_chars = scale(cached_tokens, e.prompt_chars, prompt_tokens);
    let reported_blocks = reported_chars / e.block_chars;
    let total_blocks = u64::try_from(e.hashes.len()).unwrap_or(u64::MAX);
    let tolerance = (matched / 8).max(2);
    let correction = if reported_blocks + tolerance < matched {
        match usize::try_from(reported_blocks)
            .ok()
            .and_then(|i| e.stamps.get(i))
        {
            Some(&stamp) if e.clock.saturating_sub(stamp) < e.unsettled => Correction::Unsettled,
            Some(&stamp) => Correction::Evicted { stamp },
            None => Correction::None,
        }
    } else if reported_blocks > matched + tolerance.max(total_blocks / 8) {
        Correction::Grow { ceiling: e.ceiling }
    } else {
        Correction::None
    };
    Some(Verdict {
        predicted_tokens,
        reported_tokens: cached_tokens,
        correction,
    })
}

/// The capacity after growing from `current` (an eighth more, at least one, at most `ceiling`).
pub fn grown(current: usize, ceiling: u64) -> usize {
    let ceiling = usize::try_from(ceiling).unwrap_or(usize::MAX).max(1);
    current.saturating_add((current / 8).max(1)).min(ceiling)
}

/// The capacity after an eviction left `remaining` entries: never less than the request's
/// own blocks plus one, nor [`MIN_CAPACITY`].
pub fn shrunk(remaining: usize, request_blocks: usize) -> usize {
    remaining.max(request_blocks + 1).max(MIN_CAPACITY)
}

/// Applies `correction` of a request expected as `e` to `index`; returns the endpoint's
/// new capacity when it changed (for the other workers: `super::shared::publish_capacity`).
pub fn apply(index: &mut PrefixIndex, e: &Expectation, correction: &Correction) -> Option<usize> {
    if !e.correct {
        return None;
    }
    let current = index.capacity(&e.endpoint)?;
    let capacity = match *correction {
        Correction::None | Correction::Unsettled => return None,
        Correction::Evicted { stamp } => {
            index.evict_through(&e.endpoint, stamp);
            // Serving the request cached its blocks on the server again.
            index.insert(&e.endpoint, &e.hashes, current);
            shrunk(index.entries(&e.endpoint), e.hashes.len()).min(current)
        }
        Correction::Grow { ceiling } => grown(current, ceiling),
    };
    if capacity == current {
        return None;
    }
    index.set_capacity(&e.endpoint, capacity);
    Some(capacity)
}

/// The smallest capacity feedback sets.
pub const MIN_CAPACITY: usize = 16;

/// `v × num / den`, in 128 bits, rounded down.
fn scale(v: u64, num: u64, den: u64) -> u64 {
    if den == 0 {
        return 0;
    }
    u64::try_from(u128::from(v) * u128::from(num) / u128::from(den)).unwrap_or(u64::MAX)
}

/// Bytes read from the end of each response chunk of a watched request: vLLM's `usage`
/// and what follows it (the end of a body, or `data: [DONE]`) fit easily.
pub const TAIL: usize = 1024;
/// Bytes of the previous chunk kept before the next (a `usage` split between two chunks).
const CARRY: usize = 320;

/// One routed request watched for the `usage` at the end of its response.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Watch {
    /// What the index predicted.
    pub expected: Expectation,
    /// The latest `usage` seen.
    pub report: Report,
    carry: Vec<u8>,
}

impl Watch {
    /// Watches a request expected as `expected`.
    pub fn new(expected: Expectation) -> Self {
        Self {
            expected,
            ..Self::default()
        }
    }

    /// The end (at most [`TAIL`] bytes) of the next response chunk.
    pub fn chunk(&mut self, tail: &[u8]) {
        let mut window = std::mem::take(&mut self.carry);
        window.extend_from_slice(tail);
        let mut report = parse_usage(&window);
        if report.prompt_tokens.is_some() {
            // A later usage of the same prompt without the cached count (Anthropic's
            // `message_delta` after `message_start`) keeps the count already read.
            if report.cached_tokens.is_none() && report.prompt_tokens == self.report.prompt_tokens {
                report.cached_tokens = self.report.cached_tokens;
            }
            self.report = report;
        }
        let keep = window.len().saturating_sub(CARRY);
        self.carry = window.split_off(keep);
    }
}

/// The `usage` of a response chunk (`window`: the chunk's tail, with the previous chunk's
/// tail before it): the last `prompt_tokens` and `cached_tokens` in it (Anthropic's
/// Messages: `input_tokens` and `cache_read_input_tokens`). Streamed chunks
/// carry `"usage":null` until the usage chunk, which has no choices.
pub fn parse_usage(window: &[u8]) -> Report {
    Report {
        prompt_tokens: usage_number(window, b"\"prompt_tokens\"")
            .or_else(|| usage_number(window, b"\"input_tokens\"")),
        cached_tokens: usage_number(window, b"\"cached_tokens\"")
            .or_else(|| usage_number(window, b"\"cache_read_input_tokens\"")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    /// 20 blocks of 64 characters, 4 characters per token (1280 characters, 320 tokens).
    fn expectation(matched: u32) -> Expectation {
        Expectation {
            endpoint: "a".into(),
            hashes: (0..20).collect(),
            matched,
            stamps: (100..100 + u64::from(matched)).collect(),
            clock: 500,
            unsettled: 0,
            block_chars: 64,
            prompt_chars: 1280,
            ceiling: 1000,
            correct: true,
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_credited_prefix_the_server_did_not_have_is_an_eviction_at_its_first_missing_block() {
        // Credited 16 blocks (256 tokens); the server had 4 blocks' worth (64 tokens).
        let v = judge(&expectation(16), 320, 64).unwrap();
        assert_eq!(v.predicted_tokens, 256);
        assert_eq!(v.reported_tokens, 64);
        assert_eq!(v.correction, Correction::Evicted { stamp: 104 });
        // A complete miss points at the first credited block.
        let v = judge(&expectation(16), 320, 0).unwrap();
        assert_eq!(v.correction, Correction::Evicted { stamp: 100 });
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_miss_on_blocks_requests_in_flight_may_still_be_computing_is_not_an_eviction() {
        // Block 4 was inserted 396 insertions before the pick (stamp 104, clock 500).
        let busy = Expectation {
            unsettled: 397,
            ..expectation(16)
        };
        assert_eq!(
            judge(&busy, 320, 64).unwrap().correction,
            Correction::Unsettled
        );
        let settled = Expectation {
            unsettled: 396,
            ..expectation(16)
        };
        assert_eq!(
            judge(&settled, 320, 64).unwrap().correction,
            Correction::Evicted { stamp: 104 }
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn block_edge_rounding_is_not_an_eviction() {
        // All 20 blocks credited; vLLM reports its full blocks short of the last token.
        let v = judge(&expectation(20), 320, 304).unwrap();
        assert_eq!(v.correction, Correction::None);
        assert_eq!(v.predicted_tokens, 320);
        // Tokens longer than 4 characters: the request's own ratio converts them.
        let v = judge(&expectation(20), 160, 144).unwrap();
        assert_eq!(v.correction, Correction::None);
        assert_eq!(v.predicted_tokens, 160);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_server_holding_more_than_credited_grows_the_capacity() {
        let v = judge(&expectation(0), 320, 304).unwrap();
        assert_eq!(v.correction, Correction::Grow { ceiling: 1000 });
        assert_eq!(grown(80, 1000), 90);
        assert_eq!(grown(4, 1000), 5);
        assert_eq!(grown(995, 1000), 1000);
        assert_eq!(
            grown(2000, 1000),
            1000,
            "never above the configured capacity"
        );
        assert_eq!(shrunk(3, 20), 21);
        assert_eq!(shrunk(500, 20), 500);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn an_eviction_stops_crediting_the_endpoint_with_older_prefixes_and_shrinks_it() {
        let mut ix = PrefixIndex::new();
        // Three older prompts, then the one being served, on "a" (capacity 100); "b" has
        // the first one too.
        for p in 0..3u64 {
            ix.insert("a", &[p * 10, p * 10 + 1, p * 10 + 2], 100);
        }
        ix.insert("b", &[0, 1, 2], 100);
        ix.insert("a", &[90, 91, 92, 93], 100);
        let e = Expectation {
            endpoint: "a".into(),
            hashes: vec![10, 11, 12],
            matched: 3,
            stamps: ix.stamps("a", &[10, 11, 12]),
            clock: ix.clock("a"),
            unsettled: 4,
            block_chars: 64,
            prompt_chars: 192,
            ceiling: 100,
            correct: true,
        };
        ix.insert("a", &e.hashes, 100); // the pick
                                        // The server had none of it: it evicted prompt 1, so prompt 0 too.
        let v = judge(&e, 48, 0).unwrap();
        assert_eq!(v.correction, Correction::Evicted { stamp: e.stamps[0] });
        assert_eq!(apply(&mut ix, &e, &v.correction), Some(16));
        let m = ix.matches(&[0, 1, 2], ["a", "b"].into_iter(), 16);
        assert_eq!((m[0].matched, m[1].matched), (0, 3));
        // What it holds now: the request it just served, and what came after prompt 1.
        assert!(ix.holds("a", 10) && ix.holds("a", 20) && ix.holds("a", 93));
        // A report of more than was credited grows the capacity back.
        let grow = Correction::Grow { ceiling: 100 };
        assert_eq!(apply(&mut ix, &e, &grow), Some(18));
        assert_eq!(apply(&mut ix, &e, &Correction::None), None);
        let observed = Expectation {
            correct: false,
            ..e.clone()
        };
        assert_eq!(apply(&mut ix, &observed, &grow), None, "only counted");
        assert_eq!(ix.capacity("a"), Some(18));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn nothing_is_judged_without_a_prompt() {
        assert_eq!(judge(&expectation(4), 0, 0), None);
        let e = Expectation {
            prompt_chars: 0,
            ..expectation(4)
        };
        assert_eq!(judge(&e, 10, 0), None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn usage_is_read_from_vllm_bodies_and_usage_chunks() {
        let body = br#"{"id":"cmpl-1","choices":[{"text":"hi"}],"usage":{"prompt_tokens":120,"total_tokens":125,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":96}},"kv_transfer_params":null}"#;
        assert_eq!(
            parse_usage(body),
            Report {
                prompt_tokens: Some(120),
                cached_tokens: Some(96)
            }
        );
        // vLLM without --enable-prompt-tokens-details, or with nothing cached.
        let body = br#""usage":{"prompt_tokens":120,"total_tokens":125,"completion_tokens":5,"prompt_tokens_details":null}}"#;
        assert_eq!(
            parse_usage(body),
            Report {
                prompt_tokens: Some(120),
                cached_tokens: None
            }
        );
        let chunk = b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\":null}\n\n";
        assert_eq!(parse_usage(chunk), Report::default());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_usage_split_between_chunks_is_read_whole() {
        let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\":null}\n\n\
            data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1200,\"total_tokens\":1210,\
            \"completion_tokens\":10,\"prompt_tokens_details\":{\"cached_tokens\":1024}}}\n\n\
            data: [DONE]\n\n";
        for cut in [1, 60, 100, 110, 150, 190, stream.len() - 3] {
            let mut w = Watch::new(expectation(4));
            let (a, b) = stream.as_bytes().split_at(cut);
            w.chunk(a);
            w.chunk(b);
            assert_eq!(
                w.report,
                Report {
                    prompt_tokens: Some(1200),
                    cached_tokens: Some(1024)
                },
                "cut at {cut}"
            );
        }
        // The Responses API names them input tokens.
        let done = br#"{"type":"response.completed","response":{"usage":{"input_tokens":50,"input_tokens_details":{"cached_tokens":32},"output_tokens":4}}}"#;
        assert_eq!(parse_usage(done).prompt_tokens, Some(50));
        assert_eq!(parse_usage(done).cached_tokens, Some(32));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn an_absent_cached_count_is_zero_only_from_a_server_known_to_report_it() {
        use crate::shared_store::MemoryStore;
        let store = MemoryStore::default();
        let shared = |e: &str| is_reporter(&store, e).unwrap();
        let (mut vm1, mut vm2) = (Reporters::default(), Reporters::default());
        let mut learned = false;
        let absent = Report {
            prompt_tokens: Some(10),
            cached_tokens: None,
        };
        let some = Report {
            prompt_tokens: Some(10),
            cached_tokens: Some(8),
        };
        assert_eq!(vm1.resolve("a", absent, shared, &mut learned), None);
        assert_eq!(vm1.resolve("a", some, shared, &mut learned), Some(8));
        assert!(learned, "new here: to publish");
        publish_reporter(&store, "a").unwrap();
        assert_eq!(vm1.resolve("a", absent, shared, &mut learned), Some(0));
        assert_eq!(vm1.resolve("b", absent, shared, &mut learned), None);
        let none = Report::default();
        assert_eq!(vm1.resolve("a", none, shared, &mut learned), None);
        // Another worker learns it from the shared record, once.
        assert!(!vm2.knows("a"));
        assert_eq!(vm2.resolve("a", absent, shared, &mut learned), Some(0));
        assert!(vm2.knows("a"));
        publish_reporter(&store, "a").unwrap();
        let r: ReportersRecord = read(&store, REPORTERS_KEY).unwrap().unwrap();
        assert_eq!(r.endpoints, vec!["a".to_string()]);
    }
}
