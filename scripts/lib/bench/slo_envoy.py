"""scripts/bench slo-envoy: SLO-aware routing in real time, through Envoy. The mixed-SLO
workload of `scripts/bench slo` (virtual time) against `vllm-sim --profile h100-llama-8b`
servers, one pool per side: the filter's default profile, the shipped SLO configuration
(`envoy/config/slo-routing.json`: requests with an SLO header go to its `slo` profile) and
Envoy LEAST_REQUEST. Three SLO classes, each its own seeded Poisson stream (one loadgen
per class, so the sum is Poisson at the step's QPS):

  interactive  TTFT 300 ms, TPOT 40 ms, objective `critical`, prompts 40-650 tokens,
               16-128 output tokens
  relaxed      TTFT 3 s, TPOT 150 ms, objective `standard`, prompts 200-2,100 tokens,
               64-256 output tokens
  sheddable    relaxed's SLOs and shapes, objective `batch` (priority -1)

First `--initial-warmup` seconds at the first step's QPS per side (the predictor learns
from them); then per QPS step and side: `--warmup` seconds of the same load, then
`--seconds` measured (the pools and gateways stay up from step to step).
Attainment = requests sent in the measured window that got a 200 with TTFT (at the
client) and TPOT within their SLOs ÷ sent; goodput = those per second. For the SLO side,
also the predictor's MAPE over the window (its own counters, read from Envoy).
"""
import argparse
import json
import os
import subprocess
import tempfile

from common import (LOADGEN, ROOT, Result, finish, fmt, http_get, log, pct, read_records, start_envoy,
                    start_sims, table)

SLO_CONFIG = os.path.join(ROOT, "envoy/config/slo-routing.json")
OBJECTIVES = [{"name": "critical", "priority": 10}, {"name": "standard", "priority": 0},
              {"name": "batch", "priority": -1}]
# name, TTFT ms, TPOT ms, objective, question tokens, output tokens
CLASSES = [("interactive", 300, 40, "critical", "40-650", "16-128"),
           ("relaxed", 3000, 150, "standard", "200-2100", "64-256"),
           ("sheddable", 3000, 150, "batch", "200-2100", "64-256")]
SIDES = {"default": "filter, default profile",
         "slo": "filter, envoy/config/slo-routing.json",
         "least_request": "Envoy LEAST_REQUEST"}
ERROR = "inference_extension_latency_predictor_absolute_percentage_error_total"
SCORED = "inference_extension_latency_predictor_scored_total"


def options(argv):
    p = argparse.ArgumentParser(prog="scripts/bench slo-envoy")
    p.add_argument("--servers", type=int, default=4)
    p.add_argument("--workers", type=int, default=2, help="Envoy workers [2]")
    p.add_argument("--qps", default="3,5,7,9", help="QPS steps [3,5,7,9]")
    p.add_argument("--seconds", type=float, default=30, help="measured seconds per step [30]")
    p.add_argument("--warmup", type=float, default=15, help="seconds of the same load first [15]")
    p.add_argument("--initial-warmup", type=float, default=30,
                   help="seconds at the first step's QPS before the first step (the predictor learns) [30]")
    p.add_argument("--sides", default="default,slo,least_request")
    p.add_argument("--mix", default="0.5,0.3,0.2", help="interactive,relaxed,sheddable shares")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--kv-blocks", type=int, default=4096)
    o = p.parse_args(argv)
    o.qps = [float(x) for x in o.qps.split(",") if x.strip()]
    o.sides = [s.strip() for s in o.sides.split(",") if s.strip()]
    o.mix = [float(x) for x in o.mix.split(",")]
    for s in o.sides:
        if s not in SIDES:
            raise SystemExit(f"bench: slo-envoy: unknown side {s!r} (known: {', '.join(SIDES)})")
    if len(o.mix) != 3 or min(o.mix) < 0 or sum(o.mix) <= 0:
        raise SystemExit("bench: slo-envoy: --mix takes three shares ≥ 0, not all 0")
    return o


def filter_config(side, d):
    """The filter's configuration file for a filter side."""
    config = {}
    if side == "slo":
        with open(SLO_CONFIG) as f:
            config = json.load(f)
    config["pool"] = {"objectives": OBJECTIVES}
    path = os.path.join(d, f"{side}.json")
    with open(path, "w") as f:
        json.dump(config, f)
    return path


def start_side(o, procs, side):
    sims = start_sims(procs, o.servers, ["--profile", "h100-llama-8b", "--max-num-seqs", str(o.max_num_seqs),
                                         "--num-gpu-blocks", str(o.kv_blocks)], f"slo-{side}-sim")
    if side == "least_request":
        e = start_envoy(procs, "LEAST_REQUEST", sims, o.workers, f"slo-{side}")
    else:
        d = tempfile.mkdtemp(prefix=f"slo-{side}-", dir=procs.workdir)
        e = start_envoy(procs, "filter", sims, o.workers, f"slo-{side}", config=filter_config(side, d))
    return e


def send(o, envoy, qps, seconds, seed, records=None):
    """The three classes at once for `seconds` at `qps` in total; {class: records path}."""
    running = []
    for k, (name, ttft, tpot, objective, question, output) in enumerate(CLASSES):
        share = o.mix[k] / sum(o.mix)
        if share <= 0:
            continue
        cmd = [LOADGEN, "--label", name, "--url", envoy.url, "--qps", str(qps * share),
               "--duration", f"{seconds}s", "--timeout", "120s", "--seed", str(seed * 10 + k),
               "--groups", "64", "--prompts-per-group", "64", "--system-prompt-len", "8",
               "--question-len", question, "--output-len", output, "--stream",
               "--priorities", objective, "--header", f"x-llm-d-slo-ttft-ms:{ttft}",
               "--header", f"x-llm-d-slo-tpot-ms:{tpot}"]
        path = None
        if records is not None:
            path = f"{records}-{name}.jsonl"
            cmd += ["--records", path]
        running.append((name, path, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                                     text=True)))
    out = {}
    for name, path, p in running:
        finish(p, f"slo-envoy: loadgen ({name})", seconds + 240)
        out[name] = path
    return out


def predictor_counters(envoy):
    """{("ttft"|"tpot", "error"|"scored"): value} from the filter's counters."""
    text = http_get(f"http://{envoy.admin}/stats/prometheus")[1]
    got = {}
    for line in text.splitlines():
        for metric, kind in ((ERROR, "error"), (SCORED, "scored")):
            if line.startswith(metric + "{"):
                for t in ("ttft", "tpot"):
                    if f'prediction="{t}"' in line:
                        got[(t, kind)] = float(line.rsplit(" ", 1)[1])
    return got


def mape(before, after, t):
    """The MAPE (%) over the window; Envoy's stats hold the error sum in thousandths."""
    n = after.get((t, "scored"), 0) - before.get((t, "scored"), 0)
    if n <= 0:
        return None
    return (after.get((t, "error"), 0) - before.get((t, "error"), 0)) / 10 / n


def summarize(records, ttft_slo, tpot_slo):
    ok = [r for r in records if r["status"] == 200 and not r["error"] and not r["timed_out"]]
    met = [r for r in ok if r["ttft_ms"] is not None and r["ttft_ms"] <= ttft_slo
           and (r["tpot_ms"] is None or r["tpot_ms"] <= tpot_slo)]
    ttft = sorted(r["ttft_ms"] for r in ok if r["ttft_ms"] is not None)
    tpot = sorted(r["tpot_ms"] for r in ok if r["tpot_ms"] is not None)
    return {"sent": len(records), "met": len(met), "shed": sum(1 for r in records if r["status"] == 429),
            "ttft": (pct(ttft, 50), pct(ttft, 90)), "tpot": (pct(tpot, 50), pct(tpot, 90))}


def run(o, procs):
    """The slo-envoy benchmark; its Result."""
    envoys = {s: start_side(o, procs, s) for s in o.sides}
    for s in o.sides:
        send(o, envoys[s], o.qps[0], o.initial_warmup, 800)
    rows = []
    for i, q in enumerate(o.qps):
        order = o.sides[i % len(o.sides):] + o.sides[:i % len(o.sides)]
        for s in order:
            e = envoys[s]
            send(o, e, q, o.warmup, 900 + i)
            before = predictor_counters(e)
            paths = send(o, e, q, o.seconds, i + 1, os.path.join(procs.workdir, f"slo-{s}-{q:g}"))
            after = predictor_counters(e)
            per = {}
            for name, ttft, tpot, *_ in CLASSES:
                if paths.get(name):
                    per[name] = summarize(read_records(paths[name]), ttft, tpot)
            met = sum(c["met"] for c in per.values())
            sent = sum(c["sent"] for c in per.values())
            inter = per.get("interactive")
            share = lambda c: fmt(c["met"] / c["sent"], 3) if c and c["sent"] else "–"
            m_ttft, m_tpot = mape(before, after, "ttft"), mape(before, after, "tpot")
            rows.append([
                f"{q:g}", SIDES[s],
                (f"{share(inter)}, {fmt(inter['ttft'][0], 0)} / {fmt(inter['ttft'][1], 0)}, "
                 f"{fmt(inter['tpot'][0], 0)} / {fmt(inter['tpot'][1], 0)}") if inter else "–",
                share(per.get("relaxed")),
                f"{share(per.get('sheddable'))} ({per['sheddable']['shed']})" if per.get("sheddable") else "–",
                f"{fmt(met / o.seconds, 2)} ({fmt(inter['met'] / o.seconds, 2) if inter else '–'})",
                f"{fmt(m_ttft, 1)} / {fmt(m_tpot, 1)}" if m_ttft is not None else "–",
                sent,
            ])
            log(f"{q:g} QPS {s}: interactive {share(inter)}, goodput {met / o.seconds:.2f}/s, sent {sent}")
    headers = ["QPS", "side", "interactive: attainment, TTFT p50/p90, TPOT p50/p90 ms", "relaxed",
               "sheddable (429)", "goodput /s (interactive)", "MAPE % TTFT / TPOT", "sent"]
    notes = [
        f"Setup: {o.servers} vllm-sim servers (h100-llama-8b, max-num-seqs {o.max_num_seqs}, "
        f"{o.kv_blocks} KV blocks) per side, Envoy {o.workers} workers; mix interactive/relaxed/sheddable "
        f"{'/'.join(f'{m:g}' for m in o.mix)}; {o.initial_warmup:g} s at the first QPS first, then per step {o.warmup:g} s warm-up at the step's QPS, then "
        f"{o.seconds:g} s measured; streamed completions with usage; sides alternate (rotated order per step).",
        "Classes: interactive TTFT 300 ms / TPOT 40 ms (objective critical, prompts 40-650 tokens, 16-128 "
        "output), relaxed 3 s / 150 ms (standard, 200-2,100 tokens, 64-256 output), sheddable as relaxed "
        "(batch, priority -1). Attainment = 200 within both SLOs ÷ sent (TTFT at the client); goodput = "
        "those per second; MAPE from the filter's predictor counters over the measured window.",
    ]
    return Result("SLO-aware routing in real time through Envoy", table(headers, rows), notes)
