"""scripts/bench prices: what one crossing of the VM boundary costs in Envoy's V8, by kind
of host call: a bare module (price_probe/, no SDK) makes N calls of one kind in its
request-headers callback; Envoy's CPU per request (user + system time from /proc, as
ladder.py) minus the same module making none, divided by N, is the price of one call.

Sides, each its own Envoy (`--concurrency 2`) in front of the same `vllm-sim --profile zero`
servers, the client naming the endpoint, measured in turns over several rounds: plain
Envoy, the probe making no call (what a module with three callbacks costs), then one
side per kind of call. The probe builds into target/price-probe/ (benchmark only).

With `--stages`, instead of host calls: the steps any filter that routes on the request body
must take, one side each (the probe built with its `body` feature, target/price-probe-body/):
the body callback exported and returning at once, the headers paused until the whole body is
buffered, the body read, one request header set from the body callback.
"""
import argparse
import json
import os
import statistics
import subprocess

from common import ROOT, Result, loadgen, log, start_envoy, start_sims, table
from overhead import SHAPE, SIM_ARGS, cpu_seconds

CALLS = [
    ("clock", "proxy_get_current_time_nanoseconds"),
    ("counter", "proxy_increment_metric"),
    ("histogram", "proxy_record_metric (a histogram)"),
    ("header-value", "proxy_get_header_map_value (`:path`; Envoy enters the VM to allocate)"),
    ("header-pairs", "proxy_get_header_map_pairs (every request header; allocates)"),
    ("header-replace", "proxy_replace_header_map_value"),
    ("header-remove", "proxy_remove_header_map_value (an absent header)"),
    ("shared-get", "proxy_get_shared_data (700 bytes; allocates)"),
    ("shared-set", "proxy_set_shared_data (700 bytes, no CAS)"),
    ("property", "proxy_get_property (`request.path`; allocates)"),
]


def options(argv):
    p = argparse.ArgumentParser(prog="scripts/bench prices")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=20000, help="measured requests per side and round [20000]")
    p.add_argument("--calls", type=int, default=40, help="host calls per request on each probe side [40]")
    p.add_argument("--concurrency", type=int, default=8, help="closed loop [8]")
    p.add_argument("--stages", action="store_true",
                   help="price the steps of reading the request body instead of host calls")
    return p.parse_args(argv)


STAGES = [
    ("body callback", "continue", "the request-body callback exported, returning at once"),
    ("pause", "pause", "request headers wait until the whole body is buffered (not read)"),
    ("read", "read", "and the body read at its end (`proxy_get_buffer_bytes`)"),
    ("set", "set", "and one request header set from the body callback"),
]


def build(body=False):
    """The probe module's path (built in its own target dir; `body`: the body callback too)."""
    target = os.path.join(ROOT, "target", "price-probe-body" if body else "price-probe")
    crate = os.path.join(ROOT, "scripts", "lib", "bench", "price_probe")
    log("building the price probe" + (" (body)" if body else ""))
    subprocess.run(["cargo", "build", "--quiet", "--release", "--target", "wasm32-wasip1",
                    "--target-dir", target] + (["--features", "body"] if body else []), cwd=crate, check=True)
    return os.path.join(target, "wasm32-wasip1/release/price_probe.wasm")


def probe_side(procs, sims, name, wasm, settings):
    config = os.path.join(procs.workdir, f"probe-{name.replace(' ', '-')}.json")
    with open(config, "w") as f:
        json.dump(settings, f)
    return start_envoy(procs, "filter", sims, 2, f"envoy-{name.replace(' ', '-')}", wasm=wasm, config=config)


def measure(o, sims, sides):
    """Envoy CPU µs per request, per side and round (sides in turns, rotated each round)."""
    cpu = {name: [] for name, _, _ in sides}
    for rnd in range(o.rounds):
        order = sides[rnd % len(sides):] + sides[:rnd % len(sides)]
        for name, envoy, _ in order:
            base = ["--url", envoy.url, "--destinations", ",".join(sims), "--destination-header", envoy.header,
                    *SHAPE, "--no-stream", "--concurrency", str(o.concurrency), "--timeout", "10s",
                    "--seed", str(rnd + 1)]
            loadgen(base + ["--requests", "500"], f"prices warm-up {name}", 120)
            before = cpu_seconds(envoy.proc.pid)
            s = loadgen(base + ["--requests", str(o.requests)], f"prices {name}", 600)
            used = cpu_seconds(envoy.proc.pid) - before
            ok = s["requests"]["ok"]
            if ok < o.requests or s["requests"]["failed"]:
                raise SystemExit(f"bench: prices side {name}: {ok} of {o.requests} requests succeeded")
            cpu[name].append(1e6 * used / ok)
            log(f"round {rnd + 1}/{o.rounds} {name:16s} {1e6 * used / ok:7.1f} µs/request")
    return cpu


def setup(o, probe):
    """The setup paragraph both tables share; `probe` says what the probe module does."""
    return (f"Setup: 2 × `vllm-sim {' '.join(SIM_ARGS)}`; Envoy 1.40 `--concurrency 2` per side; {o.rounds} "
            f"rounds, sides in turns (rotated each round); per side and round 500 warm-up requests then "
            f"{o.requests:,} measured, closed loop of {o.concurrency}, `/v1/completions` with 80-token prompts, "
            f"not streamed, the client naming the endpoint. The probe (scripts/lib/bench/price_probe, no SDK) "
            f"{probe}. CPU: the Envoy process's user + system time over the measured requests (/proc/PID/stat), "
            "divided by them.")


def run(o, procs):
    return run_stages(o, procs) if o.stages else run_calls(o, procs)


def run_calls(o, procs):
    wasm = build()
    sims = start_sims(procs, 2, SIM_ARGS)
    sides = [("envoy", start_envoy(procs, "nofilter", sims, 2, "envoy-nofilter"), 0)]
    for name, count in [("no call", 0)] + [(call, o.calls) for call, _ in CALLS]:
        sides.append((name, probe_side(procs, sims, name, wasm, {"call": name, "count": count}), count))
    cpu = measure(o, sims, sides)
    plain = statistics.median(cpu["envoy"])
    floor = statistics.median(cpu["no call"])
    what = dict(CALLS)
    rows = []
    for name, _, count in sides:
        med = statistics.median(cpu[name])
        if name == "envoy":
            price = "–"
        elif count == 0:
            price = f"{med - plain:+.1f} (the module itself)"
        else:
            # Every round's own difference, so a slow round moves both sides alike.
            per_round = [(c - n) / count for c, n in zip(cpu[name], cpu["no call"])]
            price = f"{statistics.median(per_round):.2f} ({min(per_round):.2f}–{max(per_round):.2f})"
        rows.append([name, what.get(name, "–"), f"{med:.1f}", f"{min(cpu[name]):.1f}–{max(cpu[name]):.1f}", price])
    body = table(["side", "host call", "Envoy CPU µs/request (median)", "range over rounds",
                  "µs per call (median of rounds, range)"], rows)
    notes = [
        setup(o, "exports context create, request headers and done; each probe side makes "
                 f"{o.calls} calls of its kind in request headers") +
        " A call's price is each round's difference to `no call` divided by the calls, median over rounds.",
        f"Plain Envoy {plain:.1f} µs/request; the probe making no call {floor:.1f}.",
    ]
    return Result("Prices: Envoy CPU per host call from a Wasm module", body, notes)


def run_stages(o, procs):
    bare, body = build(), build(body=True)
    sims = start_sims(procs, 2, SIM_ARGS)
    sides = [("envoy", start_envoy(procs, "nofilter", sims, 2, "envoy-nofilter"), 0),
             ("no call", probe_side(procs, sims, "no call", bare, {"count": 0}), 0)]
    for name, stage, _ in STAGES:
        sides.append((name, probe_side(procs, sims, name, body, {"count": 0, "stage": stage}), 0))
    cpu = measure(o, sims, sides)
    what = {"envoy": "plain Envoy", "no call": "a module with three callbacks (context create, request headers, done)"}
    what.update({name: text for name, _, text in STAGES})
    rows, previous = [], None
    for name, _, _ in sides:
        med = statistics.median(cpu[name])
        step = "–"
        if previous is not None:
            # Each round's own difference to the row above, so a slow round moves both alike.
            per_round = [c - p for c, p in zip(cpu[name], cpu[previous])]
            step = f"{statistics.median(per_round):+.1f} ({min(per_round):+.1f}–{max(per_round):+.1f})"
        rows.append([name, what[name], f"{med:.1f}", f"{min(cpu[name]):.1f}–{max(cpu[name]):.1f}", step])
        previous = name
    body_table = table(["side", "what the module does", "Envoy CPU µs/request (median)", "range over rounds",
                        "added to the row above (median of rounds, range)"], rows)
    notes = [setup(o, "makes no host call except those its stage names; the stage sides are built with "
                      "its `body` feature")]
    return Result("Prices: Envoy CPU per step of reading the request body", body_table, notes)
