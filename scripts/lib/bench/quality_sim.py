"""scripts/bench quality-sim: routing quality in virtual time. Runs target/release/quality-sim
(tests/src/bin/quality-sim.rs) with quality-sim's own arguments, as given; its setup line
and table make the result.
"""
import subprocess
from dataclasses import dataclass, field
from typing import List

from common import QUALITY_SIM, ROOT, Result, log


@dataclass
class QualitySimOptions:
    args: List[str] = field(default_factory=list)  # quality-sim's own arguments


def run(o, procs):
    """The quality-sim benchmark; its Result (procs is unused: quality-sim is one process
    that starts nothing)."""
    cmd = [QUALITY_SIM, *o.args]
    log(" ".join(cmd))
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"bench: quality-sim failed:\n{(r.stdout + r.stderr)[-4000:]}")
    setup, _, body = r.stdout.strip().partition("\n\n")
    notes = [
        "Setup: " + setup + ". Sides (BENCHMARKS.md, Method): the filter `.wasm` in host-sim's simulated "
        "Envoy; host-sim's models of Envoy `ROUND_ROBIN` and `LEAST_REQUEST` and of sglang-router 0.3.2 "
        "`cache_aware` in the same simulated Envoy without the filter. Times are virtual; `wall s` is the "
        "real time one (side, QPS) took.",
    ]
    return Result("Routing quality in virtual time (host-sim)", body, notes)
