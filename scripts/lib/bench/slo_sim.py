"""scripts/bench slo: SLO-aware routing in virtual time. Runs target/release/slo-sim
(tests/src/bin/slo-sim.rs) with slo-sim's own arguments, as given: the mixed-SLO outcome
per QPS step and side, or with --schedule the predictor's error per window as the load
changes; its setup line and table make the result.
"""
import subprocess
from dataclasses import dataclass, field
from typing import List

from common import ROOT, SLO_SIM, Result, log


@dataclass
class SloSimOptions:
    args: List[str] = field(default_factory=list)  # slo-sim's own arguments


def run(o, procs):
    """The slo-sim benchmark; its Result (procs is unused: slo-sim is one process that
    starts nothing)."""
    cmd = [SLO_SIM, *o.args]
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
    return Result("SLO-aware routing in virtual time (host-sim)", body, notes)
