#!/usr/bin/env python3
"""The official client SDKs against `scripts/run` (Envoy 1.40 with the filter, two
simulated vLLM servers), as a user tries them: OpenAI's Python SDK and Anthropic's Python
SDK (pinned, installed into .venv by scripts/setup --test-tools), each call type once,
streamed and not, a wrong model (the server's 404, typed by the SDK), and an error the
gateway itself answers (in the SDK's own error shape); then OpenAI's Node SDK
(scripts/lib/test_sdk_node.mjs) when Node and the SDK are installed.

  .venv/bin/python scripts/lib/test_sdk.py     (about 30 s; needs the release builds)
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import unittest

import anthropic
import openai

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = "sim-model"
NODE_SDK = os.path.join(ROOT, ".tools", "node", "node_modules", "openai")


class Gateway:
    """`scripts/run` with two simulated servers, stopped on exit by SIGTERM, on which it stops
    what it started; it acts on the signal between two status lines, hence one a second."""

    def __enter__(self):
        self.proc = subprocess.Popen(
            [os.path.join(ROOT, "scripts", "run"), "--sim-servers", "2", "--status-every", "1",
             "--sim-args", "--time-to-first-token 5ms --inter-token-latency 2ms"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.url = None
        for line in self.proc.stdout:
            if line.startswith("listening on "):
                self.url = line.split()[2]
                break
        if self.url is None:
            self.proc.wait(timeout=30)
            raise RuntimeError(f"scripts/run exited {self.proc.returncode} before listening")
        # Keep reading so the status lines never block it.
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Sdks(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.gateway = Gateway().__enter__()
        cls.openai = openai.OpenAI(base_url=cls.gateway.url + "/v1", api_key="unused",
                                   max_retries=0, timeout=30)
        cls.anthropic = anthropic.Anthropic(base_url=cls.gateway.url, api_key="unused",
                                            max_retries=0, timeout=30)

    @classmethod
    def tearDownClass(cls):
        cls.gateway.__exit__(None, None, None)

    # OpenAI's Python SDK.
    def test_openai_completions(self):
        r = self.openai.completions.create(model=MODEL, prompt="Say hello", max_tokens=4)
        self.assertEqual(r.model, MODEL)
        self.assertTrue(r.choices[0].text)
        self.assertGreater(r.usage.prompt_tokens, 0)
        chunks = list(self.openai.completions.create(model=MODEL, prompt="Say hello",
                                                     max_tokens=4, stream=True))
        self.assertGreaterEqual(len(chunks), 2)

    def test_openai_chat(self):
        messages = [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Say hello"}]
        r = self.openai.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertGreater(r.usage.completion_tokens, 0)
        chunks = list(self.openai.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=4, stream=True,
            stream_options={"include_usage": True}))
        self.assertIsNotNone(chunks[-1].usage)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertTrue(text)

    def test_openai_responses(self):
        r = self.openai.responses.create(model=MODEL, input="Say hello", max_output_tokens=4)
        # Four tokens may end the answer early: `incomplete` (max_output_tokens) is a finish.
        self.assertIn(r.status, ("completed", "incomplete"))
        self.assertTrue(r.output_text)
        events = [e.type for e in self.openai.responses.create(
            model=MODEL, input="Say hello", max_output_tokens=4, stream=True)]
        self.assertEqual(events[0], "response.created")
        self.assertIn(events[-1], ("response.completed", "response.incomplete"))

    def test_openai_embeddings_and_models(self):
        r = self.openai.embeddings.create(model=MODEL, input=["one", "two"])
        self.assertEqual(len(r.data), 2)
        self.assertIn(MODEL, [m.id for m in self.openai.models.list()])

    def test_openai_wrong_model_and_gateway_error(self):
        with self.assertRaises(openai.NotFoundError):
            self.openai.chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        # A chat request without messages: the gateway's own 400, in OpenAI's shape.
        with self.assertRaises(openai.BadRequestError) as e:
            self.openai.chat.completions.create(model=MODEL, messages=[], max_tokens=2)
        self.assertEqual(e.exception.body["type"], "invalid_request_error")

    # Anthropic's Python SDK.
    def test_anthropic_messages(self):
        r = self.anthropic.messages.create(
            model=MODEL, max_tokens=8, system="Be brief.",
            messages=[{"role": "user", "content": "Say hello"}])
        self.assertEqual(r.role, "assistant")
        self.assertEqual(r.model, MODEL)
        self.assertEqual(r.content[0].type, "text")
        self.assertGreater(r.usage.input_tokens, 0)
        self.assertGreater(r.usage.output_tokens, 0)

    def test_anthropic_streamed_messages(self):
        events = list(self.anthropic.messages.create(
            model=MODEL, max_tokens=8, stream=True,
            messages=[{"role": "user", "content": "Say hello"}]))
        types = [e.type for e in events]
        self.assertEqual(types[0], "message_start")
        self.assertEqual(types[-1], "message_stop")
        self.assertIn("content_block_delta", types)
        # The SDK's stream helper assembles the message from the same events.
        with self.anthropic.messages.stream(
                model=MODEL, max_tokens=8,
                messages=[{"role": "user", "content": "Say hello"}]) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        self.assertTrue(text)
        self.assertIn(final.stop_reason, ("end_turn", "max_tokens"))
        self.assertGreater(final.usage.output_tokens, 0)

    def test_anthropic_count_tokens(self):
        r = self.anthropic.messages.count_tokens(
            model=MODEL, messages=[{"role": "user", "content": "Count these words"}])
        self.assertGreater(r.input_tokens, 0)

    def test_anthropic_wrong_model_and_gateway_error(self):
        with self.assertRaises(anthropic.NotFoundError) as e:
            self.anthropic.messages.create(
                model="no-such-model", max_tokens=8,
                messages=[{"role": "user", "content": "hi"}])
        self.assertEqual(e.exception.body["error"]["type"], "not_found_error")
        # No messages: the gateway's own 400, in Anthropic's shape.
        with self.assertRaises(anthropic.BadRequestError) as e:
            self.anthropic.messages.create(model=MODEL, max_tokens=8, messages=[])
        self.assertEqual(e.exception.body["error"]["type"], "invalid_request_error")

    # OpenAI's Node SDK, when present.
    def test_openai_node_sdk(self):
        node = shutil.which("node")
        if node is None or not os.path.isdir(NODE_SDK):
            self.skipTest("Node or the openai Node SDK is not installed")
        env = dict(os.environ, GATEWAY=self.gateway.url, MODEL=MODEL,
                   NODE_PATH=os.path.dirname(NODE_SDK))
        r = subprocess.run([node, os.path.join(ROOT, "scripts", "lib", "test_sdk_node.mjs")],
                           env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
