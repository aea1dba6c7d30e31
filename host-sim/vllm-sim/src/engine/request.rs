//! Types of the engine's interface: what goes in (requests), what comes out
//! (events), and why a request can be refused.

use std::fmt;
use std::time::Duration;

/// Identifies a request inside one engine.
pub type RequestId = u64;

/// P/D disaggregation role of a request (`kv_transfer_params`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvTransfer {
    #[default]
    None,
    /// Prefill side (`do_remote_decode: true`): prefill, emit one token, finish
    /// with `remote_decode`.
    RemoteDecode,
    /// Decode side (`do_remote_prefill: true`): pay the KV transfer instead of
    /// the prefill, then decode.
    RemotePrefill,
}

/// A request as the engine sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineRequest {
    /// Prompt token ids (see [`crate::tokenizer`]).
    pub prompt: Vec<u32>,
    /// `max_tokens` / `max_completion_tokens`.
    pub max_tokens: Option<u32>,
    /// Generate exactly `max_tokens` tokens.
    pub ignore_eos: bool,
    /// LoRA adapter name, if the request targets one.
    pub lora: Option<String>,
    pub kv_transfer: KvTransfer,
    /// The body's `priority` (lower is served earlier); anything but 0 needs
    /// [`SchedulingPolicy::Priority`](super::SchedulingPolicy).
    pub priority: i64,
}

impl EngineRequest {
    /// A request for exactly `output_tokens` tokens (`ignore_eos`).
    pub fn fixed(prompt: Vec<u32>, output_tokens: u32) -> Self {
        EngineRequest {
            prompt,
            max_tokens: Some(output_tokens),
            ignore_eos: true,
            ..Default::default()
        }
    }
}

/// Why a request finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    RemoteDecode,
    Abort,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::RemoteDecode => "remote_decode",
            FinishReason::Abort => "abort",
        }
    }
}

/// Token counts of a finished request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

impl Usage {
    pub fn total_tokens(&self) -> usize {
        self.prompt_tokens + self.completion_tokens
    }
}

/// When things happened to a request, in engine time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timings {
    pub arrival: Duration,
    /// First admitted to the running batch.
    pub scheduled: Option<Duration>,
    pub first_token: Option<Duration>,
    pub finished: Duration,
}

/// A finished request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finished {
    pub reason: FinishReason,
    pub usage: Usage,
    pub timings: Timings,
}

/// Something that happened to a request at time `at`.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub request: RequestId,
    pub at: Duration,
    pub kind: EventKind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum EventKind {
    /// An output token; `index` 0 is the first token (its time is the TTFT).
    Token { index: usize, text: &'static str },
    /// The request finished (after its last token, at the same time).
    Finished(Finished),
}

/// Why the engine refused a request. [`status`](Self::status) is the HTTP
/// status vLLM answers with and `Display` gives its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// The waiting queue is at `max-waiting-queue-length`.
    QueueFull,
    EmptyPrompt,
    /// `max_tokens` < 1.
    InvalidMaxTokens(i64),
    ContextTooLong {
        max_model_len: usize,
        prompt_tokens: usize,
        max_tokens: Option<u32>,
    },
    /// The request cannot fit in the KV cache even when it is empty.
    KvCapacity,
    /// The request names a LoRA adapter that is not loaded.
    UnknownLora(String),
    /// A `priority` other than 0 while the policy is `fcfs`.
    PriorityNotEnabled(i64),
}

impl SubmitError {
    pub fn status(&self) -> u16 {
        match self {
            SubmitError::QueueFull => 429,
            SubmitError::EmptyPrompt
            | SubmitError::InvalidMaxTokens(_)
            | SubmitError::ContextTooLong { .. }
            | SubmitError::PriorityNotEnabled(_) => 400,
            SubmitError::KvCapacity => 500,
            SubmitError::UnknownLora(_) => 404,
        }
    }
}

impl fmt::Display for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubmitError::QueueFull => {
                f.write_str("Failed to enqueue request, waiting requests queue is full")
            }
            SubmitError::EmptyPrompt => f.write_str("Prompt cannot be empty"),
            SubmitError::InvalidMaxTokens(n) => {
                write!(f, "max_tokens must be at least 1, got {n}.")
            }
            SubmitError::ContextTooLong {
                max_model_len,
                prompt_tokens,
                max_tokens: Some(m),
            } => write!(
                f,
                "This model's maximum context length is {max_model_len} tokens. However, you requested {} tokens ({prompt_tokens} in the messages, {m} in the completion). Please reduce the length of the messages or completion.",
                *prompt_tokens + *m as usize
            ),
            SubmitError::ContextTooLong {
                max_model_len,
                prompt_tokens,
                max_tokens: None,
            } => write!(
                f,
                "This model's maximum context length is {max_model_len} tokens. However, you requested {prompt_tokens} tokens in the messages, Please reduce the length of the messages."
            ),
            SubmitError::KvCapacity => {
                f.write_str("the kv cache does not have sufficient capacity to store this request")
            }
            SubmitError::UnknownLora(name) => write!(f, "The model `{name}` does not exist."),
            SubmitError::PriorityNotEnabled(p) => write!(
                f,
                "Got priority {p} but Priority scheduling is not enabled."
            ),
        }
    }
}

impl std::error::Error for SubmitError {}
