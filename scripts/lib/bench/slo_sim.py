"""scripts/bench slo: SLO-aware routing in virtual time. Runs target/release/slo-sim
(tests/src/bin/slo-sim/) with slo-sim's own arguments. Without any, the matrix
(`--matrix` with the pools of DEFAULT_MATRIX): the shipped SLO configuration against the
default profile per pool shape × arrival shape × interactive share × seed, a table, and
a PNG plot (scripts/lib/bench/slo_plot.py, matplotlib in .venv) next to the raw result.
With other arguments, as given: the mixed-SLO outcome per QPS step and side, or with
--schedule the predictor's error per window as the load changes.
"""
import os
import subprocess
from dataclasses import dataclass, field
from typing import List

from common import RESULTS_DIR, ROOT, SLO_SIM, VENV_PY, Result, log

# Pool shapes N:R:J (servers, slowest ÷ fastest, engine step jitter): 4 to 16 servers,
# 1× to 3×, with and without jitter; the first two are the pool of the issue that
# started it (4 unequal servers with jitter) and its uniform twin.
DEFAULT_MATRIX = ["--matrix", "4:3:0.15,4:1:0,8:2:0.15,16:3:0", "--seeds", "1,2"]
PLOT = os.path.join(ROOT, "scripts", "lib", "bench", "slo_plot.py")


@dataclass
class SloSimOptions:
    args: List[str] = field(default_factory=list)  # slo-sim's own arguments


def run(o, procs):
    """The slo-sim benchmark; its Result (procs is unused: slo-sim is one process that
    starts nothing)."""
    args = list(o.args) or list(DEFAULT_MATRIX)
    matrix = "--matrix" in args
    plot = None
    if matrix:
        plot = os.path.join(RESULTS_DIR, "slo-matrix.png")
        if "--plot" in args:
            i = args.index("--plot")
            plot = os.path.abspath(args[i + 1])
            del args[i:i + 2]
        os.makedirs(os.path.dirname(plot), exist_ok=True)
        data = os.path.splitext(plot)[0] + ".json"
        args += ["--json", data]
    cmd = [SLO_SIM, *args]
    log(" ".join(cmd))
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"bench: slo-sim failed:\n{(r.stdout + r.stderr)[-4000:]}")
    setup, _, body = r.stdout.strip().partition("\n\n")
    notes = [
        "Setup: " + setup + ". The filter `.wasm` in host-sim's simulated Envoy (virtual time); "
        "LEAST_REQUEST is host-sim's model of Envoy's policy in the same simulated Envoy without the filter. "
        "Attainment = requests sent in the window that got a 200 within both SLOs ÷ requests sent; "
        "goodput = those per second; TTFT is measured at the client (send → first chunk).",
    ]
    if matrix:
        plotted = subprocess.run([VENV_PY, PLOT, data, plot], cwd=ROOT).returncode == 0
        notes.append("Plot: " + (os.path.relpath(plot, ROOT) if plotted else "(none: the plot failed)")
                     + "; figures: " + os.path.relpath(data, ROOT))
    return Result("SLO-aware routing in virtual time (host-sim)", body, notes)
