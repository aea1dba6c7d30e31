"""scripts/bench sched: the cost of a pick. The filter's criterion benches, natively
(`cargo bench -p filter --bench '*'`, short warm-up and measurement times), and the pick
inside Envoy's V8 VM at 8/64/512 endpoints (filter/benches/in_envoy.py).
"""
import os
import re
import subprocess
import sys
from dataclasses import dataclass

from common import ROOT, Result, log, table

IN_ENVOY = os.path.join(ROOT, "filter/benches/in_envoy.py")
IN_ENVOY_SIZES = "8,64,512"
IN_ENVOY_LIMIT = 300


@dataclass
class SchedOptions:
    warm_up_time: float = 1
    measurement_time: float = 2
    limit: int = 900  # seconds for cargo bench


def has_benches():
    """Whether the filter crate has criterion benches (filter/benches/*.rs or [[bench]])."""
    benches = os.path.join(ROOT, "filter/benches")
    if os.path.isdir(benches) and any(n.endswith(".rs") for n in os.listdir(benches)):
        return True
    try:
        with open(os.path.join(ROOT, "filter/Cargo.toml")) as f:
            return "[[bench]]" in f.read()
    except OSError:
        return False


def parse_criterion(out):
    """[name, median estimate, throughput, interval] rows from criterion's console output."""
    rows = []
    # criterion: "name\n    time:   [low mid high]" or "name   time:   [...]"; optional "thrpt:" line.
    pending = None
    for line in out.splitlines():
        m = re.match(r"^(\S.*?)\s+time:\s+\[(.+?)\]", line)
        if m:
            name, times = m.group(1).strip(), m.group(2).split()
        else:
            m2 = re.match(r"^\s+time:\s+\[(.+?)\]", line)
            if m2 and pending:
                name, times = pending, m2.group(1).split()
            else:
                if line and not line.startswith(" ") and "time:" not in line and not line.startswith(
                        ("Benchmarking", "Found", "Running", "Gnuplot", "Compiling", "Finished", "Warning")):
                    pending = line.strip()
                m3 = re.match(r"^\s+thrpt:\s+\[(.+?)\]", line)
                if m3 and rows:
                    t = m3.group(1).split()
                    rows[-1][2] = f"{t[2]} {t[3]}" if len(t) >= 4 else m3.group(1)
                continue
        mid = f"{times[2]} {times[3]}" if len(times) >= 6 else " ".join(times)
        rows.append([name, mid, "", f"[{' '.join(times)}]"])
        pending = None
    return rows


def in_vm_pick():
    """The in-VM pick's table (in_envoy.py's output) as a note, or what went wrong; "" if
    the script is absent."""
    if not os.path.exists(IN_ENVOY):
        return ""
    cmd = [sys.executable, IN_ENVOY, "--sizes", IN_ENVOY_SIZES]
    log(" ".join(cmd))
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=IN_ENVOY_LIMIT)
    except subprocess.TimeoutExpired:
        return f"In-VM pick: `in_envoy.py` did not finish within {IN_ENVOY_LIMIT} s."
    out = (r.stdout or "").strip()
    if r.returncode == 0 and out:
        return (f"The pick inside Envoy's V8 VM (`python3 filter/benches/in_envoy.py --sizes {IN_ENVOY_SIZES}`):"
                "\n\n```\n" + out + "\n```")
    return "In-VM pick: `in_envoy.py` failed:\n\n```\n" + ((r.stdout or "") + (r.stderr or ""))[-1500:] + "\n```"


def criterion(o):
    """(the command, its results table) of cargo bench."""
    cmd = ["cargo", "bench", "-p", "filter", "--bench", "*", "--", "--warm-up-time", str(o.warm_up_time),
           "--measurement-time", str(o.measurement_time)]
    log(" ".join(cmd))
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=o.limit)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"bench: cargo bench did not finish within {o.limit} s")
    out = r.stdout + "\n" + r.stderr
    if r.returncode != 0:
        raise SystemExit(f"bench: cargo bench failed:\n{out[-4000:]}")
    rows = parse_criterion(out)
    if not rows:
        return cmd, "cargo bench ran but printed no criterion results:\n\n```\n" + out[-2000:] + "\n```"
    headers = ["benchmark", "time (median estimate)", "throughput", "95 % interval"]
    if not any(r[2] for r in rows):
        headers.pop(2)
        rows = [[r[0], r[1], r[3]] for r in rows]
    return cmd, table(headers, rows)


def run(o, procs):
    """The sched benchmark; its Result (procs is unused: the scripts it runs stop their own)."""
    notes = [in_vm_pick()]
    if not has_benches():
        body = "No criterion benches in `filter/` at this revision (`filter/benches/*.rs`, `[[bench]]`); not run."
        return Result("Scheduling cost (criterion)", body, notes)
    cmd, body = criterion(o)
    notes.insert(0, f"`{' '.join(cmd)}` (bounded: {o.limit} s).")
    return Result("Scheduling cost (criterion)", body, notes)
