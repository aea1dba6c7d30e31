// Loads the tokenizers probe in Node's V8 (the engine Envoy uses), loads tokenizer.json,
// and times encode() on prompts of several sizes. Prints JSON.
import { readFileSync } from "node:fs";
import { WASI } from "node:wasi";
const wasmPath = process.argv[2], tokPath = process.argv[3];
const bytes = readFileSync(wasmPath);
const wasi = new WASI({ version: "preview1", args: [], env: {} });
const t0 = performance.now();
const { instance } = await WebAssembly.instantiate(bytes, { wasi_snapshot_preview1: wasi.wasiImport });
wasi.initialize(instance);
const t1 = performance.now();
const { memory, alloc, load, encode } = instance.exports;
const memBefore = memory.buffer.byteLength;
const put = (buf) => { const p = alloc(buf.length); new Uint8Array(memory.buffer, p, buf.length).set(buf); return p; };
const tok = readFileSync(tokPath);
const t2 = performance.now();
const rc = load(put(tok), tok.length);
const t3 = performance.now();
const memAfter = memory.buffer.byteLength;
const base = readFileSync(new URL("./src/lib.rs", import.meta.url)).toString() + " The quick brown fox jumps over the lazy dog. ";
const out = { module_bytes: bytes.length, instantiate_ms: t1 - t0, load_rc: rc, load_ms: t3 - t2,
  memory_before_load_bytes: memBefore, memory_after_load_bytes: memAfter, encode: [] };
for (const chars of [1000, 4000, 16000, 64000]) {
  let text = ""; while (text.length < chars) text += base; text = text.slice(0, chars);
  const buf = Buffer.from(text); const p = put(buf);
  for (let i = 0; i < 20; i++) encode(p, buf.length); // warm up
  const n = 200; const s = performance.now(); let tokens = 0;
  for (let i = 0; i < n; i++) tokens = encode(p, buf.length);
  const e = performance.now();
  out.encode.push({ chars, tokens, us_per_encode: ((e - s) * 1000) / n });
}
out.memory_after_encodes_bytes = memory.buffer.byteLength;
console.log(JSON.stringify(out, null, 1));
