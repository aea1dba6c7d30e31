#!/usr/bin/env python3
"""A local autoscaler: KEDA + the HPA, on the gateway's own signals, over a pool of vllm-sim.

What a cluster does with envoy/autoscaling/keda-scaledobject.yaml, on one machine:
a Prometheus (Debian's) scrapes the filter's metrics endpoint; every polling interval the
ScaledObject's own queries are run against it and hpa.py decides the replica count; servers
are started (with their --startup-duration, a cold start) and stopped, and Envoy learns the
change through its watched EDS file (eds.py), with no restart. A new server joins the EDS
file when its /health/ready answers 200 (a readiness probe); a removed one leaves the file
first and is stopped once it has no request left (or after the grace period).

  autoscale.py config [--base FILE] --cluster NAME       filter config for an autoscaled run
  autoscale.py run --config FILE --eds FILE --replicas MIN:MAX [--speed F] [--sim-args ARGS]
                   [--scaled-object FILE] [--dir DIR] [--status-every S]

`run` prints a status line (replicas, queue, running, the last decision) and appends every
decision to DIR/autoscale.jsonl; SIGTERM or SIGINT stops what it started and exits.
"""
import argparse
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eds  # noqa: E402
import hpa  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCALED_OBJECT = os.path.join(ROOT, "envoy", "autoscaling", "keda-scaledobject.yaml")
VLLM_SIM = os.path.join(ROOT, "target", "release", "vllm-sim")
GRACE_S = 30.0  # a Pod's default terminationGracePeriodSeconds
# A removed server keeps serving this long even when idle, as a preStop sleep does: the
# gateway may have picked it just before it left the EDS file (Envoy reloads the file at
# once, the filter's discovery every 500 ms).
PRE_STOP_S = 2.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=1.0):
    """(status, body) of a GET; status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return 0, ""


def filter_config(base, cluster):
    """`base` (a JSON filter configuration, or {}) with what an autoscaled pool needs:
    flow control (requests wait while servers start, up to 5 minutes), endpoints from the
    watched cluster, and the metrics endpoint Prometheus scrapes."""
    config = dict(base)
    gates = config.setdefault("featureGates", [])
    if "flowControl" not in gates:
        gates.append("flowControl")
    config.setdefault("flowControl", {}).setdefault("noEndpointRequestTTL", "5m")
    pool = config.setdefault("pool", {})
    pool.pop("endpoints", None)
    pool["discovery"] = {"cluster": cluster, "refreshInterval": "500ms"}
    metrics = pool.setdefault("metricsEndpoint", {})
    if not metrics.get("port"):
        metrics["port"] = free_port()
    return config


def local_queries(spec, pool, model):
    """The ScaledObject's queries with its pool and model label values replaced by ours."""
    for t in spec.triggers:
        q = re.sub(r'inference_pool="[^"]*"', f'inference_pool="{pool}"', t.query)
        t.query = re.sub(r'target_model_name="[^"]*"', f'target_model_name="{model}"', q)


class Prometheus:
    def __init__(self, target, interval_s, work):
        self.addr = f"127.0.0.1:{free_port()}"
        os.makedirs(work, exist_ok=True)
        config = os.path.join(work, "prometheus.yml")
        every = f"{int(max(0.5, interval_s) * 1000)}ms"  # Prometheus takes no decimals
        with open(config, "w") as f:
            f.write(f"global: {{scrape_interval: {every}, evaluation_interval: {every}}}\n"
                    f"scrape_configs:\n- job_name: gateway\n  static_configs:\n"
                    f"  - targets: ['{target}']\n")
        log = open(os.path.join(work, "prometheus.log"), "w")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={config}",
             f"--storage.tsdb.path={os.path.join(work, 'data')}",
             f"--web.listen-address={self.addr}"], stdout=log, stderr=log)
        deadline = time.time() + 60
        # Ready, and the gateway scraped once (Prometheus hands a new target to its scraper
        # a few seconds after it starts): before that every query reads nothing.
        while get(f"http://{self.addr}/-/ready")[0] != 200 or self.query("up") != 1.0:
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"prometheus did not scrape {target}; see "
                                   f"{work}/prometheus.log")
            time.sleep(0.2)

    def query(self, promql):
        """The first value of an instant query; None if it failed or returned nothing."""
        status, body = get(f"http://{self.addr}/api/v1/query?"
                           + urllib.parse.urlencode({"query": promql}), timeout=2.0)
        if status != 200:
            return None
        try:
            result = json.loads(body)["data"]["result"]
            return float(result[0]["value"][1]) if result else None
        except (ValueError, KeyError, IndexError):
            return None


class Server:
    def __init__(self, n, args, work):
        self.n = n
        self.out = os.path.join(work, f"sim-{n}.out")
        log = open(os.path.join(work, f"sim-{n}.log"), "w")
        self.proc = subprocess.Popen([VLLM_SIM, "--host", "127.0.0.1", "--port", "0"] + args,
                                     stdout=open(self.out, "w"), stderr=log)
        self.addr = None
        self.started = time.time()
        self.ready = False
        self.draining_since = None

    def poll_address(self):
        if self.addr is None and os.path.exists(self.out):
            with open(self.out) as f:
                m = re.search(r"listening on http://(\S+)", f.read())
            self.addr = m.group(1) if m else None
        return self.addr

    def idle(self):
        status, body = get(f"http://{self.addr}/metrics")
        if status != 200:
            return True
        busy = 0.0
        for line in body.splitlines():
            if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
                busy += float(line.rsplit(" ", 1)[-1])
        return busy == 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Pool:
    """The scale target: servers by start order, the EDS file listing the ready ones."""

    def __init__(self, eds_file, cluster, sim_args, work):
        self.eds_file, self.cluster, self.sim_args, self.work = eds_file, cluster, sim_args, work
        self.servers, self.draining, self.started = [], [], 0
        self.published = None
        self.first_ready_at = None

    def replicas(self):
        return len(self.servers)

    def scale_to(self, n):
        while len(self.servers) < n:
            self.started += 1
            self.servers.append(Server(self.started, self.sim_args, self.work))
        while len(self.servers) > n:
            s = self.servers.pop()  # the newest goes first, as a ReplicaSet does
            s.draining_since = time.time()
            self.draining.append(s)

    def tick(self, speed):
        """Readiness probes, EDS updates and drained servers' shutdown."""
        for s in self.servers:
            if not s.ready and s.poll_address():
                s.ready = get(f"http://{s.addr}/health/ready", 0.5)[0] == 200
                if s.ready and self.first_ready_at is None:
                    self.first_ready_at = time.time()
        ready = [s.addr for s in self.servers if s.ready]
        if ready != self.published:
            eds.write(self.eds_file, self.cluster, ready)
            self.published = ready
        for s in list(self.draining):
            waited = time.time() - s.draining_since
            if s.addr is None or not s.ready or waited > max(GRACE_S / speed, PRE_STOP_S) \
                    or waited > PRE_STOP_S and s.idle():
                s.stop()
                self.draining.remove(s)

    def ready_count(self):
        return sum(1 for s in self.servers if s.ready)

    def stop(self):
        for s in self.servers + self.draining:
            s.stop()


def run(a):
    with open(a.config) as f:
        config = json.load(f)
    pool_cfg = config.get("pool", {})
    import yaml  # pyyaml: scripts/setup --autoscale installs it
    with open(a.scaled_object) as f:
        doc = yaml.safe_load(f)
    lo, _, hi = a.replicas.partition(":")
    spec = hpa.Spec(doc, speed=a.speed, min_replicas=int(lo), max_replicas=int(hi))
    sim_args = shlex.split(a.sim_args)
    model = sim_args[sim_args.index("--model") + 1] if "--model" in sim_args else "sim-model"
    local_queries(spec, pool_cfg.get("name", "default-pool"), model)
    os.makedirs(a.dir, exist_ok=True)
    pool = Pool(a.eds, pool_cfg["discovery"]["cluster"], sim_args, a.dir)
    prometheus = None

    def stop(*_):
        pool.stop()
        if prometheus is not None and prometheus.proc.poll() is None:
            prometheus.proc.terminate()
            prometheus.proc.wait()
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    metrics = f"127.0.0.1:{pool_cfg['metricsEndpoint']['port']}"
    prometheus = Prometheus(metrics, spec.polling / 2, os.path.join(a.dir, "prometheus"))
    ctl = hpa.Controller(spec, now=time.time())
    pool.scale_to(spec.min)
    pool.tick(a.speed)
    log = open(os.path.join(a.dir, "autoscale.jsonl"), "a")
    print(f"autoscale: {spec.min}:{spec.max} replicas, polling {spec.polling:g}s, cooldown "
          f"{spec.cooldown:g}s, windows up {spec.up['window']:g}s / down "
          f"{spec.down['window']:g}s (the ScaledObject's times / {a.speed:g}); queries: "
          + "; ".join(f"{t.name}: {t.query} (target {t.target:g})" for t in spec.triggers),
          flush=True)
    t0 = time.time()
    next_poll = next_status = t0
    last = "none yet"
    values = {}
    while True:
        now = time.time()
        if now >= next_poll:
            next_poll = now + spec.polling
            values = {t.name: prometheus.query(t.query) for t in spec.triggers}
            before = pool.replicas()
            desired, reason = ctl.decide(now, before, values)
            if desired != before:
                pool.scale_to(desired)
                last = f"{time.strftime('%H:%M:%S')} {before}->{desired}: {reason}"
            log.write(json.dumps({"t": round(now - t0, 3), "wall": round(now, 3),
                                  "replicas": before,
                                  "ready": pool.ready_count(), "desired": desired,
                                  "draining": len(pool.draining),
                                  "values": values, "reason": reason}) + "\n")
            log.flush()
        pool.tick(a.speed)
        if a.status_every > 0 and now >= next_status:
            next_status = now + a.status_every
            shown = " ".join(f"{k}={'?' if v is None else f'{v:g}'}" for k, v in values.items())
            print(f"{time.strftime('%H:%M:%S')} replicas={pool.replicas()} "
                  f"(ready {pool.ready_count()}, draining {len(pool.draining)}) {shown} "
                  f"| last decision: {last}", flush=True)
        time.sleep(0.1)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("config", help="print the filter configuration for an autoscaled run")
    c.add_argument("--base", help="a JSON filter configuration to start from")
    c.add_argument("--cluster", required=True)
    r = sub.add_parser("run", help="run the autoscaler until SIGTERM")
    r.add_argument("--config", required=True, help="the filter configuration (from `config`)")
    r.add_argument("--eds", required=True, help="the EDS file Envoy watches")
    r.add_argument("--replicas", required=True, help="MIN:MAX")
    r.add_argument("--speed", type=float, default=1.0,
                   help="divide the ScaledObject's times (polling, cooldown, windows) by this")
    r.add_argument("--scaled-object", default=SCALED_OBJECT)
    r.add_argument("--sim-args", default="", help="vllm-sim flags for every server")
    r.add_argument("--dir", default=".", help="logs, Prometheus data, autoscale.jsonl")
    r.add_argument("--status-every", type=float, default=5.0)
    a = p.parse_args()
    if a.cmd == "config":
        base = {}
        if a.base:
            with open(a.base) as f:
                try:
                    base = json.load(f)
                except json.JSONDecodeError as e:
                    sys.exit(f"autoscale.py: --config must be JSON with --autoscale: {e}")
        print(json.dumps(filter_config(base, a.cluster), indent=2))
        return
    if not re.fullmatch(r"\d+:\d+", a.replicas):
        sys.exit(f"autoscale.py: --replicas {a.replicas!r} is not MIN:MAX")
    if a.speed <= 0:
        sys.exit("autoscale.py: --speed must be above 0")
    try:
        run(a)
    except (ValueError, RuntimeError, KeyError) as e:
        sys.exit(f"autoscale.py: {e}")


if __name__ == "__main__":
    main()
