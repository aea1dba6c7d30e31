// OpenAI's Node SDK (pinned, installed into .tools/node by scripts/setup --test-tools)
// against a running gateway: each call type once, streamed and not, and a wrong model.
// Run by scripts/lib/test_sdk.py with GATEWAY (the gateway's URL), MODEL and NODE_PATH
// (the node_modules holding the SDK). Exits non-zero on the first failure.
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(path.join(process.env.NODE_PATH, "index.js"));
const OpenAI = require("openai");
const Client = OpenAI.default ?? OpenAI;
const model = process.env.MODEL;
const client = new Client({ baseURL: `${process.env.GATEWAY}/v1`, apiKey: "unused", maxRetries: 0 });

const completion = await client.completions.create({ model, prompt: "Say hello", max_tokens: 4 });
assert.ok(completion.choices[0].text);
let n = 0;
for await (const _ of await client.completions.create({ model, prompt: "Say hello", max_tokens: 4, stream: true })) n++;
assert.ok(n >= 2, `streamed completion chunks: ${n}`);

const messages = [{ role: "user", content: "Say hello" }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 4 });
assert.equal(chat.choices[0].message.role, "assistant");
let usage = null;
for await (const c of await client.chat.completions.create({
  model, messages, max_tokens: 4, stream: true, stream_options: { include_usage: true },
})) usage = c.usage ?? usage;
assert.ok(usage && usage.completion_tokens > 0, "streamed chat usage");

const response = await client.responses.create({ model, input: "Say hello", max_output_tokens: 4 });
assert.ok(["completed", "incomplete"].includes(response.status), response.status);
const types = [];
for await (const e of await client.responses.create({ model, input: "Say hello", max_output_tokens: 4, stream: true })) types.push(e.type);
assert.ok(["response.completed", "response.incomplete"].includes(types.at(-1)), types.at(-1));

const embeddings = await client.embeddings.create({ model, input: ["one", "two"] });
assert.equal(embeddings.data.length, 2);
const models = [];
for await (const m of client.models.list()) models.push(m.id);
assert.ok(models.includes(model));

await assert.rejects(
  client.chat.completions.create({ model: "no-such-model", messages, max_tokens: 2 }),
  (e) => e.status === 404,
);
console.log("openai node sdk: every call type passed");
