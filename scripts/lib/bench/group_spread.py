#!/usr/bin/env python3
"""Where a prefix group's requests went, from quality-sim's --trace files.

usage: scripts/lib/bench/group_spread.py TRACE.csv [FROM_MS TO_MS]

Over the window (default 10,000-20,000 ms of the run): the servers a group's requests
went to (mean distinct per group, over all replicas and per replica), and the share of
requests sent to a server that had served their group in the previous 5 s ("warm"),
against a server that had not while another had ("group warm elsewhere"), and the TTFT
p50 per 2 s of the whole run.
"""
import collections
import sys


def main():
    path = sys.argv[1]
    lo, hi = (float(sys.argv[2]), float(sys.argv[3])) if len(sys.argv) > 3 else (10_000, 20_000)
    rows = []
    for line in open(path):
        t, g, r, e, ttft = line.strip().split(",")[:5]
        rows.append((float(t), int(g), int(r), e, float(ttft)))
    rows.sort()
    per_group = collections.defaultdict(set)
    per_group_replica = collections.defaultdict(set)
    last = collections.defaultdict(dict)
    n = warm = elsewhere = 0
    for t, g, r, e, _ in rows:
        if lo <= t < hi:
            per_group[g].add(e)
            per_group_replica[(g, r)].add(e)
            recent = {s for s, at in last[g].items() if t - at < 5_000}
            n += 1
            warm += e in recent
            elsewhere += bool(recent) and e not in recent
        last[g][e] = t
    mean = lambda sets: sum(len(s) for s in sets) / max(1, len(sets))
    print(f"{path}: window {lo:.0f}-{hi:.0f} ms, {n} requests")
    print(f"  servers per group: {mean(per_group.values()):.2f} (per replica {mean(per_group_replica.values()):.2f})")
    print(f"  to a warm server {warm / max(1, n):.1%}; group warm elsewhere {elsewhere / max(1, n):.1%}")
    buckets = collections.defaultdict(list)
    for t, _, _, _, ttft in rows:
        buckets[int(t // 2000)].append(ttft)
    p50 = [sorted(v)[len(v) // 2] for _, v in sorted(buckets.items())]
    print("  TTFT p50 per 2 s (ms): " + " ".join(f"{x:.0f}" for x in p50))


if __name__ == "__main__":
    main()
