#!/usr/bin/env python3
"""Plots the result line of `bench/run latency`: samples/s against the
store's round-trip time, one line per loader.

    latency_plot.py RESULT.json|- OUT.png [PREFIX]

RESULT is the benchmark's last line (a JSON object with `rtt_ms`, `granary`,
`dataloader_w*` arrays and those of the other contenders, `boto3_threads`,
`s3torch_map`, `s3torch_iter`). PREFIX picks another store's arrays: `light_`
plots `light_granary`, `light_dataloader_w*`, … (the light store). The x axis is symmetric-log: linear between 0
and 1 ms, so the 0 ms point sits at the left edge, logarithmic above. The y
axis is logarithmic.
"""

import json
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402


def numbered(r, prefix):
    """(N, key) of every key `PREFIX<N>` of `r`, by N."""
    return sorted((int(k[len(prefix):]), k) for k in r if re.fullmatch(re.escape(prefix) + r"\d+", k))


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    src, out = sys.argv[1], sys.argv[2]
    pre = sys.argv[3] if len(sys.argv) == 4 else ""
    text = sys.stdin.read() if src == "-" else open(src).read()
    r = json.loads(text.strip().splitlines()[-1])
    rtt = r["rtt_ms"]

    r = {k[len(pre):]: v for k, v in r.items() if k.startswith(pre)} | {"rtt_ms": rtt, **{
        k: r[k] for k in ("files", "mean_sample_bytes", "cpus") if k in r}}
    series = [("granary", "Granary (agent + libgranary loader)", "o-", "C0")]
    for i, (n, k) in enumerate(numbered(r, "granary_inflight_")):
        series.append((k, f"Granary, max_inflight_reads={n}", "o:", f"C{i + 4}"))
    for i, (w, k) in enumerate(numbered(r, "dataloader_w")):
        series.append((k, f"PyTorch DataLoader + boto3, num_workers={w}", "s--", f"C{i + 1}"))
    labels = {
        "boto3_threads": "DataLoader + boto3, 4 workers × 16 threads",
        "s3torch_map": "s3torchconnector S3MapDataset, 8 workers",
        "s3torch_iter": "s3torchconnector S3IterableDataset, 8 workers",
    }
    for i, (k, label) in enumerate((k, v) for k, v in labels.items() if k in r):
        series.append((k, label, "^-.", f"C{i + 6}"))

    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    for n, (key, label, style, color) in enumerate(series):
        ys = r.get(key) or []
        pts = [(x, y) for x, y in zip(rtt, ys) if y is not None and y > 0]
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, label=label)
        # Labels above the points for the main line and the first
        # DataLoader, below them for the others, so that close lines stay
        # readable.
        below = key.startswith("granary_inflight_") or (
            key.startswith("dataloader_") and key != workers[0][1] if workers else False)
        for x, y in pts:
            ax.annotate(f"{y:.0f}", (x, y), textcoords="offset points",
                        xytext=(0, -11 if below else 6), ha="center", fontsize=7, color=color)
    ref = r.get("granary_ref0") or []
    refs = [(x, y) for x, y in zip(rtt, ref) if y is not None and y > 0 and x > 0]
    if refs:
        ax.plot([p[0] for p in refs], [p[1] for p in refs], "o", mfc="none", color="C0",
                alpha=0.6, label="Granary at 0 ms, measured next to the point (reference)")
    ax.set_xscale("symlog", linthresh=1.0, linscale=0.5)
    ax.xaxis.set_major_locator(FixedLocator(rtt))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlim(-0.2, max(rtt) * 1.4 if rtt else 1)
    ax.set_yscale("log")
    ax.set_xlabel("round-trip time to the store, ms (symmetric log axis: 0 ms at the left)")
    ax.set_ylabel("samples/s (steady state, log)")
    mean_kb = r.get("mean_sample_bytes", 0) / 1e3
    ax.set_title(
        f"Reading {r.get('files', '?')} samples (~{mean_kb:.0f} KB) from "
        f"{'the light store' if pre == 'light_' else 'SeaweedFS'} behind a delay proxy",
        fontsize=10,
    )
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    cpus = r.get("cpus")
    if cpus:
        fig.text(0.99, 0.01, f"{cpus} vCPUs shared by store, proxy and loader",
                 ha="right", va="bottom", fontsize=7, color="gray")
    fig.tight_layout()
    fig.savefig(out)


if __name__ == "__main__":
    main()
