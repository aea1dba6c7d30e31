#!/usr/bin/env python3
"""What one `/metrics` scrape costs a vllm-sim server, and what R gateway replicas scraping
every server each `refreshInterval` add up to.

Starts one `target/release/vllm-sim` (h100-llama-8b profile, idle, pinned to CPU 0 when
taskset exists) on an ephemeral loopback port, scrapes it back to back from one connection
with `target/release/vllm-sim-bench --mode metrics` (pinned to CPU 1) for `--seconds`, and
reads the server's CPU time (user + system, /proc) before and after: CPU per scrape =
CPU time / scrapes. Then prints, for R = 1, 2, 4, 8, 16 replicas at the default 50 ms
interval and at 50 ms × R, the scrapes per second each server answers and the share of one
core they take. Stops the server it started (by PID).

Run: cargo build --release -p vllm-sim --bins && python3 scripts/lib/bench/scrape_cost.py
"""
import argparse
import os
import shutil
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, free_port  # noqa: E402

SIM = os.path.join(ROOT, "target/release/vllm-sim")
BENCH = os.path.join(ROOT, "target/release/vllm-sim-bench")


def cpu_seconds(pid):
    """User + system CPU time of `pid`, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def pinned(cpu, cmd):
    return (["taskset", "-c", str(cpu)] if shutil.which("taskset") else []) + cmd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args()
    port = free_port()
    server = subprocess.Popen(
        pinned(0, [SIM, "--port", str(port), "--profile", "h100-llama-8b"]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        body = b""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
                    body = r.read()
                    break
            except OSError:
                time.sleep(0.05)
        if not body:
            raise SystemExit("scrape_cost: vllm-sim did not answer /metrics within 30 s")
        before = cpu_seconds(server.pid)
        out = subprocess.run(
            pinned(1, [BENCH, "--url", f"127.0.0.1:{port}", "--mode", "metrics",
                       "--concurrency", "1", "--requests", "10000000",
                       "--duration", f"{a.seconds}s"]),
            capture_output=True, text=True, check=True,
        ).stdout
        cpu = cpu_seconds(server.pid) - before
    finally:
        server.terminate()
        server.wait(timeout=10)
    stats = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
    scrapes = int(stats["requests"])
    per_scrape_us = cpu / max(scrapes, 1) * 1e6
    print(f"/metrics body: {len(body)} bytes; {scrapes} scrapes in {stats['seconds']} s from one "
          f"connection ({stats['requests/s']}/s, latency p50 {stats['p50']} ms); server CPU "
          f"{cpu:.2f} s: **{per_scrape_us:.0f} µs of CPU per scrape**")
    print()
    print("| replicas | interval | scrapes/s per server | share of one server core |")
    print("|---|---|---|---|")
    for r in (1, 2, 4, 8, 16):
        for interval_ms in sorted({50, 50 * r}):
            rate = r * 1000 / interval_ms
            print(f"| {r} | {interval_ms} ms | {rate:.0f} | {rate * per_scrape_us / 1e4:.2f} % |")


if __name__ == "__main__":
    main()
