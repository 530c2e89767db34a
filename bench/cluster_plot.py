#!/usr/bin/env python3
"""Plots the timeline of `bench/run cluster`: per scenario, the cluster's
samples per second served from the local arena, from peers, and read from
the store, over time, with the epoch boundaries.

    cluster_plot.py TIMELINE.csv OUT.png

TIMELINE is the benchmark's `timeline.csv`: `scenario,t,node,local,peer,
store,reads` rows of cumulative counters per node (scraped every 250 ms),
and `scenario,t,epoch,E,...` rows marking where epoch E began. Each node's
counters are interpolated onto a common 1 s grid, summed over the nodes
and differentiated.
"""

import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STEP = 1.0
SERIES = [
    ("local", "local arena", "C2"),
    ("peer", "from peers", "C0"),
    ("reads", "store reads", "C3"),
]


def interp(ts, vs, t):
    """Linear interpolation of the cumulative series (ts, vs) at t."""
    if not ts or t <= ts[0]:
        return 0.0 if not ts or t < ts[0] else vs[0]
    if t >= ts[-1]:
        return vs[-1]
    lo, hi = 0, len(ts) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ts[mid] <= t:
            lo = mid
        else:
            hi = mid
    f = (t - ts[lo]) / (ts[hi] - ts[lo]) if ts[hi] > ts[lo] else 0.0
    return vs[lo] + f * (vs[hi] - vs[lo])


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    src, out = sys.argv[1], sys.argv[2]
    points = defaultdict(lambda: defaultdict(list))  # scenario -> node -> rows
    marks = defaultdict(list)
    order = []
    with open(src) as f:
        for row in csv.DictReader(f):
            sc = row["scenario"]
            if sc not in order:
                order.append(sc)
            if row["node"] == "epoch":
                marks[sc].append((float(row["t"]), int(row["local"])))
            else:
                points[sc][row["node"]].append(row)
    if not order:
        print("cluster_plot.py: empty timeline", file=sys.stderr)
        sys.exit(1)
    fig, axes = plt.subplots(len(order), 1, figsize=(8, 2.2 * len(order) + 0.6), dpi=110,
                             squeeze=False)
    for ax, sc in zip(axes[:, 0], order):
        nodes = points[sc]
        end = max((float(r["t"]) for rows in nodes.values() for r in rows), default=0.0)
        grid = [i * STEP for i in range(int(end / STEP) + 2)]
        for key, label, color in SERIES:
            total = [0.0] * len(grid)
            for rows in nodes.values():
                ts = [float(r["t"]) for r in rows]
                vs = [float(r[key]) for r in rows]
                for i, t in enumerate(grid):
                    total[i] += interp(ts, vs, t)
            rate = [(total[i + 1] - total[i]) / STEP for i in range(len(grid) - 1)]
            ax.plot(grid[1:], rate, color=color, label=label, linewidth=1.2)
        for t, e in marks[sc]:
            ax.axvline(t, color="0.6", linestyle=":", linewidth=0.8)
            ax.text(t, 1.0, f" e{e}", transform=ax.get_xaxis_transform(), va="top",
                    fontsize=7, color="0.4")
        ax.set_title(sc, loc="left", fontsize=9)
        ax.set_ylabel("samples/s", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("seconds since the scenario began", fontsize=8)
    fig.suptitle("bench/run cluster: where the cluster's samples came from", fontsize=10)
    fig.tight_layout()
    fig.savefig(out)


if __name__ == "__main__":
    main()
