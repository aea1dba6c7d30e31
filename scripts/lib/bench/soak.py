"""scripts/bench soak: a bounded long run through a real Envoy with flow control on.

Steady open-loop load (streamed, shared-prefix prompts) over tenants that keep changing
(`loadgen --tenant-churn`: old fairness ids go idle, new ones appear, so flows are created
and evicted all run long), three objectives, a share of clients that hang up after the
first token (`--cancel`), a pool a little too small (so some requests wait, some are shed
with 429 and some outlive their TTL with 503), and one server killed and restarted on the
same port half way. Every few seconds it samples Envoy's RSS and the gateway's queue.

What it reports: every request's one outcome (sent = 200 + 429 + 503 + cancelled + the
rest, by class), Envoy's own count of downstream requests against what the client sent
(nothing lost, nothing answered twice), the RSS at start and end and its slope over the
second half (a linear fit, KiB per minute), and the queue once the load stopped (0: no
request stranded). `soak()` is also the short slice `scripts/lib/test_soak.py` runs.
"""
import argparse
import json
import os
import re
import tempfile
import time

from common import (SIM, Result, free_port, http_get, log, loadgen, start_envoy,
                    start_sims, table, wait_for, LOADGEN)

OBJECTIVES = [("premium", 10), ("standard", 0), ("batch", -10)]


def options(argv):
    p = argparse.ArgumentParser(prog="scripts/bench soak")
    p.add_argument("--seconds", type=float, default=600.0, help="load duration [600]")
    p.add_argument("--qps", type=float, default=24.0,
                   help="offered load [24: about the pool's capacity at the defaults]")
    p.add_argument("--servers", type=int, default=3)
    p.add_argument("--max-num-seqs", type=int, default=4, help="per server, and the "
                   "concurrency detector's maxConcurrency [4]")
    p.add_argument("--tenants", type=int, default=20)
    p.add_argument("--tenant-churn", type=int, default=200,
                   help="requests between tenant-id shifts [200]")
    p.add_argument("--cancel", type=float, default=0.05)
    p.add_argument("--ttl", type=float, default=5.0, help="flow control request TTL, s [5]")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--sample-every", type=float, default=5.0)
    p.add_argument("--idle-series-seconds", type=int, default=None,
                   help="pool.metricsEndpoint.idleSeriesSeconds [the filter's default, 600]")
    return p.parse_args(argv)


def filter_config(o, metrics_port):
    return {
        "featureGates": ["flowControl"],
        "plugins": [{"type": "round-robin-fairness-policy"},
                    {"type": "concurrency-detector",
                     "parameters": {"maxConcurrency": o.max_num_seqs,
                                    "concurrencyMode": "requests"}}],
        "saturationDetector": {"pluginRef": "concurrency-detector"},
        "flowControl": {"maxRequests": "200", "defaultRequestTTL": f"{o.ttl:g}s",
                        "priorityBands": [{"priority": p, "fairnessPolicyRef":
                                           "round-robin-fairness-policy"}
                                          for _, p in OBJECTIVES]},
        "pool": {"name": "soak", "metricsEndpoint": metrics_endpoint(o, metrics_port),
                 "objectives": [{"name": n, "priority": p} for n, p in OBJECTIVES]},
    }


def metrics_endpoint(o, port):
    endpoint = {"port": port}
    if o.idle_series_seconds is not None:
        endpoint["idleSeriesSeconds"] = o.idle_series_seconds
    return endpoint


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        m = re.search(r"VmRSS:\s+(\d+) kB", f.read())
    return int(m.group(1)) if m else 0


def metric_sum(text, name, **labels):
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[-1])
    return total


def envoy_heap_kib(admin):
    """Envoy's own heap in use (admin /memory `allocated`): everything but the Wasm VMs'
    memory, which V8 maps outside it."""
    try:
        return int(json.loads(http_get(f"http://{admin}/memory")[1])["allocated"]) // 1024
    except (OSError, ValueError, KeyError):
        return 0


def envoy_stat(admin, name):
    _, text = http_get(f"http://{admin}/stats?filter=^{re.escape(name)}$")
    m = re.search(r": (\d+)", text)
    return int(m.group(1)) if m else 0


def slope_kib_per_min(samples):
    """Least-squares slope of (seconds, KiB) pairs, per minute."""
    n = len(samples)
    if n < 2:
        return 0.0
    mx = sum(t for t, _ in samples) / n
    my = sum(v for _, v in samples) / n
    den = sum((t - mx) ** 2 for t, _ in samples)
    return 60.0 * sum((t - mx) * (v - my) for t, v in samples) / den if den else 0.0


def soak(o, procs):
    """Runs the soak; a dict of what happened."""
    sim_args = ["--profile", "h100-llama-8b", "--max-num-seqs", str(o.max_num_seqs)]
    sims = start_sims(procs, o.servers - 1, sim_args, "soak-sim")
    restart_port = free_port()
    restart_cmd = [SIM, "--host", "127.0.0.1", "--port", str(restart_port), "--seed", "99"] \
        + sim_args
    restartable = procs.start("soak-sim-restart", restart_cmd)
    addr = f"127.0.0.1:{restart_port}"
    wait_for("vllm-sim", lambda: http_get(f"http://{addr}/health")[0] == 200, restartable, 20)
    metrics_port = free_port()
    d = tempfile.mkdtemp(prefix="soak-", dir=procs.workdir)
    config = os.path.join(d, "filter.json")
    with open(config, "w") as f:
        json.dump(filter_config(o, metrics_port), f)
    envoy = start_envoy(procs, "filter", sims + [addr], o.workers, "soak-envoy", config=config)
    records = os.path.join(d, "records.jsonl")
    summary = os.path.join(d, "summary.json")
    args = [LOADGEN, "--url", envoy.url, "--qps", str(o.qps), "--duration", f"{o.seconds:g}s",
            "--timeout", f"{max(30.0, 3 * o.ttl):g}s", "--groups", "16", "--prompts-per-group",
            "16", "--system-prompt-len", "128", "--question-len", "32", "--output-len", "24",
            "--stream", "--tenants", str(o.tenants), "--tenant-churn", str(o.tenant_churn),
            "--cancel", str(o.cancel), "--priorities", ",".join(n for n, _ in OBJECTIVES),
            "--threads", "1", "--records", records, "--out", summary, "--label", "soak"]
    t0 = time.monotonic()
    load = procs.start("soak-loadgen", args)
    samples, heap, queue_peak, restarted = [], [], 0.0, None
    next_sample = t0
    while load.poll() is None:
        now = time.monotonic()
        if restarted is None and now - t0 >= o.seconds / 2:
            log(f"soak: restarting the server on {addr}")
            procs.stop(restartable)
            time.sleep(2.0)
            restartable = procs.start("soak-sim-restarted", restart_cmd)
            restarted = round(now - t0, 1)
        if now >= next_sample:
            next_sample = now + o.sample_every
            try:
                _, text = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
                queue_peak = max(queue_peak, metric_sum(
                    text, "inference_extension_flow_control_queue_size"))
            except OSError:
                pass
            samples.append((round(now - t0, 1), rss_kib(envoy.proc.pid)))
            heap.append((round(now - t0, 1), envoy_heap_kib(envoy.admin)))
        time.sleep(0.2)
    if load.returncode != 0:
        raise SystemExit(f"bench: loadgen failed; see {load.bench_err}")
    time.sleep(2.0)  # the last completions reach the counters
    with open(summary) as f:
        s = json.load(f)
    _, text = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
    with open(records) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    after_restart = sum(1 for r in recs if r.get("server") == addr and restarted is not None
                        and r["sent_ms"] / 1000 > restarted + 3 and r["status"] == 200)
    half = [x for x in samples if x[0] >= o.seconds / 2]
    return {
        "seconds": o.seconds, "qps": o.qps,
        "sent": s["requests"]["sent"], "status": s["status"],
        "cancelled": s["requests"].get("cancelled", 0),
        "errors": s.get("errors", {}), "timeouts": s.get("timeouts", 0),
        "envoy_downstream_total": envoy_stat(envoy.admin, "http.inference.downstream_rq_total"),
        "envoy_stats": len(http_get(f"http://{envoy.admin}/stats")[1].splitlines()),
        "tenants_seen": len({r.get("tenant") for r in recs}),
        "queue_peak": queue_peak,
        "queue_after": metric_sum(text, "inference_extension_flow_control_queue_size"),
        "running_after": metric_sum(text, "llm_d_epp_request_running"),
        "flow_outcomes": {o_: metric_sum(text, "llm_d_epp_flow_control_requests_total",
                                         outcome=o_)
                          for o_ in ("Dispatched", "RejectedCapacity", "EvictedTTL",
                                     "EvictedContextCancelled", "EvictedNoEndpoints")},
        "restarted_at_s": restarted, "served_by_restarted": after_restart,
        "rss_first_kib": samples[0][1] if samples else 0,
        "rss_last_kib": samples[-1][1] if samples else 0,
        "rss_max_kib": max((v for _, v in samples), default=0),
        "rss_slope_second_half_kib_per_min": round(slope_kib_per_min(half), 1),
        "heap_first_kib": heap[0][1] if heap else 0,
        "heap_last_kib": heap[-1][1] if heap else 0,
        "heap_slope_second_half_kib_per_min": round(slope_kib_per_min(
            [x for x in heap if x[0] >= o.seconds / 2]), 1),
        "samples": samples,
    }


def run(o, procs):
    log(f"soak: {o.seconds:g} s at {o.qps:g} req/s")
    r = soak(o, procs)
    status = r["status"]
    other = r["sent"] - sum(status.values())
    rows = [
        ["requests sent (loadgen)", f"{r['sent']:,}"],
        ["200 / 429 / 503 / other status", " / ".join(str(status.get(k, 0)) for k in
                                                      ("200", "429", "503"))
         + f" / {sum(v for k, v in status.items() if k not in ('200', '429', '503'))}"],
        ["of the 200s, hung up by the client after the first token", f"{r['cancelled']:,}"],
        ["no response head", f"{other}"],
        ["errors (with or without a head), timeouts", f"{r['errors'] or 0}, {r['timeouts']}"],
        ["Envoy's downstream requests (must equal sent)", f"{r['envoy_downstream_total']:,}"],
        ["gateway queue: peak sampled / after the load", f"{r['queue_peak']:g} / "
                                                          f"{r['queue_after']:g}"],
        ["running after the load", f"{r['running_after']:g}"],
        ["server restarted at (s); 200s from it afterwards",
         f"{r['restarted_at_s']}; {r['served_by_restarted']}"],
        ["Envoy RSS first / last / max (MiB)", f"{r['rss_first_kib'] / 1024:.1f} / "
                                               f"{r['rss_last_kib'] / 1024:.1f} / "
                                               f"{r['rss_max_kib'] / 1024:.1f}"],
        ["Envoy heap (admin /memory, without the Wasm VMs) first / last (MiB); slope over "
         "the second half (KiB/min)", f"{r['heap_first_kib'] / 1024:.1f} / "
                                      f"{r['heap_last_kib'] / 1024:.1f}; "
                                      f"{r['heap_slope_second_half_kib_per_min']:g}"],
        ["Envoy stats at the end; distinct fairness ids sent",
         f"{r['envoy_stats']:,}; {r['tenants_seen']:,}"],
        ["Envoy RSS slope over the second half (KiB/min)",
         f"{r['rss_slope_second_half_kib_per_min']:g}"],
        ["flow control outcomes", ", ".join(f"{k} {v:g}" for k, v in r["flow_outcomes"].items())],
    ]
    notes = [f"Setup: {o.servers} vllm-sim (h100-llama-8b, --max-num-seqs "
             f"{o.max_num_seqs}), Envoy --concurrency {o.workers} with flow control "
             f"(concurrency detector {o.max_num_seqs} per endpoint, TTL {o.ttl:g} s, maxRequests "
             f"200, three bands), loadgen open loop {o.qps:g} req/s streamed, {o.tenants} "
             f"tenants shifting every {o.tenant_churn} requests, {o.cancel:.0%} hung up after "
             "the first token; one server killed and restarted on its port half way; "
             f"idle metric series expire after {o.idle_series_seconds or 600} s. RSS "
             f"samples (s, KiB): {r['samples']}"]
    return Result("Soak: a long run through Envoy with flow control", table(["measure", "value"], rows), notes)
