"""Plots an autoscale run (the JSON scripts/bench autoscale writes): replicas (desired and
ready) and the two signals over time. Run with .venv's Python (matplotlib).

  autoscale_plot.py RUN.json OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(data, out):
    with open(data) as f:
        r = json.load(f)
    d = [x for x in r["decisions"] if x["t"] >= -5]
    t = [x["t"] for x in d]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.step(t, [x["desired"] for x in d], where="post", label="replicas (desired)", lw=2)
    ax.step(t, [x["ready"] for x in d], where="post", label="replicas ready", lw=1.5, ls="--")
    ax.set_xlabel("seconds since the burst at zero replicas")
    ax.set_ylabel("replicas")
    ax2 = ax.twinx()
    for name, style in (("queue", ":"), ("running", "-.")):
        ax2.plot(t, [x["values"].get(name) or 0 for x in d], ls=style, color="gray",
                 label=f"{name} (query value)")
    ax2.set_ylabel("requests")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper right", fontsize=8)
    ax.set_title(f"scripts/run --autoscale {r['replicas']} (times / {r['speed']:g}): "
                 f"burst {r['burst']}, then {r['clients']} in flight")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
