"""scripts/bench quality: routing quality in real time through Envoy. A shared-prefix
workload (groups × prompts, system prompt, question, output; Poisson QPS steps) against
`vllm-sim --profile h100-llama-8b` servers, one pool per side: Envoy ROUND_ROBIN, Envoy
LEAST_REQUEST, sglang-router cache_aware, the filter's default configuration and
optionally another checkout's filter. Every side gets the same seeded requests.
"""
import subprocess
from dataclasses import dataclass, field
from typing import List, Optional

from common import (LOADGEN, Candidate, Result, finish, fmt, loadgen, log, start_envoy, start_sglang, start_sims,
                    table)


@dataclass
class QualityOptions:
    servers: int = 4
    workers: int = 2
    seconds: float = 20
    qps: List[float] = field(default_factory=lambda: [4.0, 8.0, 12.0])
    groups: int = 32
    prompts_per_group: int = 16
    system_prompt_len: int = 1024
    question_len: int = 128
    output_len: int = 64
    zipf: float = 0.0
    max_num_seqs: int = 8
    kv_blocks: int = 1024
    warmup: float = 15
    sglang: bool = True
    candidate: Optional[Candidate] = None


def sim_args(o):
    return ["--profile", "h100-llama-8b", "--max-num-seqs", str(o.max_num_seqs), "--num-gpu-blocks", str(o.kv_blocks)]


def shape(o):
    """loadgen's workload arguments."""
    return ["--groups", str(o.groups), "--prompts-per-group", str(o.prompts_per_group),
            "--system-prompt-len", str(o.system_prompt_len), "--question-len", str(o.question_len),
            "--output-len", str(o.output_len), "--zipf", f"{o.zipf:g}", "--stream"]


def side_definitions(o):
    """(name, kind, argument) per side: kind envoy (argument = lb policy or filter),
    sglang (argument = policy) or candidate."""
    defs = [("Envoy ROUND_ROBIN", "envoy", "ROUND_ROBIN"), ("Envoy LEAST_REQUEST", "envoy", "LEAST_REQUEST"),
            ("sglang cache_aware", "sglang", "cache_aware"), ("filter (default)", "envoy", "filter")]
    if not o.sglang:
        defs = [d for d in defs if d[1] != "sglang"]
    if o.candidate:
        defs.append(("filter (candidate)", "candidate", "filter"))
    return defs


def start_sides(o, procs):
    """{side name: {"url", "sims"}}: each side with its own fresh pool of servers."""
    sides = {}
    for name, kind, arg in side_definitions(o):
        sims = start_sims(procs, o.servers, sim_args(o), f"q-{kind}-{arg}-sim")
        if kind == "envoy":
            url = start_envoy(procs, arg, sims, o.workers, f"q-envoy-{arg}").url
        elif kind == "candidate":
            c = o.candidate
            url = start_envoy(procs, "filter", sims, o.workers, "q-envoy-candidate", c.render, c.wasm).url
        else:
            url = start_sglang(procs, arg, sims, f"q-sglang-{arg}")
        sides[name] = {"url": url, "sims": sims}
    return sides


def warm_up(o, sides, label="quality", workload=None):
    """The same seeded sequence at the first QPS to every side at once (their stacks are
    independent and lightly loaded at that rate), so caches, routers and relays start warm.
    `workload`: loadgen's workload arguments [this bench's `shape(o)`]."""
    workload = shape(o) if workload is None else workload
    warm = []
    for s, side in sides.items():
        cmd = [LOADGEN, "--label", f"{label} warmup {s}", "--url", side["url"], *workload, "--qps",
               str(o.qps[0]), "--duration", f"{o.warmup}s", "--timeout", "60s", "--seed", "999"]
        warm.append((s, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
    for s, p in warm:
        err = finish(p, f"warm-up of {s}", o.warmup + 120)
        log(f"warmed up {s}: {err.strip().splitlines()[-1] if err.strip() else ''}")


def measure(o, sides):
    """The QPS steps in order, the sides alternating (rotated order per step);
    {(side, qps): loadgen summary}."""
    names = list(sides)
    results = {}
    for i, q in enumerate(o.qps):
        order = names[i % len(names):] + names[:i % len(names)]
        for s in order:
            summary = loadgen(["--url", sides[s]["url"], *shape(o), "--qps", q, "--duration", f"{o.seconds}s",
                               "--timeout", "120s", "--seed", str(i + 1),
                               "--server-metrics", ",".join(sides[s]["sims"])],
                              f"quality {q} qps {s}", o.seconds + 180)
            results[(s, q)] = summary
            log(f"{q:5.1f} qps {s:20s} TTFT p50 {summary['ttft_ms'] and summary['ttft_ms']['p50']} ms, "
                f"hit rate {summary['prefix_cache_hit_rate']}")
    return results


def result_table(o, sides, results):
    """One row per (QPS, side)."""
    rows = []
    for q in o.qps:
        for s, side in sides.items():
            r = results[(s, q)]
            t, itl = r["ttft_ms"] or {}, r["itl_ms"] or {}
            shares = [f"{100 * r['server_metrics'].get(addr, {}).get('share', 0):.0f}" for addr in side["sims"]]
            rows.append([f"{q:g}", s, fmt(t.get("p50"), 0), fmt(t.get("p90"), 0), fmt(t.get("p99"), 0),
                         fmt(itl.get("p50"), 1), fmt(itl.get("p90"), 1), fmt(r["output_tokens_per_s"], 0),
                         fmt(r["prefix_cache_hit_rate"] and 100 * r["prefix_cache_hit_rate"], 1),
                         "/".join(shares), f"{r['requests']['ok']}/{r['requests']['sent']}"])
    headers = ["QPS", "side", "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p90 ms",
               "output tok/s", "prefix hit % (servers)", "share per server %", "ok/sent"]
    return table(headers, rows)


def run(o, procs):
    """The quality benchmark; its Result."""
    sides = start_sides(o, procs)
    warm_up(o, sides)
    results = measure(o, sides)
    notes = [
        f"Setup: per side, its own {o.servers} × `vllm-sim {' '.join(sim_args(o))}` (seeds 0..{o.servers - 1}, "
        f"identical across sides); Envoy 1.40 `--concurrency {o.workers}`; sglang-router 0.3.2 defaults. "
        f"Workload (shared prefix, tokens): {o.groups} groups × {o.prompts_per_group} prompts, system "
        f"{o.system_prompt_len}, question {o.question_len}, output {o.output_len} (ignore_eos)"
        + (f", groups drawn Zipf({o.zipf:g})" if o.zipf > 0 else "") + ", streamed "
        f"`/v1/completions`, Poisson arrivals (same seed for every side), {o.seconds:g} s per step after a "
        f"{o.warmup:g} s warm-up at {o.qps[0]:g} QPS (all sides at once). Steps run in order with the sides "
        "alternating (rotated order per step). Prefix hit % = Δ`vllm:prefix_cache_hits_total` ÷ "
        "Δ`vllm:prefix_cache_queries_total` summed over the side's servers (tokens); share = "
        "Δ`vllm:request_success_total` per server.",
        f"Prefix demand {o.groups * o.system_prompt_len} tokens vs KV capacity "
        f"{o.kv_blocks * 16} tokens per server ({o.servers * o.kv_blocks * 16} in the pool).",
    ]
    if o.candidate:
        notes.append(o.candidate.note())
    return Result("Routing quality: shared-prefix workload, real time through Envoy",
                  result_table(o, sides, results), notes)
