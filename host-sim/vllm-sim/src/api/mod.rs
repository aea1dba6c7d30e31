//! The OpenAI-compatible API: request parsing, response bodies, SSE, errors.

pub mod errors;
pub mod openai;
pub mod sse;
