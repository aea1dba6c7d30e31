"""scripts/bench flow-control: the cost of flow control. Memory per parked stream and the
latency added on the unsaturated path (both by flow_control.py, which starts and stops
its own Envoy and server), and the dispatch cycle duration from one flow-control-on side
of the overload shape (overload.run_side).
"""
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

import overload
from common import FLOW_CONTROL_PY, Result, fmt, log, table


@dataclass
class FlowControlOptions:
    parked: int = 10000  # requests parked in one Envoy
    # The overload side the dispatch cycle is read from (its seconds: 20 by default here).
    side: overload.OverloadOptions = field(default_factory=lambda: overload.OverloadOptions(seconds=20))


def run_script(what, extra, workers, limit):
    """flow_control.py WHAT's markdown table (bounded by `limit` s)."""
    cmd = [sys.executable, FLOW_CONTROL_PY, what, "--workers", str(workers), *extra]
    log(" ".join(cmd[1:]))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"bench: flow_control.py {what} did not finish within {limit} s")
    if r.returncode != 0:
        raise SystemExit(f"bench: flow_control.py {what} failed:\n{r.stdout}\n{r.stderr[-2000:]}")
    return r.stdout.strip()


def dispatch_cycle(ov, procs):
    """(table, offered QPS, measured capacity) of the dispatch cycle on one flow-control-on
    side at ov.factor × the measured capacity."""
    cap, _ = overload.calibrate(ov, procs)
    qps = ov.factor * cap
    rdir = tempfile.mkdtemp(prefix="records-", dir=procs.workdir)
    recs, _, hist = overload.run_side(ov, procs, True, qps, 0, rdir)
    n = max(hist.values()) if hist else 0
    rows = [
        ["cycles recorded", f"{n:.0f}"],
        ["p50 (from buckets)", f"{fmt(overload.hist_quantile(hist, 0.5), 1)} µs"],
        ["p99 (from buckets)", f"{fmt(overload.hist_quantile(hist, 0.99), 1)} µs"],
        ["requests in the run (ok)", f"{len(recs)} ({sum(1 for r in recs if r['status'] == 200)})"],
        ["cumulative bucket counts (le µs: count)", overload.bucket_text(hist)],
    ]
    return table(["dispatch cycle (saturated, overload shape)", "value"], rows), qps, cap


def run(o, procs):
    """The flow-control benchmark; its Result."""
    ov = o.side
    parts = [run_script("parked-memory", ["--n", str(o.parked)], ov.workers, 300),
             run_script("overhead", [], ov.workers, 240)]
    dispatch, qps, cap = dispatch_cycle(ov, procs)
    parts.append(dispatch)
    notes = [
        f"`scripts/lib/bench/flow_control.py parked-memory --n {o.parked}`: one `vllm-sim --profile zero "
        "--inter-token-latency 1s` server, a `concurrency-detector` with maxConcurrency 1 and one long request "
        f"holding the slot; {o.parked} idle connections, then {o.parked} requests parked; memory from Envoy's "
        f"admin `/memory` (allocated), Envoy 1.40 `--concurrency {ov.workers}`.",
        "`flow_control.py overhead`: sequential 1-token non-streamed requests on one keep-alive connection "
        "(5 rounds × 2000, alternating), flow control on (concurrency-detector maxConcurrency 1000, never "
        "saturated) vs the filter without the gate, in front of `vllm-sim --profile zero`.",
        f"Dispatch cycle: `{overload.DISPATCH_HIST}` (µs) from Envoy's `/stats/prometheus` after one "
        f"flow-control-on side of the overload shape ({ov.servers} × `vllm-sim {' '.join(overload.sim_args(ov))}`, "
        f"{qps:.1f} QPS = {ov.factor:g}× the measured {cap:.1f} req/s, {ov.seconds:g} s, priorities and tenants "
        f"{'/'.join(str(w) for w in ov.tenant_weights)} as in the overload benchmark); quantiles interpolated "
        "linearly inside the bucket.",
    ]
    return Result("Flow control: parked memory, unsaturated overhead, dispatch cycle", "\n\n".join(parts), notes)
