#!/usr/bin/env python3
"""Plots the result line of `bench/run stall`: the GPU-idle fraction against
the store's round-trip time (left) and the loader's CPU per delivered sample
(right), one line per contender.

    stall_plot.py RESULT.json|- OUT.png

RESULT is the benchmark's last line: a JSON object with `rtt_ms` and, per
contender, `<name>_idle` and `<name>_cpu_us` arrays. The x axes are
symmetric-log (linear below 1 ms, so the 0 ms point sits at the left edge).
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    src, out = sys.argv[1], sys.argv[2]
    text = sys.stdin.read() if src == "-" else open(src).read()
    r = json.loads(text.strip().splitlines()[-1])
    rtt = r["rtt_ms"]
    names = [k[: -len("_idle")] for k in r if k.endswith("_idle") and isinstance(r[k], list)]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    for i, name in enumerate(names):
        style = "o-" if name.startswith("granary") else "s--"
        idle = [None if v is None else 100.0 * v for v in r[f"{name}_idle"]]
        ax1.plot(rtt, idle, style, color=f"C{i}", label=name)
        ax2.plot(rtt, r.get(f"{name}_cpu_us", [None] * len(rtt)), style, color=f"C{i}", label=name)
    for ax in (ax1, ax2):
        ax.set_xscale("symlog", linthresh=1.0)
        ax.xaxis.set_major_locator(FixedLocator(rtt))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("round-trip time to the store (ms)")
        ax.grid(True, alpha=0.3)
    ax1.axhline(5.0, color="grey", linestyle=":", label="goal: 5 % at 100 ms")
    ax1.set_ylim(-2, 102)
    ax1.set_ylabel("GPU idle, waiting for data (% of wall time)")
    ax1.set_title(f"GPU step {r.get('step_ms', 0):.1f} ms per batch of {r.get('batch', '?')}")
    ax2.set_yscale("log")
    ax2.set_ylabel("loader CPU per delivered sample (µs)")
    ax2.set_title("client processes + agent; store and proxy excluded")
    ax1.legend(fontsize=8)
    fig.suptitle(f"bench/run stall — {r.get('cpus', '?')} CPUs, {r.get('cpu_model', '')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
