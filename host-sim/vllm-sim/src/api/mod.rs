//! The APIs vLLM serves, without I/O: request parsing, response bodies, SSE, errors.
//!
//! * [`openai`]: `/v1/completions` and `/v1/chat/completions`, and [`sse`] their streams;
//! * [`responses`]: `/v1/responses` (the OpenAI Responses API);
//! * [`anthropic`]: `/v1/messages` and `/v1/messages/count_tokens` (Anthropic's Messages);
//! * [`generate`]: `/inference/v1/generate`, SGLang's `/generate`, the render endpoints;
//! * [`pooling`]: `/v1/embeddings`, `/pooling`, `/classify`, `/score`, `/rerank`;
//! * [`tokenize`]: `/tokenize` and `/detokenize`;
//! * [`conversations`]: `/v1/conversations` and their items;
//! * [`audio`]: `/v1/audio/transcriptions` and `/v1/audio/translations` (multipart);
//! * [`errors`]: the OpenAI-style error bodies.

pub mod anthropic;
pub mod audio;
pub mod conversations;
pub mod errors;
pub mod generate;
pub mod openai;
pub mod pooling;
pub mod responses;
pub mod sse;
pub mod tokenize;
