"""What every benchmark of scripts/bench shares: paths, the processes a run starts (and
stops, by PID), ports, readiness checks, loadgen, percentiles and table formatting, and
the raw result: the markdown table with its provenance header (command line, date,
machine, load average, git revision), written to bench-results/ and printed.
"""
import json
import math
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from typing import List

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SIM = os.path.join(ROOT, "target/release/vllm-sim")
LOADGEN = os.path.join(ROOT, "target/release/loadgen")
QUALITY_SIM = os.path.join(ROOT, "target/release/quality-sim")
SLO_SIM = os.path.join(ROOT, "target/release/slo-sim")
WASM = os.path.join(ROOT, "target/wasm32-wasip1/release/epp_filter.wasm")
ENVOY = os.path.join(ROOT, ".venv/bin/envoy")
VENV_PY = os.path.join(ROOT, ".venv/bin/python")
RENDER = os.path.join(ROOT, "scripts/lib/render.py")
STATIC = os.path.join(ROOT, "scripts/lib/bench/static_cluster.py")
FLOW_CONTROL_PY = os.path.join(ROOT, "scripts/lib/bench/flow_control.py")
RESULTS_DIR = os.path.join(ROOT, "bench-results")


def log(*a):
    """A progress line on stderr (stdout carries the result only)."""
    print("bench:", *a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# Processes a run started, stopped by PID (and nothing else).

class Procs:
    """The processes one run started; each one's stdout and stderr go to files in workdir."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.procs = []
        self.n = 0

    def start(self, name, cmd):
        """Starts cmd; the returned Popen carries bench_name, bench_out and bench_err."""
        self.n += 1
        out = open(os.path.join(self.workdir, f"{self.n:02d}-{name}.out"), "w")
        err = open(os.path.join(self.workdir, f"{self.n:02d}-{name}.log"), "w")
        p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        p.bench_name = name
        p.bench_out = out.name
        p.bench_err = err.name
        self.procs.append(p)
        return p

    def stop(self, p, timeout=5):
        """SIGTERM to p's PID, SIGKILL if it has not exited within `timeout` s."""
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=timeout)
        if p in self.procs:
            self.procs.remove(p)

    def stop_named(self, prefix):
        """Stops the processes whose name starts with prefix."""
        for p in [x for x in list(self.procs) if x.bench_name.startswith(prefix)]:
            self.stop(p)

    def stop_all(self):
        """Stops every process still running, newest first."""
        for p in list(reversed(self.procs)):
            try:
                self.stop(p)
            except Exception as e:  # keep stopping the others
                log(f"could not stop {p.bench_name} (pid {p.pid}): {e}")


def run_with_procs(fn):
    """Calls fn(procs) with a fresh .run/bench-PID/ work directory; on return, an error,
    SIGTERM (from scripts/bench's timeout) or SIGINT, stops what fn started."""
    workdir = os.path.join(ROOT, ".run", f"bench-{os.getpid()}")
    os.makedirs(workdir, exist_ok=True)
    procs = Procs(workdir)

    def on_signal(sig, _frame):
        raise SystemExit(f"bench: signal {sig}")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return fn(procs)
    finally:
        procs.stop_all()
        log(f"stopped what it started; logs in {os.path.relpath(workdir, ROOT)}")


def free_port():
    """A TCP port free on 127.0.0.1 right now."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http_get(url, timeout=2.0):
    """(status, body text) of a GET."""
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode("utf-8", "replace")


def wait_for(what, check, proc, limit=30.0):
    """Polls check() until it returns something true; exits if proc dies or after `limit` s."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"bench: {what} exited ({proc.returncode}); see {proc.bench_err}")
        try:
            v = check()
            if v:
                return v
        except Exception:
            pass
        time.sleep(0.05)
    raise SystemExit(f"bench: {what} not ready within {limit:.0f} s; see {getattr(proc, 'bench_err', '?')}")


# ---------------------------------------------------------------------------------------
# The processes: vllm-sim servers, Envoy, sglang-router.

def start_sims(procs, n, args, tag="sim"):
    """n vllm-sim servers (seeds 0..n-1) on ephemeral ports; their host:port addresses."""
    ps = []
    for i in range(n):
        ps.append(procs.start(f"{tag}{i}", [SIM, "--host", "127.0.0.1", "--port", "0", "--seed", str(i)] + args))
    addrs = []
    for p in ps:
        def read(p=p):
            with open(p.bench_out) as f:
                m = re.search(r"listening on http://(\S+)", f.read())
                return m and m.group(1)
        addrs.append(wait_for("vllm-sim", read, p, 20))
    return addrs


@dataclass
class Envoy:
    """A running Envoy: its listener (host:port), the header the ORIGINAL_DST `pool`
    cluster routes on, its admin address and its process."""
    url: str
    header: str
    admin: str
    proc: subprocess.Popen


def start_envoy(procs, kind, endpoints, workers, tag="envoy", render=RENDER, wasm=WASM, config=None,
                render_args=()):
    """Envoy in front of endpoints. kind: filter | nofilter (ORIGINAL_DST, the client names
    the endpoint) | ROUND_ROBIN | LEAST_REQUEST (STATIC cluster, static_cluster.py).
    `render` and `wasm` may name another checkout's renderer and build (a candidate);
    `config` is the filter's configuration file (default: `{}`, the default configuration);
    `render_args` go to render.py too (e.g. `--cluster kv-relay=IP:PORT`)."""
    d = tempfile.mkdtemp(prefix=f"{tag}-", dir=procs.workdir)
    if config is None:
        config = os.path.join(d, "filter.json")
        with open(config, "w") as f:
            f.write("{}")
    cmd = [sys.executable, render, "--wasm", wasm, "--config", config, "--endpoints", ",".join(endpoints),
           *render_args]
    if kind != "filter":
        cmd.append("--no-filter")
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    if kind in ("ROUND_ROBIN", "LEAST_REQUEST"):
        text = subprocess.run([sys.executable, STATIC, "--lb-policy", kind, "--endpoints", ",".join(endpoints)],
                              input=text, check=True, capture_output=True, text=True).stdout
    boot = os.path.join(d, "bootstrap.yaml")
    with open(boot, "w") as f:
        f.write(text)
    # The header the ORIGINAL_DST `pool` cluster routes on (for the plain-Envoy side,
    # where the client names the endpoint itself).
    m = re.search(r"name: pool\n(?:    .*\n)*?    original_dst_lb_config: \{[^}]*http_header_name: ([\w-]+)", text)
    header = m.group(1) if m else "x-gateway-destination-endpoint"
    admin_path = os.path.join(d, "admin-address")
    p = procs.start(tag, [ENVOY, "-c", boot, "--concurrency", str(workers), "--disable-hot-restart",
                          "--admin-address-path", admin_path, "-l", "warning",
                          "--component-log-level", "wasm:warning", "--log-path", os.path.join(d, "envoy.log")])

    def ready():
        admin = open(admin_path).read().strip()
        if admin and http_get(f"http://{admin}/ready")[1].strip() == "LIVE":
            return admin
    admin = wait_for(f"envoy ({kind}, {tag})", ready, p, 60)
    listeners = json.loads(http_get(f"http://{admin}/listeners?format=json")[1])
    port = listeners["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
    return Envoy(f"127.0.0.1:{port}", header, admin, p)


def start_sglang(procs, policy, endpoints, tag="sglang"):
    """sglang-router (from .venv) with --policy in front of endpoints; its host:port."""
    port, prom = free_port(), free_port()
    p = procs.start(tag, [VENV_PY, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
                          "--worker-urls", *[f"http://{e}" for e in endpoints], "--policy", policy,
                          "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom), "--log-level", "warn"])

    def ready():
        w = json.loads(http_get(f"http://127.0.0.1:{port}/workers")[1])
        healthy = [x for x in w.get("workers", []) if x.get("is_healthy")]
        return len(healthy) == len(endpoints)
    wait_for(f"sglang-router ({policy})", ready, p, 60)
    return f"127.0.0.1:{port}"


@dataclass
class Candidate:
    """The filter of another checkout (--candidate DIR): its renderer and its .wasm."""
    directory: str
    render: str
    wasm: str
    label: str = ""

    def note(self):
        """The line that says what the `filter (candidate)` rows are."""
        return (f"`filter (candidate)` = the filter of another checkout, `{os.path.relpath(self.directory, ROOT)}`"
                + (f" ({self.label})" if self.label else "")
                + ", with its own `scripts/lib/render.py` bootstrap and its default configuration.")


def candidate(directory, wasm=None, label=""):
    """The Candidate of --candidate DIR [--candidate-wasm PATH], None without DIR; exits if
    its renderer or .wasm is missing."""
    if not directory:
        return None
    render = os.path.join(directory, "scripts/lib/render.py")
    wasm = wasm or os.path.join(directory, "target/wasm32-wasip1/release/epp_filter.wasm")
    for f in (render, wasm):
        if not os.path.exists(f):
            raise SystemExit(f"bench: --candidate: {f} is missing (build the candidate's filter first)")
    return Candidate(directory, render, wasm, label)


def loadgen(args, label, limit):
    """Runs loadgen to completion (bounded: its own --duration/--timeout, and `limit`
    seconds here); its JSON summary."""
    cmd = [LOADGEN, "--label", label] + [str(a) for a in args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    if r.returncode != 0:
        raise SystemExit(f"bench: loadgen failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr}")
    return json.loads(r.stdout)


def finish(p, what, limit):
    """Waits at most `limit` s for a loadgen started with stderr piped (text); exits the
    bench, naming `what`, if it does not finish or fails; its stderr."""
    try:
        _, err = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise SystemExit(f"bench: {what} did not finish")
    if p.returncode != 0:
        raise SystemExit(f"bench: {what} failed: {err[-2000:]}")
    return err


def read_records(path):
    """The per-request JSON lines loadgen --records wrote."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# ---------------------------------------------------------------------------------------
# Numbers and tables.

def pct(sorted_values, p):
    """The p-th percentile (nearest rank) of an ascending list; None if empty."""
    if not sorted_values:
        return None
    i = min(len(sorted_values), max(1, math.ceil(p / 100 * len(sorted_values)))) - 1
    return sorted_values[i]


def fmt(v, digits=2):
    """A float with `digits` decimals, "–" for None, anything else as str()."""
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def table(headers, rows):
    """A markdown table."""
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


def split_list(text, convert=int):
    """"a,b,c" as a list, empty items dropped."""
    return [convert(x) for x in text.split(",") if x.strip()]


# ---------------------------------------------------------------------------------------
# Provenance and the raw result.

def git(*args):
    """git's stdout in ROOT, "?" if git fails."""
    try:
        return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:
        return "?"


def git_revision():
    """The short revision, and whether tracked files differ from it. BENCHMARKS.md is
    left out: it is edited by hand from these results and does not change what runs."""
    rev = git("rev-parse", "--short=12", "HEAD")
    if git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)BENCHMARKS.md"):
        rev += " (with uncommitted changes)"
    return rev


def cpu_model():
    """The CPU's model name from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def loadavg():
    """The 1/5/15-minute load averages."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


@dataclass
class Result:
    """What one benchmark measured: a title, the tables (markdown) and the setup notes
    (what ran, with its parameters; no interpretation)."""
    title: str
    body: str
    notes: List[str] = field(default_factory=list)


def render_result(result, command, load_before, now):
    """The result as markdown, under a provenance header."""
    u = platform.uname()
    head = [
        f"### {result.title}",
        "",
        f"- command: `{command}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M:%S UTC', now)}",
        f"- machine: `{u.system} {u.release} {u.machine}`, {cpu_model()}, {os.cpu_count()} CPUs",
        f"- load average (1/5/15 min): before {load_before}, after {loadavg()}",
        f"- git revision: {git_revision()}",
        "",
        "",
    ]
    text = "\n".join(head) + result.body.rstrip() + "\n"
    notes = [n.rstrip() for n in result.notes if n.strip()]
    if notes:
        text += "\n" + "\n\n".join(notes) + "\n"
    return text


def results_path(subcommand, now):
    """bench-results/<UTC timestamp>-<subcommand>.md, with a suffix if that name is taken."""
    stem = time.strftime("%Y%m%dT%H%M%SZ", now) + "-" + subcommand
    path = os.path.join(RESULTS_DIR, stem + ".md")
    n = 2
    while os.path.exists(path):
        path = os.path.join(RESULTS_DIR, f"{stem}-{n}.md")
        n += 1
    return path


def write_result(subcommand, result, command, load_before):
    """Prints the result (with its provenance header) on stdout and writes it to
    bench-results/; returns the file's path. BENCHMARKS.md is not touched."""
    now = time.gmtime()
    text = render_result(result, command, load_before, now)
    print(text, flush=True)
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = results_path(subcommand, now)
    with open(path, "w") as f:
        f.write(text)
    log(f"result written to {os.path.relpath(path, ROOT)}")
    return path
