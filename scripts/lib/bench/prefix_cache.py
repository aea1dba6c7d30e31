"""scripts/bench prefix-cache: the three prefix-cache methods of the filter in real time
through Envoy, under cache pressure (the groups' system prompts need more KV than the
pool has, so the servers evict): the approximate index without cached-token feedback,
with it (the default), and `precise-prefix-cache-scorer` fed by the servers' KV events
through `kv-relay`. Per side its own `vllm-sim` pool (publishing KV events over ZMQ on
the KV-events side), its own Envoy with the filter, and on the KV-events side a
`kv-relay` following the servers. Every side gets the same seeded requests.

Per QPS step and side: TTFT p50/p90/p99 and output tokens/s (loadgen), the real prefix
hit rate (the servers' `vllm:prefix_cache_*` counters), and how right the filter was about
the chosen server's cache: predicted ÷ reported hit tokens and the share of judged
requests whose prediction held (the filter's cached-token feedback counters, which count
with feedback off too; Δ over the step, from Envoy's `/stats/prometheus`). At the end,
the size of the relay's full snapshot (`GET /v1/kv/state`: what a filter VM reads when
it starts or falls behind).
"""
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from typing import List

from common import (LOADGEN, ROOT, Result, fmt, http_get, loadgen, log, start_envoy, start_sims, table,
                    wait_for)
from quality import warm_up

KV_RELAY = os.path.join(ROOT, "target/release/kv-relay")
CONFIGS = os.path.join(ROOT, "scripts/lib/bench")
MODEL = "sim-model"
# (side, the filter's configuration, whether the servers publish KV events to a relay)
SIDES = [
    ("index", "prefix-feedback-off.json", False),
    ("index + feedback", "prefix-feedback-on.json", False),
    ("KV events", "prefix-kv-events.json", True),
]
COUNTERS = {
    "predicted": "inference_extension_prefix_cache_predicted_hit_tokens_total",
    "reported": "inference_extension_prefix_cache_reported_hit_tokens_total",
}
OUTCOMES = ("confirmed", "evicted", "grown", "unsettled")


@dataclass
class PrefixCacheOptions:
    servers: int = 4
    workers: int = 2
    seconds: float = 20
    qps: List[float] = field(default_factory=lambda: [4.0, 8.0])
    groups: int = 32
    prompts_per_group: int = 16
    system_prompt_len: int = 1024
    question_len: int = 128
    output_len: int = 64
    max_num_seqs: int = 8
    kv_blocks: int = 384
    warmup: float = 10
    # The KV-events side's filter configuration (default: prefix-kv-events.json).
    precise_config: str = ""


def sim_args(o):
    return ["--profile", "h100-llama-8b", "--max-num-seqs", str(o.max_num_seqs), "--num-gpu-blocks", str(o.kv_blocks)]


def shape(o):
    """loadgen's workload arguments."""
    return ["--groups", str(o.groups), "--prompts-per-group", str(o.prompts_per_group),
            "--system-prompt-len", str(o.system_prompt_len), "--question-len", str(o.question_len),
            "--output-len", str(o.output_len), "--stream"]


def start_event_sims(procs, o, tag):
    """o.servers vllm-sim servers publishing KV events on ephemeral ZMQ ports; their
    addresses and their kv-relay `--server` specs."""
    kv = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:0",
                     "replay_endpoint": "tcp://*:0", "topic": "kv@bench"})
    addrs = start_sims(procs, o.servers, sim_args(o) + ["--kv-events-config", kv], tag)
    specs = []
    for p, addr in zip([p for p in procs.procs if p.bench_name.startswith(tag)], addrs):
        def ports(p=p):
            with open(p.bench_out) as f:
                text = f.read()
            ev = re.search(r"kv events on \S*:(\d+)", text)
            rep = re.search(r"kv events replay on \S*:(\d+)", text)
            return ev and rep and (ev.group(1), rep.group(1))
        events, replay = wait_for("vllm-sim's KV event ports", ports, p, 10)
        specs.append(f"endpoint={addr},model={MODEL},events=tcp://127.0.0.1:{events},"
                     f"replay=tcp://127.0.0.1:{replay}")
    return addrs, specs


def start_relay(procs, specs):
    """kv-relay following the servers; its host:port."""
    args = [KV_RELAY, "--listen", "127.0.0.1:0"]
    for s in specs:
        args += ["--server", s]
    p = procs.start("kv-relay", args)

    def read():
        with open(p.bench_out) as f:
            m = re.search(r"listening on http://(\S+)", f.read())
            return m and m.group(1)
    return wait_for("kv-relay", read, p, 20)


def sides_of(o):
    """SIDES, with the KV-events side's configuration replaced by --precise-config."""
    if not o.precise_config:
        return SIDES
    return [(n, os.path.abspath(o.precise_config) if events else c, events) for n, c, events in SIDES]


def start_sides(o, procs):
    """{side: {"url", "admin", "sims", "relay"}}, each with its own fresh pool."""
    sides = {}
    for i, (name, config, events) in enumerate(sides_of(o)):
        tag = f"p{i}-sim"
        relay, extra = None, []
        if events:
            sims, specs = start_event_sims(procs, o, tag)
            relay = start_relay(procs, specs)
            extra = ["--cluster", f"kv-relay={relay}"]
        else:
            sims = start_sims(procs, o.servers, sim_args(o), tag)
        envoy = start_envoy(procs, "filter", sims, o.workers, f"p{i}-envoy",
                            config=os.path.join(CONFIGS, config), render_args=extra)
        sides[name] = {"url": envoy.url, "admin": envoy.admin, "sims": sims, "relay": relay}
    return sides


def counters(admin):
    """The filter's feedback counters from Envoy's admin (summed over its workers)."""
    text = http_get(f"http://{admin}/stats/prometheus", 5.0)[1]

    def total(name, label=None):
        v = 0.0
        for line in text.splitlines():
            if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
                if label is None or label in line:
                    v += float(line.rsplit(" ", 1)[1])
        return v
    c = {k: total(n) for k, n in COUNTERS.items()}
    for outcome in OUTCOMES:
        c[outcome] = total("inference_extension_prefix_cache_feedback_total", f'outcome="{outcome}"')
    return c


def measure(o, sides):
    """The QPS steps in order, the sides alternating (rotated order per step);
    {(side, qps): (loadgen summary, Δ feedback counters)}."""
    names = list(sides)
    results = {}
    for i, q in enumerate(o.qps):
        order = names[i % len(names):] + names[:i % len(names)]
        for s in order:
            before = counters(sides[s]["admin"])
            summary = loadgen(["--url", sides[s]["url"], *shape(o), "--qps", q, "--duration", f"{o.seconds}s",
                               "--timeout", "120s", "--seed", str(i + 1),
                               "--server-metrics", ",".join(sides[s]["sims"])],
                              f"prefix-cache {q} qps {s}", o.seconds + 180)
            after = counters(sides[s]["admin"])
            delta = {k: after[k] - before[k] for k in after}
            results[(s, q)] = (summary, delta)
            log(f"{q:5.1f} qps {s:18s} TTFT p50 {summary['ttft_ms'] and summary['ttft_ms']['p50']} ms, "
                f"hit rate {summary['prefix_cache_hit_rate']}, predicted/reported "
                f"{delta['predicted']:.0f}/{delta['reported']:.0f}")
    return results


def accuracy(d):
    """(predicted ÷ reported hit tokens, share of judged requests within tolerance)."""
    judged = d["confirmed"] + d["evicted"] + d["grown"]
    ratio = d["predicted"] / d["reported"] if d["reported"] > 0 else None
    held = 100 * d["confirmed"] / judged if judged > 0 else None
    return ratio, held


def result_table(o, sides, results):
    rows = []
    for q in o.qps:
        for s in sides:
            r, d = results[(s, q)]
            t = r["ttft_ms"] or {}
            ratio, held = accuracy(d)
            rows.append([f"{q:g}", s, f"{fmt(t.get('p50'), 0)} / {fmt(t.get('p90'), 0)} / {fmt(t.get('p99'), 0)}",
                         fmt(r["output_tokens_per_s"], 0),
                         fmt(r["prefix_cache_hit_rate"] and 100 * r["prefix_cache_hit_rate"], 1),
                         fmt(ratio, 2), fmt(held, 0), f"{r['requests']['ok']}/{r['requests']['sent']}"])
    headers = ["QPS", "method", "TTFT p50 / p90 / p99 ms", "output tok/s", "prefix hit % (servers)",
               "predicted ÷ reported", "within tolerance %", "ok/sent"]
    return table(headers, rows)


def snapshot_size(relay):
    """(bytes, blocks) of the relay's full snapshot."""
    body = http_get(f"http://{relay}/v1/kv/state", 10.0)[1]
    blocks = sum(len(s.get("add", [])) for s in json.loads(body).get("servers", []))
    return len(body.encode()), blocks


def run(o, procs):
    """The prefix-cache benchmark; its Result."""
    if not os.path.exists(KV_RELAY):
        raise SystemExit(f"bench: {KV_RELAY} is missing (cargo build --release -p kv-relay)")
    sides = start_sides(o, procs)
    warm_up(o, sides, "prefix-cache", shape(o))
    results = measure(o, sides)
    relay = next(s["relay"] for s in sides.values() if s["relay"])
    size, blocks = snapshot_size(relay)
    demand = o.groups * o.system_prompt_len
    pool = o.servers * o.kv_blocks * 16
    notes = [
        f"Setup: per side, its own {o.servers} × `vllm-sim {' '.join(sim_args(o))}` (seeds 0..{o.servers - 1}, "
        f"identical across sides; on the KV-events side with `--kv-events-config` publishing over ZMQ and a "
        f"`kv-relay` following them); Envoy 1.40 `--concurrency {o.workers}` with the filter configured by "
        + ", ".join(f"`{os.path.relpath(os.path.join(CONFIGS, c), ROOT)}` ({n})" for n, c, _ in sides_of(o))
        + f". Workload: {o.groups} groups × {o.prompts_per_group} prompts, system {o.system_prompt_len} + "
        f"question {o.question_len} tokens, output {o.output_len} (ignore_eos), streamed `/v1/completions` "
        f"with usage, Poisson arrivals (same seed for every side), {o.seconds:g} s per step after a "
        f"{o.warmup:g} s warm-up at {o.qps[0]:g} QPS (all sides at once); sides alternate (rotated order "
        f"per step). Prefix demand {demand} tokens vs {pool} tokens of KV in the pool "
        f"({100 * demand / pool:.0f} %).",
        "Prefix hit % = Δ`vllm:prefix_cache_hits_total` ÷ Δ`vllm:prefix_cache_queries_total` over the "
        "side's servers. Predicted ÷ reported = Δ`inference_extension_prefix_cache_predicted_hit_tokens_total` "
        "÷ Δ`…_reported_hit_tokens_total`; within tolerance = Δconfirmed ÷ Δ(confirmed + evicted + grown) "
        "of `inference_extension_prefix_cache_feedback_total` (unsettled reports left out), from Envoy's "
        "`/stats/prometheus` before and after each step.",
        f"The relay's full snapshot at the end: {size} bytes for {blocks} blocks "
        f"({size / max(blocks, 1):.1f} bytes per block).",
    ]
    return Result("Prefix-cache prediction under cache pressure, real time through Envoy",
                  result_table(o, sides, results), notes)
