#!/usr/bin/env bash
# Does Hugging Face `tokenizers` build for wasm32-wasip1, and what would it cost the filter?
# Builds a probe module (tokenizers 0.22, feature unstable_wasm), trains a 32k-token BPE
# tokenizer offline, and measures in Node's V8 (Envoy's Wasm engine): module size,
# instantiation, tokenizer load time, linear memory after loading, encode time per prompt
# size. Scratch files in ${SCRATCH:-/tmp/epp-tokenizer-wasm}. Results: BENCHMARKS.md §13.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
scratch="${SCRATCH:-/tmp/epp-tokenizer-wasm}"
mkdir -p "$scratch"
if [ ! -x "$scratch/venv/bin/python" ]; then
  python3 -m venv "$scratch/venv"
  "$scratch/venv/bin/pip" install -q tokenizers==0.22.2
fi
[ -f "$scratch/tokenizer.json" ] || "$scratch/venv/bin/python" "$here/train.py" "$scratch/tokenizer.json"
CARGO_TARGET_DIR="$scratch/target" cargo build --release --target wasm32-wasip1 \
  --manifest-path "$here/Cargo.toml" >&2
node --no-warnings "$here/measure.mjs" \
  "$scratch/target/wasm32-wasip1/release/tokenizer_wasm_probe.wasm" "$scratch/tokenizer.json"
