"""scripts/bench overload: flow control at a multiple of the pool's capacity. The capacity
is measured first (closed loop straight to a fresh pool), then that multiple is offered,
Poisson, through Envoy + the filter, with three priority classes and unequal tenants;
flow control on (the `flowControl` gate) vs off (the same configuration without it).
Every side of every round gets fresh servers and a fresh Envoy; the sides alternate.

Also the pieces scripts/bench flow-control reuses: calibrate() and run_side().
"""
import json
import os
import re
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import List

from common import (LOADGEN, Result, finish, fmt, http_get, loadgen, log, pct, read_records, start_envoy, start_sims,
                    table)

OBJECTIVES = [("premium", 100), ("standard", 0), ("best-effort", -10)]
DISPATCH_HIST = "inference_extension_flow_control_dispatch_cycle_duration_seconds"
PROMPTS_PER_GROUP = 16


@dataclass
class OverloadOptions:
    servers: int = 2
    workers: int = 2
    seconds: float = 30  # of arrivals per side
    rounds: int = 2
    max_num_seqs: int = 8
    groups: int = 16
    system_prompt_len: int = 256
    question_len: int = 64
    output_len: int = 32
    factor: float = 2.0  # offered load ÷ measured capacity
    qps_overload: float = 0.0  # offered QPS instead of factor × capacity (0: use factor)
    tenant_weights: List[int] = field(default_factory=lambda: [10, 1, 1])
    ttl: float = 15
    band_limits: List[int] = field(default_factory=lambda: [500, 60, 30])
    timeout: float = 45  # per request, client side
    calibrate: float = 10  # seconds of the capacity measurement
    warm: float = 5  # seconds skipped at the start of the window
    sample_period: float = 0.5
    cooldown: float = 0  # seconds between sides


# ---------------------------------------------------------------------------------------
# Configuration and workload.

def filter_config(o, flow):
    """The filter's configuration; flow=False drops only the `flowControl` feature gate
    (the filter then applies the reference's legacy admission)."""
    bands = [{"priority": p, "maxRequests": str(limit), "fairnessPolicyRef": "round-robin-fairness-policy"}
             for (_, p), limit in zip(OBJECTIVES, o.band_limits)]
    cfg = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "round-robin-fairness-policy"},
            {"type": "concurrency-detector",
             "parameters": {"maxConcurrency": o.max_num_seqs, "concurrencyMode": "requests"}},
        ],
        "saturationDetector": {"pluginRef": "concurrency-detector"},
        "flowControl": {"maxRequests": "1k", "defaultRequestTTL": f"{o.ttl:g}s", "priorityBands": bands},
        "pool": {"objectives": [{"name": n, "priority": p} for n, p in OBJECTIVES]},
    }
    if flow:
        cfg["featureGates"] = ["flowControl"]
    return cfg


def write_config(procs, cfg, tag):
    """cfg as JSON in a fresh directory under the run's work directory; its path."""
    d = tempfile.mkdtemp(prefix=f"{tag}-cfg-", dir=procs.workdir)
    path = os.path.join(d, "filter.json")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    return path


def shape(o):
    """loadgen's workload arguments."""
    return ["--groups", str(o.groups), "--prompts-per-group", str(PROMPTS_PER_GROUP),
            "--system-prompt-len", str(o.system_prompt_len), "--question-len", str(o.question_len),
            "--output-len", str(o.output_len), "--stream"]


def sim_args(o):
    return ["--profile", "h100-llama-8b", "--max-num-seqs", str(o.max_num_seqs)]


# ---------------------------------------------------------------------------------------
# Prometheus text: sums and histograms.

def prom_sum(text, name, label_filter=None):
    """The sum of a metric over its label sets; None if absent."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if label_filter and label_filter not in line:
                continue
            try:
                total += float(line.rsplit(" ", 1)[1])
                seen = True
            except ValueError:
                pass
    return total if seen else None


def hist_buckets(text, name):
    """Cumulative bucket counts {le: count} summed over label sets."""
    b = {}
    for line in text.splitlines():
        if not line.startswith(name + "_bucket{"):
            continue
        m = re.search(r'le="([^"]+)"', line)
        if not m:
            continue
        le = float("inf") if m.group(1) in ("+Inf", "Inf") else float(m.group(1))
        b[le] = b.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    return b


def hist_quantile(buckets, q):
    """Linear interpolation inside the bucket holding quantile q (like histogram_quantile)."""
    if not buckets:
        return None
    les = sorted(buckets)
    total = buckets[les[-1]]
    if total <= 0:
        return None
    rank, prev_le, prev_c = q * total, 0.0, 0.0
    for le in les:
        c = buckets[le]
        if c >= rank:
            if le == float("inf"):
                return prev_le  # beyond the last bound: report the bound (a lower limit)
            return prev_le + (le - prev_le) * ((rank - prev_c) / max(c - prev_c, 1e-12))
        prev_le, prev_c = le, c
    return les[-2] if len(les) > 1 else None


def bucket_text(h):
    """"le: count, ..." of cumulative buckets."""
    return ", ".join(f"{'+Inf' if k == float('inf') else f'{k:g}'}: {v:.0f}" for k, v in sorted(h.items()))


def add_buckets(acc, b):
    for k, v in b.items():
        acc[k] = acc.get(k, 0.0) + v


class Sampler:
    """Samples each server's vllm:num_requests_{waiting,running} (and, with an admin
    address, the gateway's flow-control queue size) every `period` s in a thread.
    samples: (t, Σ waiting, Σ running, gateway queued or None, [waiting per server])."""

    def __init__(self, sims, admin, period):
        self.sims, self.admin, self.period = sims, admin, period
        self.samples = []
        self.stop_ev = threading.Event()
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def sample(self):
        per, run = [], 0.0
        for s in self.sims:
            try:
                text = http_get(f"http://{s}/metrics", 1.0)[1]
                per.append(prom_sum(text, "vllm:num_requests_waiting") or 0.0)
                run += prom_sum(text, "vllm:num_requests_running") or 0.0
            except Exception:
                per.append(None)
        q = None
        if self.admin:
            try:
                q = prom_sum(http_get(f"http://{self.admin}/stats/prometheus", 2.0)[1],
                             "inference_extension_flow_control_queue_size") or 0.0
            except Exception:
                q = None
        return sum(x for x in per if x is not None), run, q, per

    def loop(self):
        while not self.stop_ev.is_set():
            t = time.monotonic() - self.t0
            self.samples.append((t, *self.sample()))
            self.stop_ev.wait(self.period)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        self.thread.join(timeout=10)


# ---------------------------------------------------------------------------------------
# Running.

def calibrate(o, procs):
    """(completed requests/s, loadgen summary) of a fresh pool driven directly at
    servers × max-num-seqs in flight."""
    sims = start_sims(procs, o.servers, sim_args(o), "cal-sim")
    s = loadgen(["--url", ",".join(sims), *shape(o), "--concurrency", o.servers * o.max_num_seqs,
                 "--duration", f"{o.calibrate:g}s", "--timeout", "60s", "--seed", "7"],
                "overload calibration", o.calibrate + 90)
    procs.stop_named("cal-sim")
    return s["requests"]["ok"] / max(s["elapsed_s"], 1e-9), s


def start_tenants(o, url, side, qps, rnd, rdir):
    """One loadgen per tenant, at its share of qps; [(tenant index, Popen, records path,
    start offset s)]."""
    runs = []
    total_w = sum(o.tenant_weights)
    t_start = time.monotonic()
    for i, w in enumerate(o.tenant_weights):
        rec = os.path.join(rdir, f"ov{rnd}-{side}-tenant{i}.jsonl")
        cmd = [LOADGEN, "--label", f"overload {side} tenant-{i}", "--url", url, *shape(o),
               "--qps", f"{qps * w / total_w:.3f}", "--duration", f"{o.seconds:g}s", "--timeout", f"{o.timeout:g}s",
               "--seed", str(100 * (rnd + 1) + i), "--priorities", ",".join(n for n, _ in OBJECTIVES),
               "--header", f"x-gateway-inference-fairness-id:tenant-{i}", "--records", rec]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        runs.append((i, p, rec, time.monotonic() - t_start))
    return runs


def wait_tenants(o, runs, side):
    """Waits for the tenants' loadgens (bounded); exits if one fails."""
    for i, p, _, _ in runs:
        finish(p, f"loadgen tenant-{i} ({side})", o.seconds + o.timeout + 60)


def run_side(o, procs, flow, qps, rnd, rdir):
    """One side of one round: fresh servers and a fresh Envoy, the tenants' loadgens at
    once, the sampler; (records, samples, dispatch histogram). Stops its servers and Envoy."""
    side = "on" if flow else "off"
    tag = f"ov{rnd}-{side}"
    sims = start_sims(procs, o.servers, sim_args(o), f"{tag}-sim")
    cfg = write_config(procs, filter_config(o, flow), tag)
    envoy = start_envoy(procs, "filter", sims, o.workers, f"{tag}-envoy", config=cfg)
    with Sampler(sims, envoy.admin if flow else None, o.sample_period) as sampler:
        runs = start_tenants(o, envoy.url, side, qps, rnd, rdir)
        wait_tenants(o, runs, side)
        elapsed = time.monotonic() - sampler.t0
    hist = {}
    if flow:
        # Envoy flushes stats every second: wait for the last cycles to be exported.
        time.sleep(1.5)
        hist = hist_buckets(http_get(f"http://{envoy.admin}/stats/prometheus", 5.0)[1], DISPATCH_HIST)
    procs.stop(envoy.proc)
    procs.stop_named(f"{tag}-sim")
    records = []
    for i, _, rec, offset in runs:
        for r in read_records(rec):
            r["tenant"] = f"tenant-{i}"
            r["t0"] = offset  # the loadgen's start, from the side's start
            records.append(r)
    log(f"round {rnd + 1} flow control {side}: {len(records)} requests, "
        f"{sum(1 for r in records if r['status'] == 200)} ok, {elapsed:.0f} s")
    return records, sampler.samples, hist


def measure(o, procs, qps):
    """Every round, both sides (on, off / off, on); {flow: {"records", "samples", "hist"}}."""
    rdir = tempfile.mkdtemp(prefix="records-", dir=procs.workdir)
    data = {flow: {"records": [], "samples": [], "hist": {}} for flow in (True, False)}
    for rnd in range(o.rounds):
        for flow in ([True, False] if rnd % 2 == 0 else [False, True]):
            recs, samples, hist = run_side(o, procs, flow, qps, rnd, rdir)
            data[flow]["records"] += recs
            data[flow]["samples"] += [s for s in samples if s[0] <= o.seconds]
            add_buckets(data[flow]["hist"], hist)
            if o.cooldown:
                time.sleep(o.cooldown)
    return data


# ---------------------------------------------------------------------------------------
# Tables.

def seconds(ms):
    """A latency in ms as seconds with 2 decimals."""
    return fmt(ms and ms / 1000, 2)


def class_row(o, flow, cls, recs, tenants):
    """TTFT, per-tenant TTFT and completion shares, and failures of one class."""
    rc = [r for r in recs if r.get("objective") == cls]
    ok = [r for r in rc if r["status"] == 200 and not r["error"]]
    t = sorted(r["ttft_ms"] for r in ok if r.get("ttft_ms") is not None)
    n429 = sum(1 for r in rc if r["status"] == 429)
    n503 = sum(1 for r in rc if r["status"] == 503)

    def per_tenant_count(status):
        return "/".join(str(sum(1 for r in rc if r["status"] == status and r["tenant"] == tn)) for tn in tenants)
    # Completions while backlogged: finished within [warm, end of the arrivals].
    done = [r for r in ok if o.warm <= r["t0"] + r["sent_ms"] / 1000 + r["latency_ms"] / 1000 <= o.seconds]
    shares = [f"{100 * sum(1 for r in done if r['tenant'] == tn) / len(done):.0f}" if done else "–"
              for tn in tenants]
    per_tenant = []
    for tn in tenants:
        tt = sorted(r["ttft_ms"] for r in ok if r["tenant"] == tn and r.get("ttft_ms") is not None)
        per_tenant.append(seconds(pct(tt, 50)))
    return ["on" if flow else "off", cls, f"{len(ok)}/{len(rc)}", seconds(pct(t, 50)), seconds(pct(t, 90)),
            seconds(pct(t, 99)), "/".join(per_tenant), "/".join(shares),
            f"{n429} ({per_tenant_count(429)})", f"{n503} ({per_tenant_count(503)})", len(rc) - len(ok) - n429 - n503]


def class_table(o, data):
    tenants = [f"tenant-{i}" for i in range(len(o.tenant_weights))]
    rows = [class_row(o, flow, cls, data[flow]["records"], tenants)
            for flow in (True, False) for cls, _ in OBJECTIVES]
    headers = ["flow control", "class (priority)", "ok/sent", "TTFT p50 s", "TTFT p90 s", "TTFT p99 s",
               "TTFT p50 s per tenant",
               "completions per tenant % (" + "/".join(str(w) for w in o.tenant_weights) + " offered)",
               "429 (per tenant)", "503 (per tenant)", "other errors"]
    return table(headers, rows)


def queue_table(o, data):
    """The servers' queue (Σ waiting), Σ running and the gateway's queue, after the warm-up."""
    rows = []
    for flow in (True, False):
        sm = [s for s in data[flow]["samples"] if s[0] >= o.warm]
        w = sorted(s[1] for s in sm)
        run = [s[2] for s in sm]
        g = sorted(s[3] for s in sm if s[3] is not None)
        rows.append(["on" if flow else "off", len(sm), fmt(statistics.mean(w), 1) if w else "–",
                     fmt(pct(w, 50), 0), fmt(pct(w, 99), 0), fmt(w[-1] if w else None, 0),
                     fmt(statistics.mean(run), 1) if run else "–",
                     (fmt(statistics.mean(g), 0) + " / " + fmt(g[-1], 0)) if g else "–"])
    return table(["flow control", "samples", "server queue (Σ waiting) mean", "p50", "p99", "max",
                  "Σ running mean", "gateway queue mean / max"], rows)


def timeline_table(o, data):
    """Server and gateway queues in 5-s buckets of the arrival window."""
    rows = []
    for t0 in range(0, int(o.seconds), 5):
        row = [f"{t0}–{t0 + 5}"]
        for flow in (True, False):
            sm = [s for s in data[flow]["samples"] if t0 <= s[0] < t0 + 5]
            row.append(fmt(statistics.mean(s[1] for s in sm), 1) if sm else "–")
            if flow:
                g = [s[3] for s in sm if s[3] is not None]
                row.append(fmt(statistics.mean(g), 0) if g else "–")
        rows.append(row)
    return table(["s into the run", "server Σ waiting (on)", "gateway queued (on)", "server Σ waiting (off)"], rows)


def run(o, procs):
    """The overload benchmark; its Result."""
    cap, _ = calibrate(o, procs)
    qps = o.qps_overload or o.factor * cap
    log(f"pool capacity ≈ {cap:.1f} req/s (closed loop at {o.servers * o.max_num_seqs}); offered {qps:.1f} QPS")
    data = measure(o, procs, qps)
    body = "\n\n".join([class_table(o, data), queue_table(o, data), timeline_table(o, data)])
    h = data[True]["hist"]
    n = max(h.values()) if h else 0
    weights = "/".join(str(w) for w in o.tenant_weights)
    limits = "/".join(str(x) for x in o.band_limits)
    notes = [
        f"Setup: per side and round, fresh {o.servers} × `vllm-sim {' '.join(sim_args(o))}` and a fresh Envoy "
        f"1.40 `--concurrency {o.workers}` with the filter. Capacity measured first on its own fresh pool "
        f"(closed loop of {o.servers * o.max_num_seqs} straight to the servers, {o.calibrate:g} s): "
        f"{cap:.1f} req/s; offered {qps:.1f} QPS ({qps / cap:.1f}×), Poisson, for {o.seconds:g} s per side, "
        f"{o.rounds} round(s), sides alternating (on, off / off, on). Tenants tenant-0..{len(o.tenant_weights) - 1} "
        f"send {weights} of the load, each request's objective uniform over premium (100) / standard (0) / "
        f"best-effort (-10). Workload: {o.groups} groups × {PROMPTS_PER_GROUP} prompts, system "
        f"{o.system_prompt_len}, question {o.question_len}, output {o.output_len} tokens, streamed "
        f"`/v1/completions`; client timeout {o.timeout:g} s.",
        f"Flow control on: `featureGates: [flowControl]`, `concurrency-detector` maxConcurrency "
        f"{o.max_num_seqs} per server, `round-robin-fairness-policy` in every band, `defaultRequestTTL` "
        f"{o.ttl:g} s, band `maxRequests` {limits} (premium/standard/best-effort), global 1k. Off: the same "
        "configuration without the feature gate.",
        f"Completions per tenant: between {o.warm:g} s and the end of the arrivals ({o.seconds:g} s). Queues "
        f"sampled every {o.sample_period:g} s from {o.warm:g} s to the end of the arrivals.",
        f"Dispatch cycle (`{DISPATCH_HIST}`, µs, the flow-control-on sides' Envoys, {n:.0f} cycles): "
        f"p50 ≈ {fmt(hist_quantile(h, 0.5), 1)} µs, p99 ≈ {fmt(hist_quantile(h, 0.99), 1)} µs (interpolated "
        "inside the buckets). Cumulative bucket counts (le µs: count): " + bucket_text(h) + ".",
    ]
    return Result("Overload: flow control, priorities and unequal tenants", body, notes)
