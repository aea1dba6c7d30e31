"""scripts/bench breakdown: what one request costs at the VM boundary, deterministically.
Runs target/release/host-calls (host-sim/src/bin/host-calls.rs: the real release .wasm in
host-sim's simulated Envoy, virtual time) for each scenario — the default profile,
streamed, flow control on, flow control behind a backlog of 1,000 and 10,000 queued
requests, a 64 KiB prompt — and, with --candidate-wasm, the same for another build, so
a before/after table comes from one command. Host calls and callbacks are counted, not
timed: the table changes only when the code does. The wasm instructions the module runs
per request are counted too (wasmtime fuel, `HOST_SIM_FUEL=1`): the filter's own work,
independent of the machine, where V8 runs the same code in Envoy.
"""
import os
import subprocess
from dataclasses import dataclass, field
from typing import List, Optional

from common import ROOT, Result, log

HOST_CALLS = f"{ROOT}/target/release/host-calls"

SCENARIOS = [
    ("default profile", []),
    ("streamed (16 chunks)", ["--stream"]),
    ("64 KiB prompt", ["--prompt-kib", "64"]),
    ("flow control, unsaturated", ["--flow-control"]),
    ("flow control, 1,000 queued", ["--queued", "1000"]),
    ("flow control, 10,000 queued", ["--queued", "10000"]),
]


@dataclass
class BreakdownOptions:
    candidate_wasm: Optional[str] = None
    candidate_label: str = ""
    args: List[str] = field(default_factory=list)  # host-calls' own extra arguments


def totals(wasm, extra, args):
    """(host calls, callbacks, wasm instructions, shared-data bytes, full text) per request."""
    cmd = [HOST_CALLS, *extra, *args] + (["--wasm", wasm] if wasm else [])
    log(" ".join(cmd))
    env = dict(os.environ, HOST_SIM_FUEL="1")
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"bench: host-calls failed:\n{(r.stdout + r.stderr)[-4000:]}")
    host = callbacks = instructions = shared = 0.0
    in_shared = False
    for line in r.stdout.splitlines():
        if line.startswith("= host calls"):
            host = float(line.split()[-1])
        elif line.startswith("= callbacks"):
            callbacks = float(line.split()[-1])
        elif line.startswith("= wasm instructions"):
            instructions = float(line.split()[-1])
        elif line.startswith("shared data"):
            in_shared = True
        elif line.startswith("wasm instructions between"):
            in_shared = False
        elif in_shared and line.strip():
            shared += float(line.split()[-1])
    return host, callbacks, instructions, shared, r.stdout


def run(o, procs):
    """The breakdown; its Result (procs is unused: host-calls starts nothing)."""
    sides = [("this build", None)]
    if o.candidate_wasm:
        sides.append((o.candidate_label or o.candidate_wasm, o.candidate_wasm))
    head = "| scenario | " + " | ".join(
        f"{name}: host calls | callbacks | wasm instructions | shared-data bytes" for name, _ in sides) + " |"
    rows = [head, "|" + "---|" * (1 + 4 * len(sides))]
    details = []
    for label, extra in SCENARIOS:
        cells = [label]
        for name, wasm in sides:
            host, cb, instructions, shared, text = totals(wasm, extra, o.args)
            cells += [f"{host:.1f}", f"{cb:.1f}", f"{instructions:,.0f}", f"{shared:,.0f}"]
            if wasm is None:
                details.append(f"#### {label}\n\n```\n{text.strip()}\n```")
        rows.append("| " + " | ".join(cells) + " |")
    notes = [
        "Per request, at 500 requests/s through 2 simulated workers and 2 servers (metrics "
        "scraped every 50 ms): host calls the filter makes, callbacks Envoy makes into it "
        "(each a VM entry, including proxy_on_memory_allocate for every buffer handed in), "
        "the wasm instructions the module ran in those callbacks (wasmtime fuel: about one "
        "unit per instruction; a bulk memory copy counts once whatever its length), "
        "and bytes of shared data read and written; a run without requests is subtracted. "
        "Under a backlog the measured requests are parked behind it (admission only).",
        "Per call, for this build:\n\n" + "\n\n".join(details),
    ]
    return Result("Per-request cost at the VM boundary (host-sim, counted)", "\n".join(rows), notes)
