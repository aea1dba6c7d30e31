"""The scale-from-zero loop, driven as a user would: `scripts/run --autoscale MIN:MAX`,
then a burst against an empty pool, a sustained load, silence until the pool is back at
zero, and one more request. Shared by the test (scripts/lib/test_autoscale.py, which
asserts on it) and the benchmark (`scripts/bench autoscale`, which records it).

Every wait is bounded; the scripts/run process (and, through it, Envoy, Prometheus, the
autoscaler and the servers it started) is stopped by PID at the end.
"""
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNNING_TARGET = 16  # the ScaledObject's running threshold per replica


class Run:
    """scripts/run --autoscale in the background; its output in `out`."""

    def __init__(self, replicas, speed, sim_args, workdir):
        os.makedirs(workdir, exist_ok=True)
        self.out_path = os.path.join(workdir, "run.out")
        with open(self.out_path, "w") as out:
            self.proc = subprocess.Popen(
                [os.path.join(ROOT, "scripts", "run"), "--autoscale", replicas,
                 "--autoscale-speed", str(speed), "--sim-args", sim_args,
                 "--status-every", "1"],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = self.dir = None
        deadline = time.time() + 600  # the first call builds the filter and vllm-sim
        while time.time() < deadline and self.proc.poll() is None:
            text = self.output()
            url = re.search(r"^listening on (http://\S+)", text, re.M)
            logs = re.search(r"^logs: (\S+)", text, re.M)
            if url and logs and "autoscale:" in text:
                self.url, self.dir = url.group(1), logs.group(1)
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("scripts/run --autoscale did not start:\n" + self.output()[-3000:])

    def output(self):
        with open(self.out_path) as f:
            return f.read()

    def decisions(self):
        """The autoscaler's polls so far (autoscale.jsonl)."""
        try:
            with open(os.path.join(self.dir, "autoscale.jsonl")) as f:
                return [json.loads(line) for line in f if line.strip()]
        except OSError:
            return []

    def replicas(self):
        d = self.decisions()
        return d[-1]["desired"] if d else None

    def until(self, ok, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            r = self.replicas()
            if r is not None and ok(r):
                return True
            time.sleep(0.25)
        return False

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)  # scripts/run stops what it started
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def stream(url, model, prompt, max_tokens, timeout=300):
    """A streamed completion: (status, seconds to the first token, seconds in all)."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "stream": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body,
                                 headers={"content-type": "application/json"})
    t0 = time.time()
    first = None
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for line in r:
                if first is None and line.startswith(b"data: {"):
                    first = time.time() - t0
            return r.status, first, time.time() - t0
    except urllib.error.HTTPError as e:
        sys.stderr.write(f"autoscale scenario: {prompt!r}: {e.code} {e.read()[:300]!r}\n")
        return e.code, None, time.time() - t0
    except OSError:
        return 0, None, time.time() - t0


def parallel(n, fn):
    out = [None] * n
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, fn(i))) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def scenario(workdir, speed=20.0, replicas="0:3", burst=8, clients=20, sustain_s=45.0,
             startup="2s", cooldown_s=None):
    """Runs the loop; returns what happened (times in seconds since the run started)."""
    sim_args = (f"--startup-duration {startup} --max-num-seqs 64 "
                "--time-to-first-token 100ms --inter-token-latency 50ms")
    run = Run(replicas, speed, sim_args, workdir)
    result = {"speed": speed, "replicas": replicas, "burst": burst, "clients": clients,
              "startup": startup, "expected_under_load": None}
    try:
        lo, hi = (int(x) for x in replicas.split(":"))
        cooldown_s = cooldown_s or 300.0 / speed
        t0 = time.time()
        result["idle_replicas"] = run.replicas() if run.until(lambda r: True, 10) else None
        # A burst against an empty pool: every request waits in the gateway, none fails.
        b = parallel(burst, lambda i: stream(run.url, "sim-model", f"cold {i}", 8))
        result["burst_status"] = [s for s, _, _ in b]
        result["ttft_after_zero_s"] = min((f for _, f, _ in b if f is not None), default=None)
        # A sustained load of `clients` requests in flight, about 1 s each.
        stop_at = time.time() + sustain_s
        counts = {"ok": 0, "failed": 0}
        lock = threading.Lock()

        def client(i):
            n = 0
            while time.time() < stop_at:
                s, _, _ = stream(run.url, "sim-model", f"client {i} request {n}", 20)
                n += 1
                with lock:
                    counts["ok" if s == 200 else "failed"] += 1
        parallel(clients, client)
        result["sustained"] = dict(counts)
        result["expected_under_load"] = max(min(hi, math.ceil(clients / RUNNING_TARGET)), 1)
        result["replicas_under_load"] = run.replicas()
        result["max_replicas"] = max((d["desired"] for d in run.decisions()), default=0)
        # Silence: after the cooldown the pool goes back to MIN.
        result["back_to_min"] = run.until(lambda r: r == lo, cooldown_s + 30)
        result["back_to_min_after_s"] = round(time.time() - stop_at, 1)
        # The removed servers stopped, and the filter's discovery (every 500 ms) saw it.
        deadline = time.time() + 60
        while time.time() < deadline and (run.decisions() or [{}])[-1].get("draining", 0):
            time.sleep(0.25)
        time.sleep(2)
        # And the next request waits for a cold start again, and succeeds.
        s, f, _ = stream(run.url, "sim-model", "after zero", 8)
        result["after_zero_status"] = s
        result["ttft_after_zero_again_s"] = f
        result["decisions"] = [{"t": round(d["wall"] - t0, 2),
                                "replicas": d["replicas"], "ready": d["ready"],
                                "desired": d["desired"], "values": d["values"]}
                               for d in run.decisions()]
        result["run_dir"] = run.dir
    finally:
        run.stop()
    return result

