#!/usr/bin/env python3
"""Flow-control benchmarks through a real Envoy (bounded; every process it starts is
stopped by PID before it exits).

  parked-memory  memory per parked stream: N requests held by flow control in one Envoy,
                 against N idle connections, from Envoy's allocator stats (admin /memory)
  overhead       latency the filter adds on the unsaturated path, flow control on vs off
                 (alternating runs), in front of a zero-latency vllm-sim

Prints a markdown table. Usage: flow_control.py parked-memory|overhead [--n N] [--workers W]
"""
import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from common import ENVOY, RENDER, SIM, WASM

PROCS = []


def start_sim(args):
    p = subprocess.Popen([SIM, "--host", "127.0.0.1", "--port", "0"] + args,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    PROCS.append(p)
    line = p.stdout.readline()
    m = re.search(r"listening on http://(\S+)", line)
    if not m:
        sys.exit("vllm-sim did not start")
    return m.group(1)


def start_envoy(config, endpoint, workers, tmp):
    cfg = os.path.join(tmp, f"filter-{len(PROCS)}.json")
    with open(cfg, "w") as f:
        json.dump(config, f)
    boot = os.path.join(tmp, f"bootstrap-{len(PROCS)}.yaml")
    with open(boot, "w") as f:
        subprocess.run([sys.executable, RENDER, "--wasm", WASM, "--config", cfg, "--endpoints", endpoint],
                       stdout=f, check=True)
    admin_path = os.path.join(tmp, f"admin-{len(PROCS)}")
    p = subprocess.Popen([ENVOY, "-c", boot, "--concurrency", str(workers), "--disable-hot-restart",
                          "-l", "error", "--admin-address-path", admin_path],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    PROCS.append(p)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            admin = open(admin_path).read().strip()
            if admin and get(admin, "/ready").strip() == "LIVE":
                listeners = json.loads(get(admin, "/listeners?format=json"))
                port = listeners["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
                return p, admin, f"127.0.0.1:{port}"
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    sys.exit("envoy did not start")


def get(addr, path):
    with urllib.request.urlopen(f"http://{addr}{path}", timeout=10) as r:
        return r.read().decode()


def allocated(admin):
    return int(json.loads(get(admin, "/memory"))["allocated"])


def queued(admin):
    text = get(admin, "/stats/prometheus")
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith("inference_extension_flow_control_queue_size{"))


def body(max_tokens=1, extra=None):
    d = {"model": "sim-model", "prompt": "hello", "max_tokens": max_tokens, "ignore_eos": True}
    d.update(extra or {})
    b = json.dumps(d).encode()
    return b


def request_bytes(addr, b, headers=""):
    return (f"POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(b)}\r\n{headers}\r\n").encode() + b


FC_CONFIG = {
    "featureGates": ["flowControl"],
    "plugins": [{"type": "concurrency-detector", "parameters": {"maxConcurrency": 1}}],
    "saturationDetector": {"pluginRef": "concurrency-detector"},
}


async def open_many(addr, n, payload=None, batch=500):
    host, port = addr.split(":")
    conns = []
    for i in range(0, n, batch):
        chunk = await asyncio.gather(*[asyncio.open_connection(host, int(port)) for _ in range(min(batch, n - i))])
        for r, w in chunk:
            if payload:
                w.write(payload)
        conns.extend(chunk)
    return conns


async def parked_memory(n, workers):
    with tempfile.TemporaryDirectory() as tmp:
        sim = start_sim(["--profile", "zero", "--inter-token-latency", "1s", "--max-num-seqs", "256"])
        cfg = dict(FC_CONFIG, flowControl={"maxRequests": str(n + 10)})
        _, admin, addr = start_envoy(cfg, sim, workers, tmp)
        host, port = addr.split(":")
        # One long request holds the only slot.
        fr, fw = await asyncio.open_connection(host, int(port))
        fw.write(request_bytes(addr, body(120)))
        await asyncio.sleep(0.5)
        base = allocated(admin)
        idle = await open_many(addr, n)
        await asyncio.sleep(1.0)
        with_conns = allocated(admin)
        for _, w in idle:
            w.close()
        await asyncio.sleep(1.0)
        t0 = time.time()
        parked = await open_many(addr, n, request_bytes(addr, body(1)))
        deadline = time.time() + 120
        while queued(admin) < n and time.time() < deadline:
            await asyncio.sleep(0.2)
        park_s = time.time() - t0
        q = queued(admin)
        with_parked = allocated(admin)
        for _, w in parked:
            w.close()
        deadline = time.time() + 60
        while queued(admin) > 0 and time.time() < deadline:
            await asyncio.sleep(0.2)
        left = queued(admin)
        fw.close()
        per_conn = (with_conns - base) / n
        per_parked = (with_parked - base) / n
        print(f"| parked requests | {int(q)} of {n} (in {park_s:.1f} s, {workers} workers) |")
        print(f"| memory per idle connection | {per_conn / 1024:.1f} KiB |")
        print(f"| memory per parked request, connection included | {per_parked / 1024:.1f} KiB (target < 32 KiB) |")
        print(f"| memory per parked stream alone | {(per_parked - per_conn) / 1024:.1f} KiB |")
        print(f"| queued after every client left | {int(left)} |")


async def timed_requests(addr, n, b):
    host, port = addr.split(":")
    r, w = await asyncio.open_connection(host, int(port))
    lat = []
    req = request_bytes(addr, b)
    for _ in range(n):
        t = time.perf_counter()
        w.write(req)
        head = await r.readuntil(b"\r\n\r\n")
        m = re.search(rb"content-length: (\d+)", head, re.I)
        await r.readexactly(int(m.group(1)))
        lat.append((time.perf_counter() - t) * 1e6)
    w.close()
    return lat


async def overhead(n, workers, rounds=5):
    with tempfile.TemporaryDirectory() as tmp:
        sim = start_sim(["--profile", "zero", "--max-num-seqs", "256"])
        cfg_on = dict(FC_CONFIG)
        cfg_on["plugins"] = [{"type": "concurrency-detector", "parameters": {"maxConcurrency": 1000}}]
        _, _, on = start_envoy(cfg_on, sim, workers, tmp)
        _, _, off = start_envoy({}, sim, workers, tmp)
        b = body(1)
        await timed_requests(on, 200, b)
        await timed_requests(off, 200, b)
        lat = {"on": [], "off": []}
        for _ in range(rounds):
            lat["on"] += await timed_requests(on, n, b)
            lat["off"] += await timed_requests(off, n, b)
        p = lambda xs, q: statistics.quantiles(xs, n=100)[q - 1]
        for k in ("off", "on"):
            print(f"| flow control {k} | {p(lat[k], 50):.0f} µs | {p(lat[k], 99):.0f} µs |")
        print(f"| added by flow control | {p(lat['on'], 50) - p(lat['off'], 50):.0f} µs | "
              f"{p(lat['on'], 99) - p(lat['off'], 99):.0f} µs |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("what", choices=["parked-memory", "overhead"])
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    for path in (WASM, SIM, ENVOY):
        if not os.path.exists(path):
            sys.exit(f"{path} missing: run scripts/bench (it builds what it needs)")
    try:
        if a.what == "parked-memory":
            print("| flow control: parked streams | value |\n|---|---|")
            asyncio.run(parked_memory(a.n or 10000, a.workers))
        else:
            print("| unsaturated path, sequential requests | p50 | p99 |\n|---|---|---|")
            asyncio.run(overhead(a.n or 2000, a.workers))
    finally:
        for p in PROCS:
            p.terminate()
        for p in PROCS:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
