//! vllm-sim: a vLLM model-server simulator (being built).
