"""scripts/bench batch: the batch dispatcher soaking up spare capacity. The pool's capacity
is measured first (closed loop straight to a fresh pool). Then, per side, fresh servers and
a fresh Envoy with the filter take interactive traffic (Poisson, streamed, objective
`interactive`, priority 0) at a fraction of that capacity for a fixed time, and after a
short lead a backlog of batch requests (objective `batch`, priority -10) arrives:

  - none:      interactive only (the TTFT reference);
  - dispatcher B=…: the backlog as an OpenAI Batch file through `dispatcher` with its
               saturation gate (one side per --baselines value), reading the filter's
               saturation from Envoy's stats;
  - no gate:   the same file sent straight into the gateway at once (`dispatcher --gate
               local-max-concurrency:N --workers N`, N = the backlog): the gateway's flow
               control parks it (band -10, TTL 600 s) and releases it when the pool is not
               saturated;
  - … + vLLM priority: the same dispatcher and no-gate sides with the servers run as
               `--scheduling-policy priority` and the dispatcher's `--request-priority 10`
               (vLLM's body field: lower is served first; interactive requests carry none, 0),
               so a server's waiting queue puts interactive requests before batch ones
               (--vllm-priority: off, both (the default) or only).

The filter uses flow control (the `flowControl` gate) with the concurrency detector
(maxConcurrency = --max-num-seqs per server). Reported: interactive TTFT
p50/p90 over the window where batch work was in the pool, batch completions per second in
that window against the spare capacity (capacity minus interactive completions per second),
time to drain, 429s, and the dispatcher's budget over time.
"""
import json
import os
import subprocess
import time
from dataclasses import dataclass

import overload
from common import LOADGEN, ROOT, Result, fmt, log, pct, read_records, start_envoy, start_sims, table

DISPATCHER = os.path.join(ROOT, "target/release/dispatcher")


@dataclass
class BatchOptions:
    servers: int = 2
    workers: int = 2
    max_num_seqs: int = 8
    groups: int = 16
    system_prompt_len: int = 256
    question_len: int = 64
    output_len: int = 32
    load: float = 0.6  # interactive QPS ÷ measured capacity
    seconds: float = 90  # interactive arrivals per side
    lead: float = 5  # interactive-only seconds before the backlog arrives
    batch: int = 2000
    baselines: tuple = (0.05, 0.25)
    metrics: str = "envoy"  # the dispatcher's source: envoy (Envoy's stats) | servers (the sims' /metrics)
    metrics_interval: str = "250ms"
    vllm_priority: str = "both"  # off | both | only: sides with the servers' priority scheduling
    request_priority: int = 10  # the dispatcher's --request-priority on those sides
    calibrate: float = 10
    timeout: float = 120


def filter_config(o):
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "featureGates": ["flowControl"],
        "plugins": [{"type": "concurrency-detector", "parameters": {"maxConcurrency": o.max_num_seqs}}],
        "saturationDetector": {"pluginRef": "concurrency-detector"},
        "flowControl": {"maxRequests": "10k", "maxBytes": "1Gi", "defaultRequestTTL": "600s"},
        "pool": {"objectives": [{"name": "interactive", "priority": 0}, {"name": "batch", "priority": -10}]},
    }


def batch_file(o, path):
    """The backlog as an OpenAI Batch input: distinct prompts (no shared prefix, so no
    prefix-cache hits) of the interactive shape's length in tokens (vllm-sim counts about
    four characters a token: "wNN " is one)."""
    words = o.system_prompt_len + o.question_len
    with open(path, "w") as f:
        for i in range(o.batch):
            prompt = f"doc{i:05d} " + " ".join(f"w{(i * 7 + k) % 97:02d}" for k in range(words))
            body = {"model": "sim-model", "prompt": prompt, "max_tokens": o.output_len, "ignore_eos": True}
            f.write(json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/completions", "body": body}) + "\n")


def side(o, procs, kind, qps, rdir, baseline=None, priority=False):
    """One side; a dict of what was measured. `priority`: the servers schedule by the
    body's priority and the dispatcher sends --request-priority."""
    tag = f"batch-{kind}" + (f"-{baseline}" if baseline is not None else "") + ("-prio" if priority else "")
    tag = tag.replace(" ", "-")
    policy = ["--scheduling-policy", "priority"] if priority else []
    sims = start_sims(procs, o.servers, overload.sim_args(o) + policy, f"{tag}-sim")
    cfg = os.path.join(rdir, f"{tag}.json")
    with open(cfg, "w") as f:
        json.dump(filter_config(o), f)
    envoy = start_envoy(procs, "filter", sims, o.workers, f"{tag}-envoy", config=cfg)
    rec = os.path.join(rdir, f"{tag}-interactive.jsonl")
    t0 = time.monotonic()
    inter = subprocess.Popen(
        [LOADGEN, "--label", f"batch {kind} interactive", "--url", envoy.url, *overload.shape(o),
         "--qps", f"{qps:.3f}", "--duration", f"{o.seconds:g}s", "--timeout", f"{o.timeout:g}s", "--seed", "11",
         "--priorities", "interactive", "--records", rec],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = {"kind": kind, "baseline": baseline, "priority": priority, "batch_ok": 0, "batch_429": 0, "drain_s": None, "budget": [], "batch_done_at": []}
    if kind != "none":
        time.sleep(o.lead)
        start = time.monotonic() - t0
        inp, res, blog = (os.path.join(rdir, f"{tag}-{n}") for n in ("in.jsonl", "out.jsonl", "budget.jsonl"))
        batch_file(o, inp)
        if kind == "dispatcher":
            source = (f"envoy-stats=http://{envoy.admin}/stats/prometheus" if o.metrics == "envoy" else
                      "servers=" + ",".join(f"http://{a}/metrics" for a in sims))
            lag = ["--metrics-lag", "100ms"] if o.metrics == "servers" else []
            gate = ["--metrics", source, *lag,
                    "--max-concurrency", str(o.max_num_seqs), "--baseline", str(baseline),
                    "--workers", str(o.servers * o.max_num_seqs * 2)]
        else:
            gate = ["--gate", f"local-max-concurrency:{o.batch}", "--workers", str(o.batch)]
        if priority:
            gate += ["--request-priority", str(o.request_priority)]
        p = procs.start(f"{tag}-dispatcher", [
            DISPATCHER, "--gateway", f"http://{envoy.url}", "--input", inp, "--output", res, *gate,
            "--metrics-interval", o.metrics_interval, "--budget-log", blog, "--progress-every", "10s"])
        p.wait(timeout=o.seconds * 20 + 600)
        with open(p.bench_out) as f:
            summary = json.loads(f.read().strip().splitlines()[-1])
        out["drain_s"] = summary["elapsed_s"]
        out["batch_429"] = summary["status_429"]
        with open(res) as f:
            lines = [json.loads(line) for line in f]
        out["batch_ok"] = sum(1 for x in lines if x["response"] and x["response"]["status_code"] == 200)
        out["budget"] = [json.loads(line) for line in open(blog)]
        out["start"] = start
    _, err = inter.communicate(timeout=o.seconds + o.timeout + 600)
    if inter.returncode != 0:
        raise SystemExit(f"bench: interactive loadgen failed: {err[-2000:]}")
    out["interactive"] = read_records(rec)
    procs.stop(envoy.proc)
    procs.stop_named(f"{tag}-sim")
    log(f"side {kind}: batch ok {out['batch_ok']}, 429s {out['batch_429']}, drain {fmt(out['drain_s'], 1)} s")
    return out


def window(o, s):
    """[start, end] in seconds from the side's start where batch work was in the pool,
    capped by the interactive arrivals."""
    start = s.get("start", o.lead)
    end = start + (s["drain_s"] or (o.seconds - start))
    return start, min(end, o.seconds)


def ttft(recs, lo, hi):
    v = sorted(r["ttft_ms"] for r in recs if r["status"] == 200 and r["ttft_ms"] is not None
               and lo <= r["sent_ms"] / 1000 <= hi)
    return pct(v, 50), pct(v, 90), len(v)


def completed_rate(recs, lo, hi):
    """Completions per second of records finishing within [lo, hi]."""
    n = sum(1 for r in recs if r["status"] == 200 and lo <= (r["sent_ms"] + (r["latency_ms"] or 0)) / 1000 <= hi)
    return n / max(hi - lo, 1e-9)


def batch_rate(s, lo, hi):
    if s["kind"] != "none":
        pts = [(s["start"] + b["t_ms"] / 1000, b["answered"]) for b in s["budget"]]

        def at(t):
            last = 0
            for tt, a in pts:
                if tt <= t:
                    last = a
            return last
        return (at(hi) - at(lo)) / max(hi - lo, 1e-9)
    return 0.0


def run(o, procs):
    cap, _ = overload.calibrate(o, procs)
    qps = o.load * cap
    log(f"capacity {cap:.1f} req/s; interactive at {qps:.2f} req/s")
    rdir = os.path.join(procs.workdir, "batch")
    os.makedirs(rdir, exist_ok=True)
    variants = {"off": [False], "both": [False, True], "only": [True]}[o.vllm_priority]
    sides = [side(o, procs, "none", qps, rdir)]
    for prio in variants:
        sides += [side(o, procs, "dispatcher", qps, rdir, b, prio) for b in o.baselines]
        sides += [side(o, procs, "no gate", qps, rdir, None, prio)]
    ref = sides[0]
    rows = []
    for s in sides:
        lo, hi = window(o, s if s["kind"] != "none" else sides[1])
        p50, p90, n = ttft(s["interactive"], lo, hi)
        r50, r90, _ = ttft(ref["interactive"], lo, hi)
        irate = completed_rate(s["interactive"], lo, hi)
        spare = cap - irate
        brate = batch_rate(s, lo, hi)
        name = (s["kind"] + (f" B={s['baseline']}" if s["baseline"] is not None else "")
                + (" + vLLM priority" if s.get("priority") else ""))
        rows.append([name, f"{lo:.0f}–{hi:.0f}", n, fmt(p50 and p50 / 1000, 3), fmt(p90 and p90 / 1000, 3),
                     fmt(100 * (p90 / r90 - 1), 1) + " %" if (p90 and r90 and s is not ref) else "–",
                     fmt(irate, 1), fmt(brate, 1), fmt(100 * brate / spare, 0) + " %" if s is not ref and spare > 0 else "–",
                     s["batch_ok"] if s is not ref else "–", s["batch_429"] if s is not ref else "–",
                     fmt(s["drain_s"], 1) if s["drain_s"] else "–"])
    body = (f"Pool: {o.servers} × vllm-sim `--profile h100-llama-8b --max-num-seqs {o.max_num_seqs}`, measured capacity "
            f"**{cap:.1f} req/s** (closed loop, {o.servers * o.max_num_seqs} in flight, straight to the servers); "
            f"interactive at {o.load:.0%} = {qps:.2f} req/s for {o.seconds:g} s (streamed, {o.system_prompt_len}+"
            f"{o.question_len}-token prompts, {o.output_len} output tokens); backlog of {o.batch} batch requests of the "
            f"same shape after {o.lead:g} s. Envoy 1.40 `--concurrency {o.workers}` with the filter (flow control, "
            f"concurrency detector {o.max_num_seqs}/server; objectives interactive 0, batch -10). Dispatcher: "
            f"saturation gate from {'Envoy' + chr(39) + 's stats' if o.metrics == 'envoy' else 'the servers' + chr(39) + ' /metrics (lag 100ms)'}, max-concurrency {o.max_num_seqs}, metrics interval "
            f"{o.metrics_interval}, baseline B per row."
            + (f" `+ vLLM priority` rows: servers with `--scheduling-policy priority`, dispatcher with "
               f"`--request-priority {o.request_priority}` (interactive requests carry none: 0, served first)."
               if o.vllm_priority != "off" else "") + "\n\n")
    body += table(["batch", "window (s)", "interactive n", "TTFT p50 (s)", "TTFT p90 (s)", "p90 rise vs none",
                   "interactive done/s", "batch done/s", "of spare", "batch ok", "429s", "drain (s)"], rows)
    for s_ in [x for x in sides if x["kind"] == "dispatcher"]:
        d = s_["budget"]
        if not d:
            continue
        step = max(1, len(d) // 12)
        brow = [[fmt(b["t_ms"] / 1000, 1), fmt(b["saturation"], 3), b["ready"], b["ceiling_requests"], b["in_flight"],
                 b["answered"], b["status_429"]] for b in d[::step]]
        body += (f"\n\nDispatcher B={s_['baseline']}{' + vLLM priority' if s_.get('priority') else ''}: budget over time (every {step}th decision; S is the "
                 "filter's saturation as read, ceiling the batch requests allowed in flight):\n\n") + table(
            ["t (s)", "S", "ready", "ceiling", "in flight", "answered", "429s"], brow)
    notes = ["`of spare` = batch completions/s in the window ÷ (capacity − interactive completions/s in the window); "
             "TTFT is over interactive requests sent in the window, against the interactive-only side over the same "
             "window."]
    return Result(f"Batch dispatch: spare-capacity use and interactive TTFT (scripts/bench batch)", body, notes)
