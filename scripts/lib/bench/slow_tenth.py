#!/usr/bin/env python3
"""What the slowest tenth of requests were, from a quality-sim `--trace` file.

usage: scripts/lib/bench/slow_tenth.py TRACE.csv [PREFIX_TOKENS]

Over the measured requests (TTFT at or above the window's p90 = "slow"), against all:
- hit (the server reported at least PREFIX_TOKENS cached, default 1024: the group's shared
  prompt), partial, miss (nothing cached);
- where they went: the group's rendezvous owner, its second owner, a server this replica
  had sent the group to before (its learned index, roughly: eviction is not modelled), or
  another server; and whether the replica had sent the group anywhere before ("cold" for
  the replica: the prior applies);
- when not to the owner: whether the owner was queueing past the default detector's
  bound at the dispatch (5+ waiting and more than twice the pool's mean, or KV >= 80 %, at
  the trace's 10 ms sample: the filter's scrape is up to 50 ms older) -- "owner over the
  bound" -- or not ("owner outscored": the scorers preferred another server);
- for the slow misses: where the group's previous request went (any replica), from which
  replica, how long before; and whether the group was warm elsewhere (served in the last
  5 s by a server other than the one chosen);
- servers per group over the window (all replicas / per replica), and the queue waited
  at the chosen server.
"""
import collections
import sys


def load(path):
    rows = []
    for line in open(path):
        f = line.strip().split(",")
        rows.append(dict(
            t=float(f[0]), g=int(f[1]), r=int(f[2]), e=f[3], ttft=float(f[4]),
            cached=int(f[6]), measured=f[7] == "1", own=f[8], own2=f[9],
            own_run=int(f[10]), own_wait=int(f[11]), own_kv=float(f[12]),
            srv_run=int(f[13]), srv_wait=int(f[14]), mean_wait=float(f[15]),
        ))
    rows.sort(key=lambda x: x["t"])
    return rows


def pct(n, d):
    return f"{100 * n / max(1, d):.0f} %"


def main():
    path = sys.argv[1]
    prefix = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    rows = load(path)
    sent_by = collections.defaultdict(set)   # (replica, group) -> servers it sent to
    last = collections.defaultdict(dict)     # group -> server -> last sent at
    prev = {}                                # group -> last request (any replica)
    out = []
    for x in rows:
        g, r, e = x["g"], x["r"], x["e"]
        learned = sent_by[(r, g)]
        x["cold"] = not learned
        x["dest"] = ("owner" if e == x["own"] else "2nd owner" if e == x["own2"]
                     else "learned" if e in learned else "other")
        x["owner_out"] = (x["own_wait"] >= 5 and x["own_wait"] > 2 * x["mean_wait"]) or x["own_kv"] >= 0.8
        recent = {s for s, at in last[g].items() if x["t"] - at < 5_000}
        x["warm_here"] = e in recent
        x["warm_elsewhere"] = bool(recent - {e})
        p = prev.get(g)
        x["prev"] = None if p is None else (p["e"], p["r"], x["t"] - p["t"])
        x["owner_learned"] = x["own"] in learned
        if x["measured"] and x["ttft"] >= 0:
            out.append(x)
        learned.add(e)
        last[g][e] = x["t"]
        prev[g] = x
    ttfts = sorted(x["ttft"] for x in out)
    p90 = ttfts[int(0.9 * len(ttfts))]
    slow = [x for x in out if x["ttft"] >= p90]
    print(f"{path}: {len(out)} measured requests, TTFT p50 {ttfts[len(ttfts) // 2]:.0f} ms, "
          f"p90 {p90:.0f} ms; slow tenth: {len(slow)}")

    def kind(x):
        return "hit" if x["cached"] >= prefix else "partial" if x["cached"] > 0 else "miss"

    def table(title, key):
        a = collections.Counter(key(x) for x in out)
        s = collections.Counter(key(x) for x in slow)
        print(f"  {title}: " + "; ".join(
            f"{k} {s[k]} of slow ({pct(s[k], len(slow))}), {pct(a[k], len(out))} of all"
            for k in sorted(set(a) | set(s), key=lambda k: -s[k])))

    table("prefix", kind)
    table("destination", lambda x: x["dest"] + (" (replica cold)" if x["cold"] else ""))
    table("not to the owner", lambda x: "to the owner" if x["dest"] == "owner" else
          ("owner over the bound" if x["owner_out"] else "owner outscored")
          + (", replica cold" if x["cold"] else ", replica warm"))
    misses = [x for x in slow if kind(x) != "hit"]
    if misses:
        print(f"  slow misses/partials ({len(misses)}):")
        c = collections.Counter()
        for x in misses:
            p = x["prev"]
            c["group warm elsewhere" if x["warm_elsewhere"] else "group not warm elsewhere"] += 1
            if p is None:
                c["first request of the group"] += 1
                continue
            c["previous of the group to the same server" if p[0] == x["e"] else
              "previous of the group to another server"] += 1
            c["previous from the same replica" if p[1] == x["r"] else
              "previous from another replica"] += 1
            c["previous went to the owner" if p[0] == x["own"] else "previous went elsewhere"] += 1
        for k, v in sorted(c.items()):
            print(f"    {k}: {v}")
        gaps = sorted(x["prev"][2] for x in misses if x["prev"])
        if gaps:
            print(f"    time since the group's previous request: median {gaps[len(gaps) // 2]:.0f} ms")
    for name, group in (("slow", slow), ("all", out)):
        w = sorted(x["srv_wait"] for x in group)
        ow = sorted(x["own_wait"] for x in group)
        print(f"  {name}: waiting at the chosen server (sampled) median {w[len(w) // 2]}, "
              f"p90 {w[int(0.9 * len(w))]}; at the owner median {ow[len(ow) // 2]}, p90 {ow[int(0.9 * len(ow))]}")
    groups = collections.defaultdict(set)
    per_rep = collections.defaultdict(set)
    for x in out:
        groups[x["g"]].add(x["e"])
        per_rep[(x["g"], x["r"])].add(x["e"])
    mean = lambda sets: sum(len(s) for s in sets) / max(1, len(sets))
    owner_share = sum(x["e"] == x["own"] for x in out)
    print(f"  servers per group: {mean(groups.values()):.2f} (per replica {mean(per_rep.values()):.2f}); "
          f"to the owner {pct(owner_share, len(out))} of all")
    slow_by_server = collections.Counter(x["e"] for x in slow)
    print("  slow per server: " + ", ".join(f"{e.split(':')[0]} {n}" for e, n in slow_by_server.most_common(6)))


if __name__ == "__main__":
    main()
