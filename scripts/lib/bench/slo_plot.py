"""Plots an SLO matrix (the JSON `slo-sim --matrix .. --json FILE` writes): per cell the
goodput of the SLO configuration over the default profile's against the default's
interactive attainment (bars: the seeds' min–max), and each class's change in
attainment. Run with .venv's Python (matplotlib).

  slo_plot.py MATRIX.json OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MARKERS = {"steady": "o", "burst": "^", "step": "s"}


def attainment(run, side, c):
    sent = run[side]["sent"][c]
    return run[side]["met"][c] / sent if sent else None


def mean(v):
    v = [x for x in v if x is not None]
    return sum(v) / len(v) if v else None


def main(data, out):
    with open(data) as f:
        m = json.load(f)
    rows = m["rows"]
    pools = sorted({(r["servers"], r["ratio"], r["jitter"]) for r in rows})
    colours = plt.get_cmap("tab10")
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5.2))
    for r in rows:
        pool = (r["servers"], r["ratio"], r["jitter"])
        colour = colours(pools.index(pool) % 10)
        ratios = r["ratios"]
        mid = sum(ratios) / len(ratios)
        x = 100 * r["default_interactive"]
        ax.errorbar(x, mid, yerr=[[mid - min(ratios)], [max(ratios) - mid]],
                    fmt=MARKERS.get(r["arrival"], "o"), color=colour, ms=4 + 6 * r["share"],
                    alpha=0.85, elinewidth=0.8, capsize=2)
        di = mean(attainment(x_, "default", 0) for x_ in r["runs"])
        si = mean(attainment(x_, "slo", 0) for x_ in r["runs"])
        dr = mean(attainment(x_, "default", 1) for x_ in r["runs"])
        sr = mean(attainment(x_, "slo", 1) for x_ in r["runs"])
        if None not in (di, si, dr, sr):
            bx.scatter(100 * (si - di), 100 * (sr - dr), marker=MARKERS.get(r["arrival"], "o"),
                       color=colour, s=(4 + 6 * r["share"]) ** 2, alpha=0.85)
    ax.axhline(1.0, color="gray", lw=1)
    ax.axhline(1.15, color="gray", lw=1, ls="--")
    ax.axvline(85, color="gray", lw=1, ls=":")
    ax.set_xlabel("default profile's interactive attainment (%)")
    ax.set_ylabel("goodput: SLO configuration ÷ default profile")
    ax.set_title("goodput ratio per cell (bars: seeds' min–max)")
    lim = max(5, max(abs(v) for v in bx.get_xlim() + bx.get_ylim()))
    bx.plot([-lim, lim], [lim, -lim], color="gray", lw=1, ls=":")
    bx.axhline(-5, color="gray", lw=1, ls="--")
    bx.axvline(-5, color="gray", lw=1, ls="--")
    bx.axhline(0, color="gray", lw=0.5)
    bx.axvline(0, color="gray", lw=0.5)
    bx.set_xlabel("interactive attainment: SLO − default (points)")
    bx.set_ylabel("relaxed attainment: SLO − default (points)")
    bx.set_title("each class's change (below the dotted line: net loss)")
    handles = [plt.Line2D([], [], color=colours(i % 10), marker="o", ls="",
                          label=f"{s} servers, 1–{r:g}×, " + (f"jitter {j:g}" if j else "no jitter"))
               for i, (s, r, j) in enumerate(pools)]
    handles += [plt.Line2D([], [], color="black", marker=mk, ls="", label=a)
                for a, mk in MARKERS.items()]
    handles += [plt.Line2D([], [], color="black", marker="o", ls="", ms=4 + 6 * s,
                           label=f"interactive {int(100 * s)} %") for s in (0.2, 0.5, 0.8)]
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle(f"scripts/bench slo --matrix: {len(rows)} cells × {len(m['seeds'])} seeds, "
                 f"warm-up {m['warmup']:g} s, measured {m['seconds']:g} s")
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
