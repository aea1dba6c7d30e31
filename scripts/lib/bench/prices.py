"""scripts/bench prices: what one crossing of the VM boundary costs in Envoy's V8, by kind
of host call: a bare module (price_probe/, no SDK) makes N calls of one kind in its
request-headers callback; Envoy's CPU per request (user + system time from /proc, as
ladder.py) minus the same module making none, divided by N, is the price of one call.

Sides, each its own Envoy (`--concurrency 2`) in front of the same `vllm-sim --profile zero`
servers, the client naming the endpoint, measured in turns over several rounds: plain
Envoy, the probe making no call (what a module with three callbacks costs), then one
side per kind of call. The probe builds into target/price-probe/ (benchmark only).
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
    return p.parse_args(argv)


def build():
    """The probe module's path (built in its own target dir)."""
    target = os.path.join(ROOT, "target", "price-probe")
    crate = os.path.join(ROOT, "scripts", "lib", "bench", "price_probe")
    log("building the price probe")
    subprocess.run(["cargo", "build", "--quiet", "--release", "--target", "wasm32-wasip1",
                    "--target-dir", target], cwd=crate, check=True)
    return os.path.join(target, "wasm32-wasip1/release/price_probe.wasm")


def run(o, procs):
    wasm = build()
    sims = start_sims(procs, 2, SIM_ARGS)
    sides = [("envoy", start_envoy(procs, "nofilter", sims, 2, "envoy-nofilter"), 0)]
    for name, count in [("no call", 0)] + [(call, o.calls) for call, _ in CALLS]:
        config = os.path.join(procs.workdir, f"probe-{name.replace(' ', '-')}.json")
        with open(config, "w") as f:
            json.dump({"call": name, "count": count}, f)
        sides.append((name, start_envoy(procs, "filter", sims, 2, f"envoy-{name.replace(' ', '-')}",
                                        wasm=wasm, config=config), count))
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
        f"Setup: 2 × `vllm-sim {' '.join(SIM_ARGS)}`; Envoy 1.40 `--concurrency 2` per side; {o.rounds} rounds, "
        f"sides in turns (rotated each round); per side and round 500 warm-up requests then {o.requests:,} "
        f"measured, closed loop of {o.concurrency}, `/v1/completions` with 80-token prompts, not streamed, the "
        "client naming the endpoint. The probe (scripts/lib/bench/price_probe) exports context create, request "
        f"headers and done; each probe side makes {o.calls} calls of its kind in request headers. CPU: the Envoy "
        "process's user + system time over the measured requests (/proc/PID/stat), divided by them; a call's "
        "price is each round's difference to `no call` divided by the calls, median over rounds.",
        f"Plain Envoy {plain:.1f} µs/request; the probe making no call {floor:.1f}.",
    ]
    return Result("Prices: Envoy CPU per host call from a Wasm module", body, notes)
