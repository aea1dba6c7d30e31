#!/usr/bin/env python3
"""The benchmarks behind scripts/bench: starts the processes each one needs on ephemeral
loopback ports (vllm-sim servers, Envoy with and without the filter, Envoy with a STATIC
cluster, sglang-router), drives them with target/release/loadgen, stops what it started
by PID, prints a markdown table and appends it to BENCHMARKS.md with the command line,
date, machine, load average and git revision.

Called by scripts/bench after it has built everything; not meant to be run directly.
"""
import argparse
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SIM = os.path.join(ROOT, "target/release/vllm-sim")
LOADGEN = os.path.join(ROOT, "target/release/loadgen")
WASM = os.path.join(ROOT, "target/wasm32-wasip1/release/epp_filter.wasm")
ENVOY = os.path.join(ROOT, ".venv/bin/envoy")
VENV_PY = os.path.join(ROOT, ".venv/bin/python")
RENDER = os.path.join(ROOT, "scripts/lib/render.py")
STATIC = os.path.join(ROOT, "scripts/lib/bench/static_cluster.py")
BENCHMARKS = os.path.join(ROOT, "BENCHMARKS.md")


def log(*a):
    print("bench:", *a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# Processes this script started, stopped by PID (and nothing else).

class Procs:
    def __init__(self, workdir):
        self.workdir = workdir
        self.procs = []
        self.n = 0

    def start(self, name, cmd, **kw):
        self.n += 1
        out = open(os.path.join(self.workdir, f"{self.n:02d}-{name}.out"), "w")
        err = open(os.path.join(self.workdir, f"{self.n:02d}-{name}.log"), "w")
        p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, **kw)
        p.bench_name = name
        p.bench_out = out.name
        p.bench_err = err.name
        self.procs.append(p)
        return p

    def stop(self, p, timeout=5):
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=timeout)
        if p in self.procs:
            self.procs.remove(p)

    def stop_all(self):
        for p in list(reversed(self.procs)):
            try:
                self.stop(p)
            except Exception as e:  # keep stopping the others
                log(f"could not stop {p.bench_name} (pid {p.pid}): {e}")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http_get(url, timeout=2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode("utf-8", "replace")


def wait_for(what, check, proc, limit=30.0):
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


def start_sims(procs, n, args, tag="sim"):
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


def start_envoy(procs, kind, endpoints, workers, tag="envoy", render=RENDER, wasm=WASM):
    """kind: filter | nofilter (ORIGINAL_DST, client names the endpoint) | ROUND_ROBIN | LEAST_REQUEST.
    `render` and `wasm` may name another checkout's renderer and build (a candidate)."""
    d = tempfile.mkdtemp(prefix=f"{tag}-", dir=procs.workdir)
    cfg = os.path.join(d, "filter.json")
    with open(cfg, "w") as f:
        f.write("{}")
    cmd = [sys.executable, render, "--wasm", wasm, "--config", cfg, "--endpoints", ",".join(endpoints)]
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
    admin = wait_for(f"envoy ({kind})", ready, p, 60)
    listeners = json.loads(http_get(f"http://{admin}/listeners?format=json")[1])
    port = listeners["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
    return f"127.0.0.1:{port}", header


def start_sglang(procs, policy, endpoints, tag="sglang"):
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


def candidate(a):
    """(render.py, .wasm) of --candidate DIR, or None."""
    if not a.candidate:
        return None
    render = os.path.join(a.candidate, "scripts/lib/render.py")
    wasm = a.candidate_wasm or os.path.join(a.candidate, "target/wasm32-wasip1/release/epp_filter.wasm")
    for f in (render, wasm):
        if not os.path.exists(f):
            raise SystemExit(f"bench: --candidate: {f} is missing (build the candidate's filter first)")
    return render, wasm


def candidate_note(a):
    return (f"`filter (candidate)` = the filter of another checkout, `{os.path.relpath(a.candidate, ROOT)}`"
            + (f" ({a.candidate_label})" if a.candidate_label else "")
            + ", with its own `scripts/lib/render.py` bootstrap and its default configuration.")


def loadgen(args, label, limit):
    """Runs loadgen (bounded: its own --duration/--timeout, and `limit` seconds here)."""
    cmd = [LOADGEN, "--label", label] + [str(a) for a in args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    if r.returncode != 0:
        raise SystemExit(f"bench: loadgen failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr}")
    return json.loads(r.stdout)


# ---------------------------------------------------------------------------------------
# Output.

def git(*args):
    try:
        return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:
        return "?"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


def publish(title, command, load_before, body, notes, append=True):
    rev = git("rev-parse", "--short=12", "HEAD")
    # BENCHMARKS.md itself changes with every entry; anything else is worth saying.
    if git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)BENCHMARKS.md"):
        rev += " (with uncommitted changes)"
    head = [
        f"### {title}",
        "",
        f"- command: `{command}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
        f"- machine: `{platform.uname().system} {platform.uname().release} {platform.uname().machine}`, "
        f"{cpu_model()}, {os.cpu_count()} CPUs",
        f"- load average (1/5/15 min): before {load_before}, after {loadavg()}",
        f"- git revision: {rev}",
        "",
        "",
    ]
    text = "\n".join(head) + body.rstrip() + "\n"
    if notes:
        text += "\n" + "\n\n".join(n.rstrip() for n in notes) + "\n"
    print(text)
    if append:
        new = not os.path.exists(BENCHMARKS)
        with open(BENCHMARKS, "a") as f:
            if new:
                f.write(BENCHMARKS_HEADER)
            f.write("\n" + text)
        log(f"appended to {os.path.relpath(BENCHMARKS, ROOT)}")


BENCHMARKS_HEADER = """# Benchmarks

Results appended by `scripts/bench` (see `scripts/bench --help`; the method is in the
"Method" section at the top). Each entry records the command, date, machine, load
average and git revision. The machine is shared and small: compare sides of one entry
(measured in one run, alternating), not entries with each other.
"""


def fmt(v, digits=2):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def pct(sorted_values, p):
    if not sorted_values:
        return None
    import math
    i = min(len(sorted_values), max(1, math.ceil(p / 100 * len(sorted_values)))) - 1
    return sorted_values[i]


def read_records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# ---------------------------------------------------------------------------------------
# overhead

def overhead(a, procs, command):
    load_before = loadavg()
    sim_args = ["--profile", "zero", "--max-num-seqs", "256"]
    sims = start_sims(procs, a.servers, sim_args)
    sides = {}
    sides["direct"] = {"url": ",".join(sims), "extra": []}
    url, header = start_envoy(procs, "nofilter", sims, a.workers, "envoy-nofilter")
    sides["envoy"] = {"url": url, "extra": ["--destinations", ",".join(sims), "--destination-header", header]}
    url, _ = start_envoy(procs, "filter", sims, a.workers, "envoy-filter")
    sides["envoy+filter"] = {"url": url, "extra": []}
    cand = candidate(a)
    if cand:
        url, _ = start_envoy(procs, "filter", sims, a.workers, "envoy-candidate", *cand)
        sides["envoy+filter (candidate)"] = {"url": url, "extra": []}
    if not a.no_sglang:
        for pol in ("cache_aware", "round_robin"):
            sides[f"sglang {pol}"] = {"url": start_sglang(procs, pol, sims, f"sglang-{pol}"), "extra": []}
    names = list(sides)
    # The phases: latency at fixed concurrency (non-streamed, and streamed for TTFT),
    # and requests/s at saturation.
    shape = ["--groups", "8", "--prompts-per-group", "8", "--system-prompt-len", "64", "--question-len", "16",
             "--output-len", "16"]
    phases = [
        ("c1", ["--concurrency", "1", "--no-stream"]),
        ("c1-stream", ["--concurrency", "1", "--stream"]),
        ("c1-stream-newconn", ["--concurrency", "1", "--stream", "--new-connection"]),
        ("sat", ["--concurrency", str(a.saturation_concurrency), "--no-stream"]),
    ]
    results = {(s, ph): {"records": [], "ok": 0, "elapsed": 0.0, "failed": 0} for s in names for ph, _ in phases}
    rdir = tempfile.mkdtemp(prefix="records-", dir=procs.workdir)
    for rnd in range(a.rounds):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for ph, ph_args in phases:
            for s in order:
                rec = os.path.join(rdir, f"{rnd}-{ph}-{s.replace(' ', '_')}.jsonl")
                args = ["--url", sides[s]["url"], *sides[s]["extra"], *shape, *ph_args,
                        "--duration", f"{a.seconds}s", "--timeout", "10s", "--warmup", "20",
                        "--seed", str(rnd + 1), "--records", rec]
                if ph == "sat":
                    args += ["--threads", "1"]
                summary = loadgen(args, f"overhead {ph} {s}", a.seconds + 60)
                r = results[(s, ph)]
                r["records"] += [x for x in read_records(rec) if x["status"] == 200 and not x["error"]]
                r["ok"] += summary["requests"]["ok"]
                r["failed"] += summary["requests"]["failed"]
                r["elapsed"] += summary["elapsed_s"]
                log(f"round {rnd + 1}/{a.rounds} {ph:17s} {s:20s} {summary['requests_per_s']:9.1f} req/s  "
                    f"p50 {summary['latency_ms'] and summary['latency_ms']['p50']} ms")

    def lat(s, ph, key="latency_ms"):
        v = sorted(x[key] for x in results[(s, ph)]["records"] if x.get(key) is not None)
        return pct(v, 50), pct(v, 99)

    rows = []
    base = {ph: lat("direct", ph) for ph in ("c1",)}
    base_ttft = lat("direct", "c1-stream", "ttft_ms")
    base_rps = results[("direct", "sat")]["ok"] / max(results[("direct", "sat")]["elapsed"], 1e-9)
    env = lat("envoy", "c1")
    env_ttft = lat("envoy", "c1-stream", "ttft_ms")
    env_rps = results[("envoy", "sat")]["ok"] / max(results[("envoy", "sat")]["elapsed"], 1e-9)
    for s in names:
        p50, p99 = lat(s, "c1")
        t50, t99 = lat(s, "c1-stream", "ttft_ms")
        n50, _ = lat(s, "c1-stream-newconn", "ttft_ms")
        sat = results[(s, "sat")]
        rps = sat["ok"] / max(sat["elapsed"], 1e-9)
        failed = sum(results[(s, ph)]["failed"] for ph, _ in phases)
        rows.append([
            s, fmt(p50, 3), fmt(p99, 3),
            fmt(p50 - base["c1"][0], 3) if p50 is not None else "–",
            fmt(p99 - base["c1"][1], 3) if p99 is not None else "–",
            fmt(t50, 3), fmt(t99, 3), fmt(n50, 3),
            f"{rps:.0f}", f"{rps / base_rps:.2f}" if base_rps else "–", f"{rps / env_rps:.2f}" if env_rps else "–",
            failed,
        ])
    headers = ["side", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms", "TTFT p50 ms (keep-alive)",
               "TTFT p99 ms", "TTFT p50 ms (new conn)", f"req/s at c={a.saturation_concurrency}",
               "÷ direct", "÷ envoy", "failed"]
    body = table(headers, rows)
    fp50 = lat("envoy+filter", "c1")
    ratios = []
    if env[0] and fp50[0]:
        ratios.append(f"envoy+filter ÷ envoy: p50 {fp50[0] / env[0]:.2f}×, p99 {fp50[1] / env[1]:.2f}×; "
                      f"the filter adds {fp50[0] - env[0]:.3f} ms p50, {fp50[1] - env[1]:.3f} ms p99")
    for s in names:
        if s.startswith("sglang"):
            sp = lat(s, "c1")
            if sp[0] and fp50[0]:
                ratios.append(f"{s} ÷ envoy+filter: p50 {sp[0] / fp50[0]:.2f}×, p99 {sp[1] / fp50[1]:.2f}×")
    notes = [
        f"Setup: {a.servers} × `vllm-sim {' '.join(sim_args)}`; Envoy 1.40 `--concurrency {a.workers}`; "
        f"{a.rounds} rounds × {len(phases)} phases × {len(names)} sides, {a.seconds:g} s each, sides alternating "
        "(rotated order each round), 20 warm-up requests before each measurement, percentiles over the pooled "
        "requests of all rounds. Requests: `/v1/completions`, 80-token prompts (8 groups × 8), 16 output "
        "tokens; `loadgen` keep-alive with TCP_NODELAY, one client thread.",
        "`envoy` is the same bootstrap as `envoy+filter` without the Wasm filter (ORIGINAL_DST; loadgen names "
        "the endpoint itself in `x-gateway-destination-endpoint`, round-robin). `direct` = loadgen straight to "
        "the servers, round-robin. Added = side − direct. TTFT (streamed) keep-alive vs a new connection per "
        "request. Baseline TTFT p50 direct: " + fmt(base_ttft[0], 3) + " ms, envoy: " + fmt(env_ttft[0], 3) + " ms.",
        "\n".join(f"- {r}" for r in ratios),
    ]
    if cand:
        notes.append(candidate_note(a))
    publish("Overhead: added latency and saturation throughput", command, load_before, body, notes, not a.no_append)


# ---------------------------------------------------------------------------------------
# quality

def quality(a, procs, command):
    load_before = loadavg()
    sim_args = ["--profile", "h100-llama-8b", "--max-num-seqs", str(a.max_num_seqs),
                "--num-gpu-blocks", str(a.kv_blocks)]
    steps = [float(x) for x in a.qps.split(",") if x.strip()]
    shape = ["--groups", a.groups, "--prompts-per-group", a.prompts_per_group,
             "--system-prompt-len", a.system_prompt_len, "--question-len", a.question_len,
             "--output-len", a.output_len, "--zipf", a.zipf, "--stream"]
    side_defs = [("Envoy ROUND_ROBIN", "envoy", "ROUND_ROBIN"), ("Envoy LEAST_REQUEST", "envoy", "LEAST_REQUEST"),
                 ("sglang cache_aware", "sglang", "cache_aware"), ("filter (default)", "envoy", "filter")]
    if a.no_sglang:
        side_defs = [s for s in side_defs if s[1] != "sglang"]
    cand = candidate(a)
    if cand:
        side_defs.append(("filter (candidate)", "candidate", "filter"))
    sides = {}
    for name, kind, arg in side_defs:
        sims = start_sims(procs, a.servers, sim_args, f"q-{kind}-{arg}-sim")
        if kind == "envoy":
            url, _ = start_envoy(procs, arg, sims, a.workers, f"q-envoy-{arg}")
        elif kind == "candidate":
            url, _ = start_envoy(procs, "filter", sims, a.workers, "q-envoy-candidate", *cand)
        else:
            url = start_sglang(procs, arg, sims, f"q-sglang-{arg}")
        sides[name] = {"url": url, "sims": sims}
    names = list(sides)
    # Warm-up stage: every side gets the same sequence, so caches and routers start warm.
    # The sides' stacks are independent and lightly loaded at this rate: warm them at once.
    warm = []
    for s in names:
        cmd = [LOADGEN, "--label", f"quality warmup {s}", "--url", sides[s]["url"], *shape, "--qps",
               str(steps[0]), "--duration", f"{a.warmup}s", "--timeout", "60s", "--seed", "999"]
        warm.append((s, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
    for s, p in warm:
        try:
            _, err = p.communicate(timeout=a.warmup + 120)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise SystemExit(f"bench: warm-up of {s} did not finish")
        if p.returncode != 0:
            raise SystemExit(f"bench: warm-up of {s} failed: {err}")
        log(f"warmed up {s}: {err.strip().splitlines()[-1] if err.strip() else ''}")
    results = {}
    for i, q in enumerate(steps):
        order = names[i % len(names):] + names[:i % len(names)]
        for s in order:
            summary = loadgen(["--url", sides[s]["url"], *shape, "--qps", q, "--duration", f"{a.seconds}s",
                               "--timeout", "120s", "--seed", str(i + 1),
                               "--server-metrics", ",".join(sides[s]["sims"])],
                              f"quality {q} qps {s}", a.seconds + 180)
            results[(s, q)] = summary
            log(f"{q:5.1f} qps {s:20s} TTFT p50 {summary['ttft_ms'] and summary['ttft_ms']['p50']} ms, "
                f"hit rate {summary['prefix_cache_hit_rate']}")
    rows = []
    for q in steps:
        for s in names:
            r = results[(s, q)]
            t, itl = r["ttft_ms"] or {}, r["itl_ms"] or {}
            shares = []
            for addr in sides[s]["sims"]:
                m = r["server_metrics"].get(addr, {})
                shares.append(f"{100 * m.get('share', 0):.0f}")
            rows.append([f"{q:g}", s, fmt(t.get("p50"), 0), fmt(t.get("p90"), 0), fmt(t.get("p99"), 0),
                         fmt(itl.get("p50"), 1), fmt(itl.get("p90"), 1), fmt(r["output_tokens_per_s"], 0),
                         fmt(r["prefix_cache_hit_rate"] and 100 * r["prefix_cache_hit_rate"], 1),
                         "/".join(shares), f"{r['requests']['ok']}/{r['requests']['sent']}"])
    headers = ["QPS", "side", "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p90 ms",
               "output tok/s", "prefix hit % (servers)", "share per server %", "ok/sent"]
    body = table(headers, rows)
    notes = [
        f"Setup: per side, its own {a.servers} × `vllm-sim {' '.join(sim_args)}` (seeds 0..{a.servers - 1}, "
        f"identical across sides); Envoy 1.40 `--concurrency {a.workers}`; sglang-router 0.3.2 defaults. "
        f"Workload (shared prefix, tokens): {a.groups} groups × {a.prompts_per_group} prompts, system "
        f"{a.system_prompt_len}, question {a.question_len}, output {a.output_len} (ignore_eos)"
        + (f", groups drawn Zipf({a.zipf})" if float(a.zipf) > 0 else "") + ", streamed "
        f"`/v1/completions`, Poisson arrivals (same seed for every side), {a.seconds:g} s per step after a "
        f"{a.warmup:g} s warm-up at {steps[0]:g} QPS (all sides at once). Steps run in order with the sides alternating "
        "(rotated order per step). Prefix hit % = Δ`vllm:prefix_cache_hits_total` ÷ "
        "Δ`vllm:prefix_cache_queries_total` summed over the side's servers (tokens); share = "
        "Δ`vllm:request_success_total` per server.",
        f"Prefix demand {int(a.groups) * int(a.system_prompt_len)} tokens vs KV capacity "
        f"{a.kv_blocks * 16} tokens per server ({a.servers * a.kv_blocks * 16} in the pool).",
        "Virtual-time runs at larger scale (16+ servers, higher QPS) through host-sim: not run, host-sim is "
        "not available yet.",
    ]
    if cand:
        notes.append(candidate_note(a))
    publish("Routing quality: shared-prefix workload, real time through Envoy", command, load_before, body, notes,
            not a.no_append)


# ---------------------------------------------------------------------------------------
# sched

def parse_criterion(out):
    """[name, median estimate, throughput, interval] rows from criterion's console output."""
    rows = []
    # criterion: "name\n    time:   [low mid high]" or "name   time:   [...]"; optional "thrpt:" line.
    pending = None
    for line in out.splitlines():
        m = re.match(r"^(\S.*?)\s+time:\s+\[(.+?)\]", line)
        if m:
            name, times = m.group(1).strip(), m.group(2).split()
        else:
            m2 = re.match(r"^\s+time:\s+\[(.+?)\]", line)
            if m2 and pending:
                name, times = pending, m2.group(1).split()
            else:
                if line and not line.startswith(" ") and "time:" not in line and not line.startswith(
                        ("Benchmarking", "Found", "Running", "Gnuplot", "Compiling", "Finished", "Warning")):
                    pending = line.strip()
                m3 = re.match(r"^\s+thrpt:\s+\[(.+?)\]", line)
                if m3 and rows:
                    t = m3.group(1).split()
                    rows[-1][2] = f"{t[2]} {t[3]}" if len(t) >= 4 else m3.group(1)
                continue
        mid = f"{times[2]} {times[3]}" if len(times) >= 6 else " ".join(times)
        rows.append([name, mid, "", f"[{' '.join(times)}]"])
        pending = None
    return rows


def sched(a, procs, command):
    load_before = loadavg()
    benches = os.path.join(ROOT, "filter/benches")
    has = os.path.isdir(benches) and any(n.endswith(".rs") for n in os.listdir(benches))
    if not has:
        try:
            has = "[[bench]]" in open(os.path.join(ROOT, "filter/Cargo.toml")).read()
        except OSError:
            has = False
    notes = []
    # The same pick inside Envoy's V8 VM: the filter's own scheduling histogram, read from a
    # real Envoy at 8/64/512 endpoints (filter/benches/in_envoy.py).
    in_vm = os.path.join(ROOT, "filter/benches/in_envoy.py")
    if os.path.exists(in_vm):
        vm_cmd = [sys.executable, in_vm, "--sizes", "8,64,512"]
        log(" ".join(vm_cmd))
        try:
            vr = subprocess.run(vm_cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
            vm_out = (vr.stdout or "").strip()
            if vr.returncode == 0 and vm_out:
                notes.append("The pick inside Envoy's V8 VM (`python3 filter/benches/in_envoy.py "
                             "--sizes 8,64,512`):\n\n```\n" + vm_out + "\n```")
            else:
                notes.append("In-VM pick: `in_envoy.py` failed:\n\n```\n"
                             + ((vr.stdout or "") + (vr.stderr or ""))[-1500:] + "\n```")
        except subprocess.TimeoutExpired:
            notes.append("In-VM pick: `in_envoy.py` did not finish within 300 s.")
    if not has:
        body = "No criterion benchmarks in `filter/` at this revision (`filter/benches/` is absent); nothing run."
        publish("Scheduling cost (criterion)", command, load_before, body, notes, not a.no_append)
        return
    cmd = ["cargo", "bench", "-p", "filter", "--bench", "*", "--", "--warm-up-time", str(a.warm_up_time),
           "--measurement-time", str(a.measurement_time)]
    log(" ".join(cmd))
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=a.limit)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"bench: cargo bench did not finish within {a.limit} s")
    out = r.stdout + "\n" + r.stderr
    if r.returncode != 0:
        raise SystemExit(f"bench: cargo bench failed:\n{out[-4000:]}")
    rows = parse_criterion(out)
    headers = ["benchmark", "time (median estimate)", "throughput", "95 % interval"]
    if rows and not any(r[2] for r in rows):
        headers.pop(2)
        rows = [[r[0], r[1], r[3]] for r in rows]
    body = table(headers, rows) if rows else (
        "cargo bench ran but printed no criterion results:\n\n```\n" + out[-2000:] + "\n```")
    notes.insert(0, f"`{' '.join(cmd)}` (bounded: {a.limit} s).")
    publish("Scheduling cost (criterion)", command, load_before, body, notes, not a.no_append)


# ---------------------------------------------------------------------------------------
# overload (flow control)

OBJECTIVES = [("premium", 100), ("standard", 0), ("best-effort", -10)]


def overload_config(a, flow):
    """The filter's configuration for the overload run; flow=False drops only the
    `flowControl` feature gate (the filter then applies the reference's legacy admission)."""
    cfg = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "round-robin-fairness-policy"},
            {"type": "concurrency-detector",
             "parameters": {"maxConcurrency": a.max_num_seqs, "concurrencyMode": "requests"}},
        ],
        "saturationDetector": {"pluginRef": "concurrency-detector"},
        "flowControl": {
            "maxRequests": "1k",
            "defaultRequestTTL": f"{a.ttl:g}s",
            "priorityBands": [
                {"priority": 100, "maxRequests": str(a.band_limits[0]), "fairnessPolicyRef": "round-robin-fairness-policy"},
                {"priority": 0, "maxRequests": str(a.band_limits[1]), "fairnessPolicyRef": "round-robin-fairness-policy"},
                {"priority": -10, "maxRequests": str(a.band_limits[2]), "fairnessPolicyRef": "round-robin-fairness-policy"},
            ],
        },
        "pool": {"objectives": [{"name": n, "priority": p} for n, p in OBJECTIVES]},
    }
    if flow:
        cfg["featureGates"] = ["flowControl"]
    return cfg


def write_config(procs, cfg, tag):
    d = tempfile.mkdtemp(prefix=f"{tag}-cfg-", dir=procs.workdir)
    path = os.path.join(d, "filter.json")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    return path


def prom_sum(text, name, label_filter=None):
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


class Sampler:
    """Samples each server's vllm:num_requests_{waiting,running} (and, with an admin
    address, the gateway's flow-control queue size) every `period` s in a thread."""

    def __init__(self, sims, admin, period):
        import threading
        self.sims, self.admin, self.period = sims, admin, period
        self.samples = []  # (t, waiting total, running total, gateway queued or None, [waiting per server])
        self.stop_ev = threading.Event()
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self):
        while not self.stop_ev.is_set():
            t = time.monotonic() - self.t0
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
            self.samples.append((t, sum(x for x in per if x is not None), run, q, per))
            self.stop_ev.wait(self.period)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        self.thread.join(timeout=10)


def hist_buckets(text, name):
    """Cumulative bucket counts {le: count} summed over label sets, from Prometheus text."""
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
    return ", ".join(f"{'+Inf' if k == float('inf') else f'{k:g}'}: {v:.0f}" for k, v in sorted(h.items()))


def add_buckets(acc, b):
    for k, v in b.items():
        acc[k] = acc.get(k, 0.0) + v


DISPATCH_HIST = "inference_extension_flow_control_dispatch_cycle_duration_seconds"


def overload_side(a, procs, flow, qps, rnd, rdir):
    """One side of one round: fresh servers and a fresh Envoy, the tenants' loadgens at
    once, the samplers; returns the records, the samples and the dispatch histogram."""
    side = "on" if flow else "off"
    tag = f"ov{rnd}-{side}"
    sim_args = ["--profile", "h100-llama-8b", "--max-num-seqs", str(a.max_num_seqs)]
    sims = start_sims(procs, a.servers, sim_args, f"{tag}-sim")
    cfg = write_config(procs, overload_config(a, flow), tag)
    url, _, admin, envoy = start_envoy_cfg(procs, cfg, sims, a.workers, f"{tag}-envoy")
    weights = a.tenant_weights
    total_w = sum(weights)
    runs = []
    with Sampler(sims, admin if flow else None, a.sample_period) as sampler:
        t_start = time.monotonic()
        for i, w in enumerate(weights):
            rec = os.path.join(rdir, f"{tag}-tenant{i}.jsonl")
            q = qps * w / total_w
            cmd = [LOADGEN, "--label", f"overload {side} tenant-{i}", "--url", url, *overload_shape(a),
                   "--qps", f"{q:.3f}", "--duration", f"{a.seconds:g}s", "--timeout", f"{a.timeout:g}s",
                   "--seed", str(100 * (rnd + 1) + i), "--priorities", ",".join(n for n, _ in OBJECTIVES),
                   "--header", f"x-gateway-inference-fairness-id:tenant-{i}", "--records", rec]
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            runs.append((i, p, rec, time.monotonic() - t_start))
        for i, p, rec, _ in runs:
            try:
                out, err = p.communicate(timeout=a.seconds + a.timeout + 60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
                raise SystemExit(f"bench: loadgen tenant-{i} ({side}) did not finish")
            if p.returncode != 0:
                raise SystemExit(f"bench: loadgen tenant-{i} ({side}) failed: {err[-2000:]}")
        t_end = time.monotonic() - t_start
    hist = {}
    if flow:
        # Envoy flushes stats every second: wait for the last cycles to be exported.
        time.sleep(1.5)
        hist = hist_buckets(http_get(f"http://{admin}/stats/prometheus", 5.0)[1], DISPATCH_HIST)
    for p in (envoy,):
        procs.stop(p)
    for p in [x for x in list(procs.procs) if x.bench_name.startswith(f"{tag}-sim")]:
        procs.stop(p)
    records = []
    for i, _, rec, offset in runs:
        for r in read_records(rec):
            r["tenant"] = f"tenant-{i}"
            r["t0"] = offset  # the loadgen's start, from the side's start
            records.append(r)
    # Samples relative to the first loadgen start (the sampler started just before).
    samples = sampler.samples
    log(f"round {rnd + 1} flow control {side}: {len(records)} requests, "
        f"{sum(1 for r in records if r['status'] == 200)} ok, {t_end:.0f} s")
    return records, samples, hist


def overload_shape(a):
    return ["--groups", str(a.groups), "--prompts-per-group", "16", "--system-prompt-len", str(a.system_prompt_len),
            "--question-len", str(a.question_len), "--output-len", str(a.output_len), "--stream"]


def start_envoy_cfg(procs, cfg_path, endpoints, workers, tag):
    """Envoy with the filter and the given filter configuration; (url, header, admin, proc)."""
    d = tempfile.mkdtemp(prefix=f"{tag}-", dir=procs.workdir)
    text = subprocess.run([sys.executable, RENDER, "--wasm", WASM, "--config", cfg_path, "--endpoints",
                           ",".join(endpoints)], check=True, capture_output=True, text=True).stdout
    boot = os.path.join(d, "bootstrap.yaml")
    with open(boot, "w") as f:
        f.write(text)
    admin_path = os.path.join(d, "admin-address")
    p = procs.start(tag, [ENVOY, "-c", boot, "--concurrency", str(workers), "--disable-hot-restart",
                          "--admin-address-path", admin_path, "-l", "warning",
                          "--component-log-level", "wasm:warning", "--log-path", os.path.join(d, "envoy.log")])

    def ready():
        admin = open(admin_path).read().strip()
        if admin and http_get(f"http://{admin}/ready")[1].strip() == "LIVE":
            return admin
    admin = wait_for(f"envoy ({tag})", ready, p, 60)
    listeners = json.loads(http_get(f"http://{admin}/listeners?format=json")[1])
    port = listeners["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
    return f"127.0.0.1:{port}", None, admin, p


def calibrate(a, procs):
    """Completed requests/s of a fresh pool driven directly at servers × max-num-seqs in flight."""
    sims = start_sims(procs, a.servers, ["--profile", "h100-llama-8b", "--max-num-seqs", str(a.max_num_seqs)],
                      "cal-sim")
    s = loadgen(["--url", ",".join(sims), *overload_shape(a), "--concurrency", a.servers * a.max_num_seqs,
                 "--duration", f"{a.calibrate:g}s", "--timeout", "60s", "--seed", "7"],
                "overload calibration", a.calibrate + 90)
    for p in [x for x in list(procs.procs) if x.bench_name.startswith("cal-sim")]:
        procs.stop(p)
    return s["requests"]["ok"] / max(s["elapsed_s"], 1e-9), s


def overload(a, procs, command):
    load_before = loadavg()
    cap, cal = calibrate(a, procs)
    qps = a.qps_overload or a.factor * cap
    log(f"pool capacity ≈ {cap:.1f} req/s (closed loop at {a.servers * a.max_num_seqs}); offered {qps:.1f} QPS")
    rdir = tempfile.mkdtemp(prefix="records-", dir=procs.workdir)
    data = {True: {"records": [], "samples": [], "hist": {}}, False: {"records": [], "samples": [], "hist": {}}}
    for rnd in range(a.rounds):
        order = [True, False] if rnd % 2 == 0 else [False, True]
        for flow in order:
            recs, samples, hist = overload_side(a, procs, flow, qps, rnd, rdir)
            data[flow]["records"] += recs
            data[flow]["samples"] += [s for s in samples if s[0] <= a.seconds]
            add_buckets(data[flow]["hist"], hist)
            if a.cooldown:
                time.sleep(a.cooldown)
    classes = [n for n, _ in OBJECTIVES]
    tenants = [f"tenant-{i}" for i in range(len(a.tenant_weights))]
    rows = []
    for flow in (True, False):
        recs = data[flow]["records"]
        for c in classes:
            rc = [r for r in recs if r.get("objective") == c]
            ok = [r for r in rc if r["status"] == 200 and not r["error"]]
            t = sorted(r["ttft_ms"] for r in ok if r.get("ttft_ms") is not None)
            n429 = sum(1 for r in rc if r["status"] == 429)
            n503 = sum(1 for r in rc if r["status"] == 503)
            split = lambda st: "/".join(str(sum(1 for r in rc if r["status"] == st and r["tenant"] == tn))
                                        for tn in tenants)
            other = len(rc) - len(ok) - n429 - n503
            # Completions while backlogged: finished within [warm-up, end of the arrivals].
            done = [r for r in ok if a.warm <= r["t0"] + r["sent_ms"] / 1000 + r["latency_ms"] / 1000 <= a.seconds]
            shares = []
            for tn in tenants:
                n = sum(1 for r in done if r["tenant"] == tn)
                shares.append(f"{100 * n / len(done):.0f}" if done else "–")
            per_tenant = []
            for tn in tenants:
                tt = sorted(r["ttft_ms"] for r in ok if r["tenant"] == tn and r.get("ttft_ms") is not None)
                per_tenant.append(fmt(pct(tt, 50) and pct(tt, 50) / 1000, 2))
            rows.append(["on" if flow else "off", c, f"{len(ok)}/{len(rc)}",
                         fmt(pct(t, 50) and pct(t, 50) / 1000, 2), fmt(pct(t, 90) and pct(t, 90) / 1000, 2),
                         fmt(pct(t, 99) and pct(t, 99) / 1000, 2), "/".join(per_tenant), "/".join(shares),
                         f"{n429} ({split(429)})", f"{n503} ({split(503)})", other])
    headers = ["flow control", "class (priority)", "ok/sent", "TTFT p50 s", "TTFT p90 s", "TTFT p99 s",
               "TTFT p50 s per tenant",
               "completions per tenant % (" + "/".join(str(w) for w in a.tenant_weights) + " offered)",
               "429 (per tenant)", "503 (per tenant)", "other errors"]
    body = table(headers, rows)
    qrows = []
    for flow in (True, False):
        sm = [s for s in data[flow]["samples"] if s[0] >= a.warm]
        w = sorted(s[1] for s in sm)
        run = [s[2] for s in sm]
        g = sorted(s[3] for s in sm if s[3] is not None)
        qrows.append(["on" if flow else "off", len(sm), fmt(statistics.mean(w), 1) if w else "–",
                      fmt(pct(w, 50), 0), fmt(pct(w, 99), 0), fmt(w[-1] if w else None, 0),
                      fmt(statistics.mean(run), 1) if run else "–",
                      (fmt(statistics.mean(g), 0) + " / " + fmt(g[-1], 0)) if g else "–"])
    body += "\n\n" + table(["flow control", "samples", "server queue (Σ waiting) mean", "p50", "p99", "max",
                            "Σ running mean", "gateway queue mean / max"], qrows)
    # Server queue over time (flow control on vs off), in 5-s buckets of the arrival window.
    trows = []
    for t0 in range(0, int(a.seconds), 5):
        row = [f"{t0}–{t0 + 5}"]
        for flow in (True, False):
            sm = [s for s in data[flow]["samples"] if t0 <= s[0] < t0 + 5]
            row.append(fmt(statistics.mean(s[1] for s in sm), 1) if sm else "–")
            if flow:
                g = [s[3] for s in sm if s[3] is not None]
                row.append(fmt(statistics.mean(g), 0) if g else "–")
        trows.append(row)
    body += "\n\n" + table(["s into the run", "server Σ waiting (on)", "gateway queued (on)",
                            "server Σ waiting (off)"], trows)
    h = data[True]["hist"]
    p50, p99 = hist_quantile(h, 0.5), hist_quantile(h, 0.99)
    n = max(h.values()) if h else 0
    notes = [
        f"Setup: per side and round, fresh {a.servers} × `vllm-sim --profile h100-llama-8b --max-num-seqs "
        f"{a.max_num_seqs}` and a fresh Envoy 1.40 `--concurrency {a.workers}` with the filter. Capacity "
        f"measured first on its own fresh pool (closed loop of {a.servers * a.max_num_seqs} straight to the "
        f"servers, {a.calibrate:g} s): {cap:.1f} req/s; offered {qps:.1f} QPS ({qps / cap:.1f}×), Poisson, "
        f"for {a.seconds:g} s per side, {a.rounds} round(s), sides alternating (on, off / off, on). "
        f"Tenants tenant-0..{len(a.tenant_weights) - 1} send {'/'.join(str(w) for w in a.tenant_weights)} of "
        f"the load (one loadgen each, `x-gateway-inference-fairness-id`), each request's objective uniform over "
        f"premium (100) / standard (0) / best-effort (-10) (`x-gateway-inference-objective`). Workload: "
        f"{a.groups} groups × 16 prompts, system {a.system_prompt_len}, question {a.question_len}, output "
        f"{a.output_len} tokens, streamed `/v1/completions`; client timeout {a.timeout:g} s.",
        f"Flow control on: `featureGates: [flowControl]`, `concurrency-detector` maxConcurrency "
        f"{a.max_num_seqs} per server (= `--max-num-seqs`), `round-robin-fairness-policy` in every band, "
        f"`defaultRequestTTL` {a.ttl:g} s, band `maxRequests` {a.band_limits[0]}/{a.band_limits[1]}/"
        f"{a.band_limits[2]} (premium/standard/best-effort), global 1k. Off: the same configuration without "
        "the feature gate, i.e. the reference's legacy admission (best-effort = sheddable, priority < 0, is "
        "rejected with 429 while the concurrency detector reads saturated; everything else goes straight to "
        "the servers).",
        f"TTFT = send → first token, over the requests that succeeded. Completions per tenant = share of the "
        f"class's successful requests that finished between {a.warm:g} s and the end of the arrivals "
        f"({a.seconds:g} s), i.e. while the backlog existed. Server queue = Σ over the side's servers of "
        f"`vllm:num_requests_waiting`, sampled every {a.sample_period:g} s from {a.warm:g} s to the end of the "
        "arrivals; gateway queue = Σ `inference_extension_flow_control_queue_size` (Envoy admin, exported "
        "at each 1-s stats flush).",
        f"Dispatch cycle (`{DISPATCH_HIST}`, µs, the flow-control-on sides' Envoys, {n:.0f} cycles): "
        f"p50 ≈ {fmt(p50, 1)} µs, p99 ≈ {fmt(p99, 1)} µs (interpolated inside the buckets of "
        "`envoy/histogram-buckets.yaml`). Cumulative bucket counts (le µs: count): " + bucket_text(h) + ".",
    ]
    off_shed = sum(1 for r in data[False]["records"] if r.get("objective") == "best-effort" and r["status"] == 429)
    if off_shed == 0:
        notes.append("Observed: with the gate off, legacy admission rejected **no** best-effort request although "
                     "the pool was at 2× capacity: the `concurrency-detector` reads the in-flight counts that "
                     "flow control keeps, and without the gate nothing is counted, so saturation reads 0 (the "
                     "same gap the reference has, epp-semantics §3.2). The off side therefore treats all classes "
                     "alike.")
    a._dispatch = (p50, p99, n)
    publish("Overload: flow control at 2× capacity, priorities and unequal tenants", command, load_before,
            body, notes, not a.no_append)


# ---------------------------------------------------------------------------------------
# flow-control: parked memory, unsaturated overhead, dispatch cycle

FLOW_CONTROL_PY = os.path.join(ROOT, "scripts/lib/bench/flow_control.py")


def flow_control(a, procs, command):
    load_before = loadavg()
    parts = []
    for what, extra, limit in (("parked-memory", ["--n", str(a.parked)], 300), ("overhead", [], 240)):
        cmd = [sys.executable, FLOW_CONTROL_PY, what, "--workers", str(a.workers), *extra]
        log(" ".join(cmd[1:]))
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"bench: flow_control.py {what} did not finish within {limit} s")
        if r.returncode != 0:
            raise SystemExit(f"bench: flow_control.py {what} failed:\n{r.stdout}\n{r.stderr[-2000:]}")
        parts.append(r.stdout.strip())
    # Dispatch cycle duration: one flow-control-on side of the overload run (short).
    cap, _ = calibrate(a, procs)
    qps = a.factor * cap
    rdir = tempfile.mkdtemp(prefix="records-", dir=procs.workdir)
    recs, _, hist = overload_side(a, procs, True, qps, 0, rdir)
    p50, p99 = hist_quantile(hist, 0.5), hist_quantile(hist, 0.99)
    n = max(hist.values()) if hist else 0
    parts.append(table(["dispatch cycle (saturated, overload shape)", "value"], [
        ["cycles recorded", f"{n:.0f}"],
        ["p50 (from buckets)", f"{fmt(p50, 1)} µs"],
        ["p99 (from buckets)", f"{fmt(p99, 1)} µs"],
        ["requests in the run (ok)", f"{len(recs)} ({sum(1 for r in recs if r['status'] == 200)})"],
        ["cumulative bucket counts (le µs: count)", bucket_text(hist)],
    ]))
    bounds = ", ".join(f"{k:g}" for k in sorted(hist) if k != float("inf"))
    notes = [
        f"`scripts/lib/bench/flow_control.py parked-memory --n {a.parked}`: one `vllm-sim --profile zero "
        "--inter-token-latency 1s` server, a `concurrency-detector` with maxConcurrency 1 and one long request "
        f"holding the slot; {a.parked} idle connections, then {a.parked} requests parked; memory from Envoy's "
        "admin `/memory` (allocated), Envoy 1.40 `--concurrency " + str(a.workers) + "`.",
        "`flow_control.py overhead`: sequential 1-token non-streamed requests on one keep-alive connection "
        "(5 rounds × 2000, alternating), flow control on (concurrency-detector maxConcurrency 1000, never "
        "saturated) vs the filter without the gate, in front of `vllm-sim --profile zero`.",
        f"Dispatch cycle: `{DISPATCH_HIST}` (recorded in µs; buckets {bounds}) from Envoy's "
        f"`/stats/prometheus` after one flow-control-on side of the overload shape ({a.servers} × "
        f"`vllm-sim --profile h100-llama-8b --max-num-seqs {a.max_num_seqs}`, {qps:.1f} QPS = {a.factor:g}× "
        f"the measured {cap:.1f} req/s, {a.seconds:g} s, priorities and tenants as in the overload "
        "benchmark); quantiles interpolated linearly inside the bucket.",
    ]
    publish("Flow control: parked memory, unsaturated overhead, dispatch cycle", command, load_before,
            "\n\n".join(parts), notes, not a.no_append)


# ---------------------------------------------------------------------------------------

QUALITY_SIM = os.path.join(ROOT, "target/release/quality-sim")


def quality_sim(argv):
    """Routing quality in virtual time: `quality-sim` (tests/src/bin/quality-sim.rs) with
    the arguments as given; its setup line and table are published as they are."""
    command, append, rest = "scripts/bench quality-sim", True, []
    it = iter(argv)
    for arg in it:
        if arg == "--command":
            command = next(it, command)
        elif arg == "--no-append":
            append = False
        else:
            rest.append(arg)
    load_before = loadavg()
    cmd = [QUALITY_SIM, *rest]
    log(" ".join(cmd))
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"bench: quality-sim failed:\n{(r.stdout + r.stderr)[-4000:]}")
    setup, _, body = r.stdout.strip().partition("\n\n")
    notes = [
        "Setup: " + setup + ". Sides: the real filter `.wasm` (default profile; its data layer "
        "scrapes the engines' `/metrics` every 50 ms through the `epp-metrics` cluster) in host-sim's "
        "simulated Envoy; host-sim's models of Envoy's `ROUND_ROBIN` (per worker) and `LEAST_REQUEST` "
        "(two random choices, active requests) and of sglang-router 0.3.2 `cache_aware` (character radix "
        "tree, cache threshold 0.3, balance thresholds 64 / 1.5) in the same simulated Envoy without the "
        "filter. Each (side, QPS) is a fresh world fed the identical seeded requests (`loadgen`'s "
        "shared-prefix workload) and Poisson arrival times; times are virtual (the engines' calibrated "
        "latency), so the table is exactly reproducible with the same arguments and revision; `wall s` is "
        "the real time one run took. Percentiles over the requests sent in the measured window; hit rate "
        "= the servers' `prefix_cache_hits / prefix_cache_queries` deltas over that window; waiting = "
        "`vllm:num_requests_waiting` summed over the pool, sampled every 0.5 s.",
    ]
    publish("Routing quality in virtual time (host-sim)", command, load_before, body, notes, append)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "quality-sim":
        return quality_sim(sys.argv[2:])
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["overhead", "quality", "sched", "overload", "flow-control"])
    p.add_argument("--command", default="scripts/bench")
    p.add_argument("--no-append", action="store_true")
    p.add_argument("--no-sglang", action="store_true")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--candidate", help="another checkout: adds a side with its filter (its render.py and .wasm)")
    p.add_argument("--candidate-label", default="", help="what the candidate is (recorded with the table)")
    p.add_argument("--candidate-wasm", help="the candidate's .wasm [DIR/target/wasm32-wasip1/release/epp_filter.wasm]")
    p.add_argument("--servers", type=int)
    p.add_argument("--seconds", type=float)
    # overhead
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--saturation-concurrency", type=int, default=32)
    # quality
    p.add_argument("--qps", default="4,8,12")
    p.add_argument("--groups", default="32")
    p.add_argument("--prompts-per-group", default="16")
    p.add_argument("--system-prompt-len", default="1024")
    p.add_argument("--question-len", default="128")
    p.add_argument("--output-len", default="64")
    p.add_argument("--zipf", default="0")
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--kv-blocks", type=int, default=1024)
    p.add_argument("--warmup", type=float, default=15)
    # sched
    p.add_argument("--warm-up-time", type=float, default=1)
    p.add_argument("--measurement-time", type=float, default=2)
    p.add_argument("--limit", type=int, default=900)
    # overload, flow-control
    p.add_argument("--factor", type=float, default=2.0, help="offered load ÷ measured capacity")
    p.add_argument("--qps-overload", type=float, default=None, help="offered QPS (instead of --factor)")
    p.add_argument("--tenant-weights", default="10,1,1")
    p.add_argument("--ttl", type=float, default=15)
    p.add_argument("--band-limits", default="500,60,30")
    p.add_argument("--timeout", type=float, default=45)
    p.add_argument("--calibrate", type=float, default=10)
    p.add_argument("--warm", type=float, default=5)
    p.add_argument("--sample-period", type=float, default=0.5)
    p.add_argument("--cooldown", type=float, default=0)
    p.add_argument("--parked", type=int, default=10000)
    a = p.parse_args()
    if a.servers is None:
        a.servers = 2 if a.what in ("overhead", "overload", "flow-control") else 4
    if a.seconds is None:
        a.seconds = {"overhead": 3, "overload": 30}.get(a.what, 20)
    a.tenant_weights = [int(x) for x in a.tenant_weights.split(",") if x.strip()]
    a.band_limits = [int(x) for x in a.band_limits.split(",")]
    if a.what in ("overload", "flow-control"):
        # The overload shape's defaults (quality's are larger prompts).
        for k, v in (("groups", "16"), ("system_prompt_len", "256"), ("question_len", "64"), ("output_len", "32")):
            if getattr(a, k) == p.get_default(k):
                setattr(a, k, v)
    workdir = os.path.join(ROOT, ".run", f"bench-{os.getpid()}")
    os.makedirs(workdir, exist_ok=True)
    procs = Procs(workdir)

    def on_signal(sig, _frame):
        raise SystemExit(f"bench: signal {sig}")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        {"overhead": overhead, "quality": quality, "sched": sched, "overload": overload,
         "flow-control": flow_control}[a.what](a, procs, a.command)
    finally:
        procs.stop_all()
        log(f"stopped what it started; logs in {os.path.relpath(workdir, ROOT)}")


if __name__ == "__main__":
    main()
