"""scripts/bench autoscale: scale from zero, out and back, through `scripts/run --autoscale`
(scripts/lib/autoscale_scenario.py drives it as the test does, with longer phases): the
time to first token of the first requests after zero, the replicas over time against the
ScaledObject's two signals, time back to zero; a PNG plot of the run (matplotlib, into
.venv) next to the result.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from common import RESULTS_DIR, ROOT, VENV_PY, Result, log

sys.path.insert(0, os.path.join(ROOT, "scripts", "lib"))
import autoscale_scenario  # noqa: E402

PLOT = os.path.join(ROOT, "scripts", "lib", "bench", "autoscale_plot.py")


def options(argv):
    p = argparse.ArgumentParser(prog="scripts/bench autoscale")
    p.add_argument("--speed", type=float, default=10.0,
                   help="the ScaledObject's times divided by this [10]")
    p.add_argument("--replicas", default="0:3")
    p.add_argument("--burst", type=int, default=16)
    p.add_argument("--clients", type=int, default=40)
    p.add_argument("--sustain", type=float, default=90.0, help="seconds of sustained load")
    p.add_argument("--startup", default="5s", help="vllm-sim --startup-duration (cold start)")
    p.add_argument("--plot", default=os.path.join(RESULTS_DIR, "autoscale.png"))
    return p.parse_args(argv)


def run(o, procs):
    with tempfile.TemporaryDirectory() as d:
        log(f"scripts/run --autoscale {o.replicas} at speed {o.speed:g} (a few minutes)")
        r = autoscale_scenario.scenario(d, speed=o.speed, replicas=o.replicas, burst=o.burst,
                                        clients=o.clients, sustain_s=o.sustain,
                                        startup=o.startup)
    os.makedirs(os.path.dirname(o.plot), exist_ok=True)
    data = os.path.splitext(o.plot)[0] + ".json"
    with open(data, "w") as f:
        json.dump(r, f)
    plotted = subprocess.run([VENV_PY, PLOT, data, o.plot], cwd=ROOT).returncode == 0
    ok = sum(1 for s in r["burst_status"] if s == 200)
    body = "\n".join([
        "| measure | value |", "|---|---|",
        f"| burst of {o.burst} streamed requests at 0 replicas: answered 200 | {ok} / {o.burst} |",
        f"| time to first token of the first of them | {r['ttft_after_zero_s']:.2f} s |",
        f"| sustained load: {o.clients} requests in flight for {o.sustain:g} s, failed | "
        f"{r['sustained']['failed']} of {r['sustained']['ok'] + r['sustained']['failed']} |",
        f"| replicas at the end of the load (ceil({o.clients} / 16), at most the max) | "
        f"{r['replicas_under_load']} (expected {r['expected_under_load']}; "
        f"highest {r['max_replicas']}) |",
        f"| back to 0 after the load stopped | {r['back_to_min_after_s']} s "
        f"({'yes' if r['back_to_min'] else 'NO'}) |",
        f"| the next request after zero: status, time to first token | "
        f"{r['after_zero_status']}, {r['ttft_after_zero_again_s'] or 0:.2f} s |",
    ])
    notes = [f"Replicas over time: {os.path.relpath(o.plot, ROOT) if plotted else '(no plot)'}"
             f", data {os.path.relpath(data, ROOT)}.",
             f"Setup: `scripts/run --autoscale {o.replicas} --autoscale-speed {o.speed:g}`, "
             f"envoy/autoscaling/keda-scaledobject.yaml's queries and behaviour with its "
             f"times divided by {o.speed:g}; vllm-sim --startup-duration {o.startup} "
             "--max-num-seqs 64, TTFT 100 ms, ITL 50 ms; requests of 20 output tokens."]
    return Result("Autoscaling: scale from zero, out and back", body, notes)
