#!/usr/bin/env python3
"""The cost of one pick inside the wasm VM, measured in a real Envoy (V8).

Starts Envoy 1.40 with the filter (default profile, metrics scraping off so the fake
endpoints stay candidates) in front of N endpoints that do not exist (each request gets a
fast 503 from Envoy after the pick), warms the prefix index with conversations sharing
system prompts, then sends requests and reads the filter's own
`inference_extension_scheduler_e2e_duration_seconds` histogram (microseconds; sum/count
before and after the measured batch). That histogram covers the whole decision: header
reads, the snapshot version read, the prefix-log sync, and the in-flight ledger CAS with the
scheduler (hashing, matching, filters, scorers, picker) inside it. The PreRequest
bookkeeping after it (prefix index insert and log publication, a further ~5-10 µs) is not
included, as in the reference.

  filter/benches/in_envoy.py [--sizes 8,64,512] [--requests 400] [--wasm PATH] [--envoy PATH]

Build first: cargo build --release -p filter --lib --target wasm32-wasip1
"""
import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
METRIC = "inference_extension_scheduler_e2e_duration_seconds"


def post(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("POST", "/v1/completions", body=body, headers={"content-type": "application/json"})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status


def histogram(admin, metric=METRIC, labels=""):
    c = http.client.HTTPConnection(admin, timeout=10)
    c.request("GET", "/stats/prometheus")
    text = c.getresponse().read().decode()
    c.close()
    s = re.search(r"^%s_sum\{[^}]*%s[^}]*\} (\S+)$" % (metric, re.escape(labels)), text, re.M)
    n = re.search(r"^%s_count\{[^}]*%s[^}]*\} (\S+)$" % (metric, re.escape(labels)), text, re.M)
    return (float(s.group(1)) if s else 0.0, float(n.group(1)) if n else 0.0)


def run(n, requests, wasm, envoy_bin):
    tmp = tempfile.mkdtemp(prefix="epp-bench-")
    endpoints = ["127.1.%d.%d:9" % (i // 250, i % 250 + 1) for i in range(n)]
    config = {"dataLayer": {"sources": []}, "pool": {"endpoints": endpoints}}
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
    try:
        admin = None
        for _ in range(300):
            if os.path.exists(admin_path) and open(admin_path).read().strip():
                admin = open(admin_path).read().strip()
                try:
                    c = http.client.HTTPConnection(admin, timeout=2)
                    c.request("GET", "/listeners?format=json")
                    listeners = json.loads(c.getresponse().read())
                    port = listeners["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
                    break
                except Exception:
                    pass
            time.sleep(0.1)
        else:
            raise SystemExit("envoy did not start; see " + tmp)
        system = ["You are assistant number %d. Follow the house style guide carefully. " % k * 12
                  for k in range(20)]
        for i in range(300):  # warm the index
            post(port, json.dumps({"model": "m", "prompt": system[i % 20] + "warm-up question %d " % i * 8}))
        time.sleep(1.5)  # a stats flush
        parts = [("Scorer", "queue-scorer"), ("Scorer", "kv-cache-utilization-scorer"),
                 ("Scorer", "prefix-cache-scorer"), ("Picker", "max-score-picker")]
        label = lambda p: 'extension_point="%s",plugin_type="%s"' % p
        before = {p: histogram(admin, "inference_extension_plugin_duration_seconds", label(p)) for p in parts}
        s0, c0 = histogram(admin)
        for i in range(requests):
            post(port, json.dumps({"model": "m", "prompt": system[i % 20] + "question %d " % i * 8}))
        time.sleep(1.5)
        s1, c1 = histogram(admin)
        if c1 <= c0:
            raise SystemExit("no observations; see " + tmp)
        breakdown = {}
        for p in parts:
            ps, pc = histogram(admin, "inference_extension_plugin_duration_seconds", label(p))
            bs, bc = before[p]
            if pc > bc:
                breakdown[p[1]] = (ps - bs) / (pc - bc)
        return (s1 - s0) / (c1 - c0), c1 - c0, breakdown
    finally:
        proc.terminate()
        proc.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="8,64,512")
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--wasm", default=os.path.join(ROOT, "target/wasm32-wasip1/release/epp_filter.wasm"))
    p.add_argument("--envoy", default=os.path.join(ROOT, ".venv/bin/envoy"))
    a = p.parse_args()
    print("endpoints  mean pick in the VM (µs)  picks measured  of which, per plugin (µs)")
    for n in [int(x) for x in a.sizes.split(",")]:
        mean, count, parts = run(n, a.requests, a.wasm, a.envoy)
        detail = ", ".join("%s %.1f" % (k, v) for k, v in parts.items())
        print("%9d  %24.1f  %14d  %s" % (n, mean, count, detail))


if __name__ == "__main__":
    main()
