"""scripts/bench footprint: what the filter adds to Envoy's start and memory, and the size
of the module.

Sides, each a fresh Envoy 1.40 (`--concurrency --workers`, default 2) started --rounds times
in front of 2 `vllm-sim --profile zero` servers: plain Envoy (no filter) and Envoy with this
build of the filter (default configuration). Per start: the time from `exec` to the admin
endpoint answering `/ready` LIVE (the filter's VMs are created and configured before the
listener serves: V8 compiles the module, each worker's VM is started and configured), and
the process's resident memory then; then --requests requests (closed loop of 8, 80-token
prompts) and the resident memory after them.
"""
import argparse
import os
import statistics
import time

from common import Result, loadgen, log, start_envoy, start_sims, table, WASM
from overhead import SHAPE, SIM_ARGS


def options(argv):
    p = argparse.ArgumentParser(prog="scripts/bench footprint")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--requests", type=int, default=20000, help="requests after the start [20000]")
    return p.parse_args(argv)


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def run(o, procs):
    sims = start_sims(procs, 2, SIM_ARGS)
    rows = []
    for kind, label in [("nofilter", "envoy"), ("filter", "envoy+filter")]:
        starts, rss_start, rss_after = [], [], []
        for rnd in range(o.rounds):
            t0 = time.monotonic()
            e = start_envoy(procs, kind, sims, o.workers, f"footprint-{kind}-{rnd}")
            starts.append(1e3 * (time.monotonic() - t0))
            rss_start.append(rss_mib(e.proc.pid))
            routing = ["--destinations", ",".join(sims), "--destination-header", e.header] if kind == "nofilter" else []
            s = loadgen(["--url", e.url, *routing, *SHAPE, "--no-stream", "--concurrency", "8",
                         "--timeout", "10s", "--requests", str(o.requests)], f"footprint {label}", 300)
            if s["requests"]["failed"]:
                raise SystemExit(f"bench: footprint {label}: {s['requests']['failed']} requests failed")
            rss_after.append(rss_mib(e.proc.pid))
            procs.stop(e.proc)
            log(f"round {rnd + 1}/{o.rounds} {label:14s} ready after {starts[-1]:6.0f} ms, "
                f"RSS {rss_start[-1]:.1f} -> {rss_after[-1]:.1f} MiB")
        rows.append([label, f"{statistics.median(starts):.0f}", f"{min(starts):.0f}–{max(starts):.0f}",
                     f"{statistics.median(rss_start):.1f}", f"{statistics.median(rss_after):.1f}"])
    size = os.path.getsize(WASM)
    body = table(["side", "start to ready ms (median)", "range", "RSS at ready MiB (median)",
                  f"RSS after {o.requests:,} requests MiB (median)"], rows)
    body += f"\n\nThe module: `{os.path.relpath(WASM)}`, {size:,} bytes."
    notes = [
        f"Setup: Envoy 1.40 `--concurrency {o.workers}`, started {o.rounds} times per side (plain first); "
        "start to ready: from starting the process to `/ready` answering LIVE, polled every 50 ms (so ±50 ms); "
        f"RSS from /proc/PID/status; then {o.requests:,} requests (`/v1/completions`, 80-token prompts, closed "
        "loop of 8) and RSS again. The filter's configuration: `{}` (the default profile, scraping on).",
    ]
    return Result("Footprint: Envoy's start and memory with the filter", body, notes)
