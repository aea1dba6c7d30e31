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
"""
import argparse
import os
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
    return p.parse_args(argv)


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
    for rnd in range(o.rounds):
        order = sides[rnd % len(sides):] + sides[:rnd % len(sides)]
        for name, envoy, client_routed in order:
            routing = ["--destinations", ",".join(sims), "--destination-header", envoy.header] if client_routed else []
            base = ["--url", envoy.url, *routing, *shape(o), "--no-stream", "--concurrency", str(o.concurrency),
                    "--timeout", "10s", "--seed", str(rnd + 1)]
            loadgen(base + ["--requests", "500"], f"ladder warm-up {name}", 120)
            before = cpu_seconds(envoy.proc.pid)
            s = loadgen(base + ["--requests", str(o.requests)], f"ladder {name}", 600)
            used = cpu_seconds(envoy.proc.pid) - before
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
    return Result("Ladder: Envoy CPU per request by stage of the filter", body, notes)
