//! Ground truth from the response stream the filter sees, per request:
//! TTFT = dispatch → first response body chunk (streamed) or → last chunk (not
//! streamed: the reference's end-to-end reading); TPOT (streamed only) =
//! (last chunk − first chunk) / (tokens − 1), tokens being the body's
//! `usage.completion_tokens` when the last chunk carries it, else the chunk count.
//! A request whose response never produced a body chunk, or whose status was not
//! 2xx, teaches nothing.

use super::features::N;
use super::model::Sample;
use super::Slo;

/// What the filter keeps about one routed request for the predictor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tracked {
    /// The endpoint it was sent to.
    pub endpoint: String,
    /// Its features at pick time.
    pub x: [f64; N],
    /// TTFT predicted at pick time (ms).
    pub predicted_ttft_ms: Option<f64>,
    /// TPOT predicted at pick time (ms).
    pub predicted_tpot_ms: Option<f64>,
    /// Its objectives.
    pub slo: Slo,
    /// `stream: true`.
    pub streaming: bool,
    /// Listed in the shared running list (to remove at the end).
    pub listed: bool,
    /// Dispatch time (µs).
    pub dispatched_us: u64,
    /// First body chunk (µs).
    pub first_us: Option<u64>,
    /// Last body chunk (µs).
    pub last_us: u64,
    /// Non-empty body chunks.
    pub chunks: u64,
    /// `usage.completion_tokens`, when the last chunk had it.
    pub completion_tokens: Option<u64>,
    /// The response status was 2xx.
    pub ok: bool,
}

/// A request's observed latencies (ms).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Truth {
    /// TTFT.
    pub ttft_ms: f64,
    /// TPOT, when measurable.
    pub tpot_ms: Option<f64>,
}

impl Tracked {
    /// A request dispatched at `now_us`.
    pub fn new(endpoint: String, x: [f64; N], slo: Slo, streaming: bool, now_us: u64) -> Self {
        Self {
            endpoint,
            x,
            predicted_ttft_ms: None,
            predicted_tpot_ms: None,
            slo,
            streaming,
            listed: false,
            dispatched_us: now_us,
            first_us: None,
            last_us: now_us,
            chunks: 0,
            completion_tokens: None,
            ok: true,
        }
    }

    /// A response body chunk of `size` bytes arrived at `now_us`.
    pub fn chunk(&mut self, now_us: u64, size: usize) {
        if size == 0 {
            return;
        }
        if self.first_us.is_none() {
            self.first_us = Some(now_us);
        }
        self.chunks += 1;
        self.last_us = now_us;
    }

    /// The observed latencies, when the response taught anything.
    pub fn truth(&self) -> Option<Truth> {
        if !self.ok {
            return None;
        }
        let first = self.first_us?;
        let ms = |us: u64| us as f64 / 1_000.0;
        if !self.streaming {
            return Some(Truth {
                ttft_ms: ms(self.last_us.saturating_sub(self.dispatched_us)),
                tpot_ms: None,
            });
        }
        let tokens = self.completion_tokens.unwrap_or(self.chunks);
        let tpot_ms = (tokens >= 2 && self.last_us > first)
            .then(|| ms(self.last_us - first) / (tokens - 1) as f64);
        Some(Truth {
            ttft_ms: ms(first.saturating_sub(self.dispatched_us)),
            tpot_ms,
        })
    }

    /// The training sample of this request with `truth`.
    pub fn sample(&self, truth: Truth) -> Sample {
        Sample {
            address: self.endpoint.clone(),
            x: self.x.to_vec(),
            ttft_ms: truth.ttft_ms,
            tpot_ms: truth.tpot_ms.unwrap_or(0.0),
            predicted_ttft_ms: self.predicted_ttft_ms.unwrap_or(0.0),
            predicted_tpot_ms: self.predicted_tpot_ms.unwrap_or(0.0),
        }
    }
}

/// `usage.completion_tokens` from a response chunk, when present (the last one of a
/// body or a stream with `include_usage`); `output_tokens` in the Responses API's and
/// Anthropic's `usage`.
pub fn completion_tokens(chunk: &[u8]) -> Option<u64> {
    crate::openai::usage_number(chunk, b"\"completion_tokens\"")
        .or_else(|| crate::openai::usage_number(chunk, b"\"output_tokens\""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn tracked(streaming: bool) -> Tracked {
        Tracked::new("a".into(), [0.0; N], Slo::default(), streaming, 1_000)
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_stream_gives_ttft_at_the_first_chunk_and_tpot_between_chunks() {
        let mut t = tracked(true);
        t.chunk(51_000, 10); // first token 50 ms after dispatch
        t.chunk(61_000, 0); // empty: not a chunk
        t.chunk(71_000, 10);
        t.chunk(91_000, 10);
        let truth = t.truth().unwrap();
        assert_eq!(truth.ttft_ms, 50.0);
        assert_eq!(truth.tpot_ms, Some(20.0)); // 40 ms over 2 gaps
                                               // With usage: 5 tokens over the same 40 ms.
        t.completion_tokens = Some(5);
        assert_eq!(t.truth().unwrap().tpot_ms, Some(10.0));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_whole_body_gives_end_to_end_as_ttft_and_no_tpot() {
        let mut t = tracked(false);
        t.chunk(201_000, 300);
        t.chunk(301_000, 300);
        assert_eq!(
            t.truth(),
            Some(Truth {
                ttft_ms: 300.0,
                tpot_ms: None
            })
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn failures_and_empty_responses_teach_nothing() {
        let t = tracked(true);
        assert_eq!(t.truth(), None);
        let mut t = tracked(true);
        t.chunk(5_000, 10);
        t.ok = false;
        assert_eq!(t.truth(), None);
        // One chunk: a TTFT, no TPOT.
        let mut t = tracked(true);
        t.chunk(5_000, 10);
        assert_eq!(t.truth().unwrap().tpot_ms, None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn reads_usage_from_the_last_chunk() {
        let chunk = br#"data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens": 34,"total_tokens":46}}

data: [DONE]"#;
        assert_eq!(completion_tokens(chunk), Some(34));
        assert_eq!(completion_tokens(b"data: [DONE]"), None);
        assert_eq!(completion_tokens(br#""completion_tokens":"#), None);
    }
}
