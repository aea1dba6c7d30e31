#!/usr/bin/env python3
"""The cost of one pick inside the wasm VM, measured in a real Envoy (V8).

Default profile (`--profile default`): Envoy 1.40 with the filter (metrics scraping off so
the fake endpoints stay candidates) in front of N endpoints that do not exist (each request
gets a fast 503 from Envoy after the pick); warms the prefix index with conversations
sharing system prompts, then sends requests and reads the filter's own
`inference_extension_scheduler_e2e_duration_seconds` histogram (microseconds; sum/count
before and after the measured batch). That histogram covers the whole decision: header
reads, the snapshot version read, the prefix-log sync, and the in-flight ledger CAS with the
scheduler (hashing, matching, filters, scorers, picker) inside it. The PreRequest
bookkeeping after it (prefix index insert and log publication, a further ~5-10 µs) is not
included, as in the reference.

SLO profile (`--profile slo`): the shipped `envoy/config/slo-routing.json` in front of N
real endpoints (one `vllm-sim --data-parallel-size N` process, latencies scaled down so the
run is short, metrics scraped as in production); streamed requests with SLO headers train
the latency predictor until it is ready, then the measured batch reads the predictor's own
duration (`inference_objective_request_ttft_prediction_duration_seconds`: features,
TTFT and TPOT predictions and headroom for every candidate, the `PrepareData` step), the
whole decision, and the training ticks
(`inference_extension_latency_predictor_train_duration_seconds`). Plugin and prediction
durations are sampled on one decision in 16 and recorded in whole microseconds
(truncated), so means under ~5 µs read up to 1 µs low.

  filter/benches/in_envoy.py [--profile default|slo] [--sizes 8,64,512] [--requests 400]
                             [--wasm PATH] [--envoy PATH]

Build first: cargo build --release -p filter --lib --target wasm32-wasip1
(and for --profile slo: cargo build --release -p vllm-sim)
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
METRIC = "inference_extension_scheduler_e2e_duration_seconds"
PLUGIN = "inference_extension_plugin_duration_seconds"
PREDICTION = "inference_objective_request_ttft_prediction_duration_seconds"
TRAINING = "inference_extension_latency_predictor_train_duration_seconds"
SAMPLES = "inference_extension_latency_predictor_samples"
SIM = os.path.join(ROOT, "target/release/vllm-sim")
SLO_CONFIG = os.path.join(ROOT, "envoy/config/slo-routing.json")
SLO_HEADERS = {"x-llm-d-slo-ttft-ms": "500", "x-llm-d-slo-tpot-ms": "50"}


def post(port, body, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("POST", "/v1/completions", body=body,
              headers={"content-type": "application/json", **(headers or {})})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status


def scrape(admin):
    c = http.client.HTTPConnection(admin, timeout=10)
    c.request("GET", "/stats/prometheus")
    text = c.getresponse().read().decode()
    c.close()
    return text


def histogram(admin, metric=METRIC, labels="", text=None):
    """(sum, count) of a histogram's first series whose labels contain `labels`."""
    text = text if text is not None else scrape(admin)
    s = re.search(r"^%s_sum\{[^}]*%s[^}]*\} (\S+)$" % (metric, re.escape(labels)), text, re.M)
    n = re.search(r"^%s_count\{[^}]*%s[^}]*\} (\S+)$" % (metric, re.escape(labels)), text, re.M)
    return (float(s.group(1)) if s else 0.0, float(n.group(1)) if n else 0.0)


def largest_bucket(text, metric):
    """The smallest bucket bound holding every observation (an upper bound of the maximum)."""
    buckets = [(m.group(1), float(m.group(2))) for m in
               re.finditer(r"^%s_bucket\{[^}]*le=\"([^\"]+)\"[^}]*\} (\S+)$" % metric, text, re.M)]
    total = dict(buckets).get("+Inf")
    bounds = [float(le) for le, n in buckets if le != "+Inf" and total is not None and n >= total]
    return min(bounds, default=None)


def gauge(text, metric, labels=""):
    m = re.search(r"^%s\{[^}]*%s[^}]*\} (\S+)$" % (metric, re.escape(labels)), text, re.M)
    return float(m.group(1)) if m else 0.0


def start_envoy(config, wasm, envoy_bin, tmp):
    """Envoy (one worker) with the filter configured by `config`: (process, admin, port)."""
    cfg = os.path.join(tmp, "filter.json")
    with open(cfg, "w") as f:
        json.dump(config, f)
    boot = os.path.join(tmp, "bootstrap.yaml")
    with open(boot, "w") as f:
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts/lib/render.py"), "--wasm", wasm,
                        "--config", cfg], stdout=f, check=True)
    admin_path = os.path.join(tmp, "admin")
    proc = subprocess.Popen([envoy_bin, "-c", boot, "--concurrency", "1", "--disable-hot-restart",
                             "-l", "error", "--admin-address-path", admin_path,
                             "--log-path", os.path.join(tmp, "envoy.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        if proc.poll() is not None:
            break
        if os.path.exists(admin_path) and open(admin_path).read().strip():
            admin = open(admin_path).read().strip()
            try:
                c = http.client.HTTPConnection(admin, timeout=2)
                c.request("GET", "/listeners?format=json")
                listeners = json.loads(c.getresponse().read())
                port = listeners["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
                return proc, admin, port
            except Exception:
                pass
        time.sleep(0.1)
    proc.terminate()
    proc.wait()
    raise SystemExit("envoy did not start; see " + tmp)


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run(n, requests, wasm, envoy_bin):
    tmp = tempfile.mkdtemp(prefix="epp-bench-")
    endpoints = ["127.1.%d.%d:9" % (i // 250, i % 250 + 1) for i in range(n)]
    config = {"dataLayer": {"sources": []}, "pool": {"endpoints": endpoints}}
    proc, admin, port = start_envoy(config, wasm, envoy_bin, tmp)
    try:
        system = ["You are assistant number %d. Follow the house style guide carefully. " % k * 12
                  for k in range(20)]
        for i in range(300):  # warm the index
            post(port, json.dumps({"model": "m", "prompt": system[i % 20] + "warm-up question %d " % i * 8}))
        time.sleep(1.5)  # a stats flush
        parts = [("Scorer", "queue-scorer"), ("Scorer", "kv-cache-utilization-scorer"),
                 ("Scorer", "prefix-cache-scorer"), ("Picker", "max-score-picker")]
        label = lambda p: 'extension_point="%s",plugin_type="%s"' % p
        before = {p: histogram(admin, PLUGIN, label(p)) for p in parts}
        s0, c0 = histogram(admin)
        for i in range(requests):
            post(port, json.dumps({"model": "m", "prompt": system[i % 20] + "question %d " % i * 8}))
        time.sleep(1.5)
        s1, c1 = histogram(admin)
        if c1 <= c0:
            raise SystemExit("no observations; see " + tmp)
        breakdown = {}
        for p in parts:
            ps, pc = histogram(admin, PLUGIN, label(p))
            bs, bc = before[p]
            if pc > bc:
                breakdown[p[1]] = (ps - bs) / (pc - bc)
        return (s1 - s0) / (c1 - c0), c1 - c0, breakdown
    finally:
        stop(proc)


def free_ports(n):
    """A base port with n free consecutive ports after it (checked by binding them)."""
    for base in range(21000, 60000 - n, 997):
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", base + i))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise SystemExit("no %d free consecutive ports" % n)


def run_slo(n, requests, wasm, envoy_bin):
    """The SLO profile over n live endpoints: a dict of the prediction's and the whole
    decision's mean µs (and how many were timed), and the training ticks (count, mean µs,
    the smallest bucket bound holding them all, µs per sample trained)."""
    tmp = tempfile.mkdtemp(prefix="epp-bench-slo-")
    base = free_ports(n)
    sim = subprocess.Popen([SIM, "--port", str(base), "--data-parallel-size", str(n), "--latency-scale", "0.02",
                            "--max-num-seqs", "64"], stdout=open(os.path.join(tmp, "sim.log"), "w"),
                           stderr=subprocess.STDOUT)
    proc = None
    try:
        for _ in range(200):
            if open(os.path.join(tmp, "sim.log")).read().count("listening on") >= n:
                break
            time.sleep(0.05)
        else:
            raise SystemExit("vllm-sim did not start; see " + tmp)
        with open(SLO_CONFIG) as f:
            config = json.load(f)
        config["pool"] = {"endpoints": ["127.0.0.1:%d" % (base + i) for i in range(n)]}
        proc, admin, port = start_envoy(config, wasm, envoy_bin, tmp)

        def send(i):
            body = {"model": "sim-model", "prompt": "question %d about the house style " % i * (4 + i % 24),
                    "max_tokens": 4 + i % 8, "stream": True}
            return post(port, json.dumps(body), SLO_HEADERS)

        # Warm-up: concurrent streams (several samples per 100 ms training tick) until the
        # model has seen every endpoint a few times; it predicts from 50 samples on.
        warm = max(400, 8 * n)
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            statuses = list(pool.map(send, range(warm)))
        if statuses.count(200) < warm * 0.9:
            raise SystemExit("warm-up: only %d of %d requests answered 200; see %s" % (statuses.count(200), warm, tmp))
        time.sleep(0.5)  # the last training tick and a stats flush
        label = 'extension_point="PrepareData"'
        before = scrape(admin)
        if gauge(before, SAMPLES, 'prediction="ttft"') < 50:
            raise SystemExit("the latency predictor is not ready after the warm-up; see " + tmp)
        p0, d0 = histogram(admin, PLUGIN, label, before), histogram(admin, METRIC, "", before)
        for k in range(requests):
            send(warm + k)
        time.sleep(1.5)
        after = scrape(admin)
        p1, d1, t1 = (histogram(admin, PLUGIN, label, after), histogram(admin, METRIC, "", after),
                      histogram(admin, TRAINING, "", after))
        if p1[1] <= p0[1] or d1[1] <= d0[1]:
            raise SystemExit("no predictions observed; see " + tmp)
        trained = gauge(after, SAMPLES, 'prediction="ttft"')
        return {"prediction": (p1[0] - p0[0]) / (p1[1] - p0[1]), "timed": p1[1] - p0[1],
                "decision": (d1[0] - d0[0]) / (d1[1] - d0[1]), "ticks": t1[1],
                "tick": t1[0] / t1[1] if t1[1] else float("nan"), "tick_max": largest_bucket(after, TRAINING),
                "per_sample": t1[0] / trained if trained else float("nan")}
    finally:
        if proc:
            stop(proc)
        stop(sim)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--profile", choices=["default", "slo"], default="default")
    p.add_argument("--sizes", default="8,64,512")
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--wasm", default=os.path.join(ROOT, "target/wasm32-wasip1/release/epp_filter.wasm"))
    p.add_argument("--envoy", default=os.path.join(ROOT, ".venv/bin/envoy"))
    a = p.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    if a.profile == "slo":
        print("endpoints  prediction (µs)  timed  whole decision (µs)  "
              "training ticks: n, mean (µs), all ≤ (µs), µs per sample trained")
        for n in sizes:
            r = run_slo(n, a.requests, a.wasm, a.envoy)
            print("%9d  %15.1f  %5d  %19.1f  %d, %.0f, %s, %.2f" % (
                n, r["prediction"], r["timed"], r["decision"], r["ticks"], r["tick"],
                "%.0f" % r["tick_max"] if r["tick_max"] else "?", r["per_sample"]))
        return
    print("endpoints  mean pick in the VM (µs)  picks measured  of which, per plugin (µs)")
    for n in sizes:
        mean, count, parts = run(n, a.requests, a.wasm, a.envoy)
        detail = ", ".join("%s %.1f" % (k, v) for k, v in parts.items())
        print("%9d  %24.1f  %14d  %s" % (n, mean, count, detail))


if __name__ == "__main__":
    main()
