"""scripts/bench overhead: added latency per request at concurrency 1 (non-streamed, and
streamed TTFT on keep-alive and on new connections) and requests/s at saturation (closed
loop), in front of `vllm-sim --profile zero`, for each side: direct, Envoy without the
filter (same bootstrap), Envoy with the filter, optionally another checkout's filter and
sglang-router cache_aware / round_robin. Sides alternate within the run.
"""
import os
import tempfile
from dataclasses import dataclass
from typing import Optional

from common import (Candidate, Result, fmt, loadgen, log, pct, read_records, start_envoy, start_sglang,
                    start_sims, table)


@dataclass
class OverheadOptions:
    servers: int = 2
    workers: int = 2
    seconds: float = 3
    rounds: int = 2
    saturation_concurrency: int = 32
    sglang: bool = True
    candidate: Optional[Candidate] = None


SIM_ARGS = ["--profile", "zero", "--max-num-seqs", "256"]
# 80-token prompts (8 groups x 8), 16 output tokens.
SHAPE = ["--groups", "8", "--prompts-per-group", "8", "--system-prompt-len", "64", "--question-len", "16",
         "--output-len", "16"]
WARMUP_REQUESTS = 20


def phases(o):
    """(name, loadgen arguments) of the four phases."""
    return [
        ("c1", ["--concurrency", "1", "--no-stream"]),
        ("c1-stream", ["--concurrency", "1", "--stream"]),
        ("c1-stream-newconn", ["--concurrency", "1", "--stream", "--new-connection"]),
        ("sat", ["--concurrency", str(o.saturation_concurrency), "--no-stream"]),
    ]


def start_sides(o, procs, sims):
    """{side name: (url, extra loadgen arguments, proxy PID or None)} in the order they are
    reported."""
    sides = {"direct": (",".join(sims), [], None)}
    envoy = start_envoy(procs, "nofilter", sims, o.workers, "envoy-nofilter")
    sides["envoy"] = (envoy.url, ["--destinations", ",".join(sims), "--destination-header", envoy.header],
                      envoy.proc.pid)
    e = start_envoy(procs, "filter", sims, o.workers, "envoy-filter")
    sides["envoy+filter"] = (e.url, [], e.proc.pid)
    if o.candidate:
        c = o.candidate
        e = start_envoy(procs, "filter", sims, o.workers, "envoy-candidate", c.render, c.wasm)
        sides["envoy+filter (candidate)"] = (e.url, [], e.proc.pid)
    if o.sglang:
        for pol in ("cache_aware", "round_robin"):
            url = start_sglang(procs, pol, sims, f"sglang-{pol}")
            sides[f"sglang {pol}"] = (url, [], procs.procs[-1].pid)
    return sides


def cpu_seconds(pid):
    """User + system CPU time a process has used (its threads included), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(o, procs, sides):
    """Runs every phase on every side, `rounds` times, rotating the side order each round;
    {(side, phase): {"records", "ok", "failed", "elapsed"}} pooled over the rounds."""
    names = list(sides)
    results = {(s, ph): {"records": [], "ok": 0, "elapsed": 0.0, "failed": 0, "cpu": 0.0}
               for s in names for ph, _ in phases(o)}
    rdir = tempfile.mkdtemp(prefix="records-", dir=procs.workdir)
    for rnd in range(o.rounds):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for ph, ph_args in phases(o):
            for s in order:
                url, extra, pid = sides[s]
                rec = os.path.join(rdir, f"{rnd}-{ph}-{s.replace(' ', '_')}.jsonl")
                args = ["--url", url, *extra, *SHAPE, *ph_args,
                        "--duration", f"{o.seconds}s", "--timeout", "10s", "--warmup", str(WARMUP_REQUESTS),
                        "--seed", str(rnd + 1), "--records", rec]
                if ph == "sat":
                    args += ["--threads", "1"]
                cpu0 = cpu_seconds(pid) if pid else 0.0
                summary = loadgen(args, f"overhead {ph} {s}", o.seconds + 60)
                r = results[(s, ph)]
                if pid:
                    # Includes the warm-up requests: counted in the division below.
                    r["cpu"] += cpu_seconds(pid) - cpu0
                    r["cpu_requests"] = r.get("cpu_requests", 0) + summary["requests"]["ok"] + WARMUP_REQUESTS
                r["records"] += [x for x in read_records(rec) if x["status"] == 200 and not x["error"]]
                r["ok"] += summary["requests"]["ok"]
                r["failed"] += summary["requests"]["failed"]
                r["elapsed"] += summary["elapsed_s"]
                log(f"round {rnd + 1}/{o.rounds} {ph:17s} {s:20s} {summary['requests_per_s']:9.1f} req/s  "
                    f"p50 {summary['latency_ms'] and summary['latency_ms']['p50']} ms")
    return results


def latency(results, side, phase, key="latency_ms"):
    """(p50, p99) of `key` over a side's pooled records of a phase."""
    v = sorted(x[key] for x in results[(side, phase)]["records"] if x.get(key) is not None)
    return pct(v, 50), pct(v, 99)


def throughput(results, side):
    """Requests/s of a side in the saturation phase."""
    sat = results[(side, "sat")]
    return sat["ok"] / max(sat["elapsed"], 1e-9)


def cpu_per_request(results, side):
    """The proxy process's CPU time per request in the saturation phase, in µs (None for
    the direct side): what the proxy costs, whatever else the machine runs."""
    sat = results[(side, "sat")]
    n = sat.get("cpu_requests", 0)
    return 1e6 * sat["cpu"] / n if n else None


def main_table(o, results, names):
    """One row per side: latency, added latency, TTFT, saturation throughput and ratios."""
    base = latency(results, "direct", "c1")
    base_rps = throughput(results, "direct")
    env_rps = throughput(results, "envoy")
    rows = []
    for s in names:
        p50, p99 = latency(results, s, "c1")
        t50, t99 = latency(results, s, "c1-stream", "ttft_ms")
        n50, _ = latency(results, s, "c1-stream-newconn", "ttft_ms")
        rps = throughput(results, s)
        cpu = cpu_per_request(results, s)
        env_cpu = cpu_per_request(results, "envoy")
        failed = sum(results[(s, ph)]["failed"] for ph, _ in phases(o))
        rows.append([
            s, fmt(p50, 3), fmt(p99, 3),
            fmt(p50 - base[0], 3) if p50 is not None else "–",
            fmt(p99 - base[1], 3) if p99 is not None else "–",
            fmt(t50, 3), fmt(t99, 3), fmt(n50, 3),
            f"{rps:.0f}", f"{rps / base_rps:.2f}" if base_rps else "–", f"{rps / env_rps:.2f}" if env_rps else "–",
            fmt(cpu, 1) if cpu is not None else "–",
            fmt(cpu - env_cpu, 1) if cpu is not None and env_cpu is not None and s.startswith("envoy+") else "–",
            failed,
        ])
    headers = ["side", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms", "TTFT p50 ms (keep-alive)",
               "TTFT p99 ms", "TTFT p50 ms (new conn)", f"req/s at c={o.saturation_concurrency}",
               "÷ direct", "÷ envoy", "proxy CPU µs/request", "added to Envoy's", "failed"]
    return table(headers, rows)


def ratio_table(results, names):
    """Concurrency-1 non-streamed latency of the filter vs Envoy alone, and of each
    sglang-router side vs the filter."""
    env = latency(results, "envoy", "c1")
    filt = latency(results, "envoy+filter", "c1")
    rows = []
    if env[0] and filt[0]:
        rows.append(["envoy+filter ÷ envoy", f"{filt[0] / env[0]:.2f}×", f"{filt[1] / env[1]:.2f}×"])
        rows.append(["envoy+filter − envoy", f"{filt[0] - env[0]:.3f} ms", f"{filt[1] - env[1]:.3f} ms"])
    for s in names:
        sp = latency(results, s, "c1")
        if s.startswith("sglang") and sp[0] and filt[0]:
            rows.append([f"{s} ÷ envoy+filter", f"{sp[0] / filt[0]:.2f}×", f"{sp[1] / filt[1]:.2f}×"])
    return table(["concurrency 1, non-streamed", "p50", "p99"], rows) if rows else ""


def run(o, procs):
    """The overhead benchmark; its Result."""
    sims = start_sims(procs, o.servers, SIM_ARGS)
    sides = start_sides(o, procs, sims)
    names = list(sides)
    results = measure(o, procs, sides)
    body = main_table(o, results, names)
    ratios = ratio_table(results, names)
    if ratios:
        body += "\n\n" + ratios
    notes = [
        f"Setup: {o.servers} × `vllm-sim {' '.join(SIM_ARGS)}`; Envoy 1.40 `--concurrency {o.workers}`; "
        f"{o.rounds} round(s) × {len(phases(o))} phases × {len(names)} sides, {o.seconds:g} s each, sides "
        f"alternating (rotated order each round), {WARMUP_REQUESTS} warm-up requests before each measurement, "
        "percentiles over the pooled requests of all rounds. Requests: `/v1/completions`, 80-token prompts "
        "(8 groups × 8), 16 output tokens; `loadgen` keep-alive with TCP_NODELAY, one client thread. "
        "Added = side − direct. Proxy CPU µs/request: the proxy process's user + system time "
        "(/proc/PID/stat, all its threads) over the saturation phase's requests, warm-up included; "
        "unlike latency and throughput it hardly depends on what else the machine runs. "
        "Added to Envoy's: a filter side's CPU per request minus plain Envoy's.",
    ]
    if o.candidate:
        notes.append(o.candidate.note())
    return Result("Overhead: added latency and saturation throughput", body, notes)
