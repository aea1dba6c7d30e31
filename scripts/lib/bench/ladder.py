"""scripts/bench ladder: what each stage of the filter costs inside a real Envoy, as Envoy
CPU time per request (user + system time of the Envoy process over a fixed number of
requests, from /proc), which hardly depends on what else the machine runs, unlike
latency and throughput.

Sides, each its own Envoy (same bootstrap, `--concurrency 2`) in front of the same
`vllm-sim --profile zero` servers, measured in turns over several rounds:
- `envoy`: no filter (the client names the endpoint);
- `callbacks only`: the filter built with `--features ladder-continue`: every callback it
  exports returns at once (the client names the endpoint): what entering the VM costs;
- `headers + body parsed`: `--features ladder-parse`: the request's headers handled, its
  body buffered, read and parsed, then sent to a configured endpoint by turns (no
  scheduler, no shared data, no metrics, nothing on the response);
- `filter (default)`: this build, default configuration;
- with --candidate-wasm, another build of the whole filter.
The feature builds go to target/ladder-*/ (benchmark only, never shipped).

With --perf, each side's measured requests of the last round are also sampled with
`perf record` (Debian's linux-perf), and the CPU is split by where it ran: the module's
code compiled by V8 (perf's `[JIT]`), Envoy's binary (Envoy with V8's runtime and the
host functions; stripped, so not by function), the kernel, libc.
"""
import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess

from common import ROOT, Result, loadgen, log, start_envoy, start_sims, table
from overhead import SHAPE, SIM_ARGS, cpu_seconds

LADDER = [("callbacks only", "ladder-continue"), ("headers + body parsed", "ladder-parse")]


def options(argv):
    p = argparse.ArgumentParser(prog="scripts/bench ladder")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=20000, help="measured requests per side and round [20000]")
    p.add_argument("--concurrency", type=int, default=8, help="closed loop [8]")
    p.add_argument("--candidate-wasm", default=None)
    p.add_argument("--candidate-label", default="candidate")
    p.add_argument("--prompt-tokens", type=int, default=0,
                   help="prompts of about this many tokens, nearly all distinct (1,000 groups x 1,000 "
                        "questions), instead of the 80-token prompts of 8 x 8 [0 = 80-token]")
    p.add_argument("--perf", action="store_true",
                   help="split each side's CPU by where it ran (module code, Envoy, kernel) with perf record")
    o = p.parse_args(argv)
    if o.perf and not shutil.which("perf"):
        raise SystemExit("bench: --perf needs perf (Debian: apt-get install linux-perf)")
    return o


# Where a sample ran, by perf's DSO name.
PLACES = [("module (V8 JIT)", lambda dso: dso.startswith("[JIT]")), ("Envoy", lambda dso: dso == "envoy"),
          ("kernel", lambda dso: dso.startswith("[kernel")), ("libc", lambda dso: dso.startswith("libc"))]


def perf_start(pid, path):
    return subprocess.Popen(["perf", "record", "-F", "2999", "-o", path, "-p", str(pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def perf_split(perf, path):
    """Shares (0..1) of the samples by place, from `perf report --sort dso`."""
    perf.send_signal(signal.SIGINT)
    perf.wait(120)
    text = subprocess.run(["perf", "report", "-i", path, "--sort", "dso", "--stdio", "-g", "none"],
                          capture_output=True, text=True, check=True).stdout
    shares = {place: 0.0 for place, _ in PLACES}
    shares["other"] = 0.0
    for m in re.finditer(r"^\s+([\d.]+)%\s+(.+?)\s*$", text, re.M):
        share, dso = float(m.group(1)) / 100, m.group(2)
        place = next((name for name, match in PLACES if match(dso)), "other")
        shares[place] += share
    return shares


def shape(o):
    """loadgen's workload: the overhead bench's, or long, nearly distinct prompts."""
    if o.prompt_tokens <= 0:
        return SHAPE
    return ["--groups", "1000", "--prompts-per-group", "1000", "--system-prompt-len", "64",
            "--question-len", str(max(o.prompt_tokens - 64, 1)), "--output-len", "16"]


def build(feature):
    """The filter built with `feature` (its own target dir); the .wasm's path."""
    target = os.path.join(ROOT, "target", feature)
    log(f"building the filter with --features {feature}")
    subprocess.run(["cargo", "build", "--quiet", "--release", "-p", "filter", "--lib", "--target",
                    "wasm32-wasip1", "--features", feature, "--target-dir", target], cwd=ROOT, check=True)
    return os.path.join(target, "wasm32-wasip1/release/epp_filter.wasm")


def run(o, procs):
    wasms = [(name, build(feature), feature == "ladder-continue") for name, feature in LADDER]
    sims = start_sims(procs, 2, SIM_ARGS)
    plain = start_envoy(procs, "nofilter", sims, 2, "envoy-nofilter")
    sides = [("envoy", plain, True)]
    for i, (name, wasm, client_routed) in enumerate(wasms):
        sides.append((name, start_envoy(procs, "filter", sims, 2, f"envoy-ladder{i}", wasm=wasm), client_routed))
    sides.append(("filter (default)", start_envoy(procs, "filter", sims, 2, "envoy-filter"), False))
    if o.candidate_wasm:
        e = start_envoy(procs, "filter", sims, 2, "envoy-candidate", wasm=o.candidate_wasm)
        sides.append((f"filter ({o.candidate_label})", e, False))
    cpu = {name: [] for name, _, _ in sides}
    rps = {name: [] for name, _, _ in sides}
    split = {}
    for rnd in range(o.rounds):
        order = sides[rnd % len(sides):] + sides[:rnd % len(sides)]
        for name, envoy, client_routed in order:
            routing = ["--destinations", ",".join(sims), "--destination-header", envoy.header] if client_routed else []
            base = ["--url", envoy.url, *routing, *shape(o), "--no-stream", "--concurrency", str(o.concurrency),
                    "--timeout", "10s", "--seed", str(rnd + 1)]
            loadgen(base + ["--requests", "500"], f"ladder warm-up {name}", 120)
            sample = o.perf and rnd == o.rounds - 1
            if sample:
                path = os.path.join(procs.workdir, f"perf-{len(split)}.data")
                perf = perf_start(envoy.proc.pid, path)
            before = cpu_seconds(envoy.proc.pid)
            s = loadgen(base + ["--requests", str(o.requests)], f"ladder {name}", 600)
            used = cpu_seconds(envoy.proc.pid) - before
            if sample:
                split[name] = (perf_split(perf, path), used / max(s["requests"]["ok"], 1))
            ok = s["requests"]["ok"]
            if ok < o.requests or s["requests"]["failed"]:
                raise SystemExit(f"bench: ladder side {name}: {ok} of {o.requests} requests succeeded")
            cpu[name].append(1e6 * used / ok)
            rps[name].append(s["requests_per_s"])
            log(f"round {rnd + 1}/{o.rounds} {name:24s} {1e6 * used / ok:7.1f} µs/request {s['requests_per_s']:8.0f} req/s")
    base = statistics.median(cpu["envoy"])
    rows, prev = [], base
    for name, _, _ in sides:
        med = statistics.median(cpu[name])
        rows.append([name, f"{med:.1f}", f"{min(cpu[name]):.1f}–{max(cpu[name]):.1f}",
                     "–" if name == "envoy" else f"{med - base:+.1f}",
                     "–" if name == "envoy" else f"{med - prev:+.1f}",
                     f"{statistics.median(rps[name]):.0f}"])
        prev = med
    body = table(["side", "Envoy CPU µs/request (median)", "range over rounds", "added to plain Envoy",
                  "added to the previous row", f"req/s at c={o.concurrency} (median)"], rows)
    notes = [
        f"Setup: 2 × `vllm-sim {' '.join(SIM_ARGS)}`; Envoy 1.40 `--concurrency 2` per side; {o.rounds} rounds, "
        f"sides in turns (rotated each round); per side and round 500 warm-up requests then {o.requests:,} "
        f"measured, closed loop of {o.concurrency}, `/v1/completions` with "
        + (f"prompts of about {o.prompt_tokens} tokens (1,000 groups × 1,000 questions: nearly all distinct)"
           if o.prompt_tokens > 0 else "80-token prompts") + ", 16 output tokens, "
        "not streamed. CPU: the Envoy process's user + system time over the measured requests (/proc/PID/stat, "
        "all its threads), divided by them. Requests/s share the machine with the client and the servers.",
        "Stages: `callbacks only` = `--features ladder-continue` (every exported callback returns at once; the "
        "client names the endpoint as for plain Envoy); `headers + body parsed` = `--features ladder-parse` "
        "(headers classified and stripped, body buffered, read and parsed, one destination header set); "
        "`filter (default)` = this build with `{}`.",
    ]
    if split:
        places = [place for place, _ in PLACES] + ["other"]
        rows = [[name, f"{1e6 * per:.1f}", *(f"{1e6 * per * shares[p]:.1f}" for p in places)]
                for name, (shares, per) in split.items()]
        body += "\n\n" + table(["side (last round, sampled)", "Envoy CPU µs/request",
                                 *(f"{p} µs" for p in places)], rows)
        notes.append("Split (--perf): `perf record -F 2999 -p ENVOY` over the last round's measured requests, "
                     "`perf report --sort dso`: each place's share of the samples times that round's CPU per "
                     "request. `module (V8 JIT)` is the Wasm code V8 compiled (the filter's own instructions); "
                     "`Envoy` is the Envoy binary, V8's runtime and the host functions included.")
    return Result("Ladder: Envoy CPU per request by stage of the filter", body, notes)
