#!/usr/bin/env python3
"""Trains a small CNN for one epoch on CPU, fed by torchvision's ImageFolder
and then by Granary, and prints images/s for both.

    pip install ./client-c/python torch torchvision Pillow numpy
    python examples/train.py                      # or: bench/run train

It writes a JPEG dataset (``granary.make_dataset``) if the folder does not
hold one, starts a private ``granaryd`` serving it, and runs the same
training loop twice with the same model initialisation: once over
``DataLoader(ImageFolder(...), shuffle=True)``, once over
``DataLoader(GranaryDataset(...))``. Both decode with
``torchvision.io.decode_jpeg`` in the DataLoader workers, so the difference
is how the bytes reach the decoder. The last line is one JSON object:
``{"bench":"train","granary_img_per_s":…,"imagefolder_img_per_s":…}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
try:
    import granary  # noqa: F401
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(REPO / "client-c" / "python"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from granary.agent import LocalAgent  # noqa: E402
from granary.make_dataset import make_jpeg  # noqa: E402
from granary.torch import GranaryDataset, decode_jpeg  # noqa: E402


def small_cnn(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(64, classes),
    )


def read_jpeg(path: str) -> torch.Tensor:
    """ImageFolder's loader: the file's bytes, decoded like Granary's."""
    from torchvision.io import read_file

    return decode_jpeg(read_file(path))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def normalise(x: torch.Tensor) -> torch.Tensor:
    return (x.float() / 255.0 - 0.5) / 0.25


def train_one_epoch(loader, classes: int, seed: int, lr: float, train: bool = True) -> dict:
    torch.manual_seed(seed)
    model = small_cnn(classes)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    n = correct = 0
    loss_sum = 0.0
    wait = 0.0
    t0 = time.monotonic()
    t_ready = t0
    it = iter(loader)
    while True:
        t_wait = time.monotonic()
        try:
            xs, ys = next(it)
        except StopIteration:
            break
        wait += time.monotonic() - t_wait
        if n == 0:
            t_ready = time.monotonic()
        if not train:  # loader only: decode and hand over, no model
            n += len(ys)
            continue
        xs = normalise(xs)
        out = model(xs)
        loss = loss_fn(out, ys)
        opt.zero_grad()
        loss.backward()
        opt.step()
        n += len(ys)
        correct += int((out.argmax(1) == ys).sum())
        loss_sum += float(loss.detach()) * len(ys)
    dt = time.monotonic() - t0
    return {
        "images": n,
        "seconds": dt,
        "img_per_s": n / dt,
        "first_batch_s": t_ready - t0,
        "data_wait_s": wait,
        "loss": loss_sum / max(n, 1),
        "accuracy": correct / max(n, 1),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(REPO / ".granary-data" / "jpeg-train"), help="JPEG dataset folder")
    p.add_argument("--files", type=int, default=6000, help="images to generate if the folder is empty")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--size", type=int, default=64, help="image width and height")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    p.add_argument("--threads", type=int, default=0, help="torch threads in the training process (0: default)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--socket", help="use this running agent (dataset --dataset) instead of a private one")
    p.add_argument("--dataset", default="train")
    p.add_argument("--loader-only", action="store_true",
                   help="only load and decode (no model): the data path's own throughput")
    p.add_argument("--order", default="imagefolder,granary", choices=["imagefolder,granary", "granary,imagefolder"],
                   help="which loader trains first")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)

    import torchvision

    t0 = time.monotonic()
    r = make_jpeg(a.data, a.files, a.classes, a.size, seed=a.seed, progress=True)
    print(f"dataset: {r['files']} JPEGs ({a.size}x{a.size}, {a.classes} classes), "
          f"{r['total_bytes'] / 1e6:.1f} MB in {a.data} "
          f"({'already there' if r['skipped'] else f'written in {time.monotonic() - t0:.1f} s'})")
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, {os.cpu_count()} CPUs, "
          f"{torch.get_num_threads()} torch threads, {a.workers} DataLoader workers, batch {a.batch_size}")

    def run_imagefolder():
        folder = torchvision.datasets.ImageFolder(a.data, loader=read_jpeg)
        loader = DataLoader(folder, batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                            generator=torch.Generator().manual_seed(a.seed))
        return train_one_epoch(loader, a.classes, a.seed, a.lr, not a.loader_only)

    def run_granary():
        agent = None
        socket = a.socket
        if socket is None:
            agent = LocalAgent({a.dataset: a.data}).start()
            socket = agent.socket
        try:
            ds = GranaryDataset(a.dataset, socket, batch_size=a.batch_size, seed=a.seed, decode=decode_jpeg,
                                batches=True)
            loader = DataLoader(ds, batch_size=None, num_workers=a.workers)
            cpu0 = cpu_seconds(agent.proc.pid) if agent else None
            r = train_one_epoch(loader, a.classes, a.seed, a.lr, not a.loader_only)
            if agent:
                r["agent_cpu_s"] = cpu_seconds(agent.proc.pid) - cpu0
            return r
        finally:
            if agent is not None:
                agent.stop()

    results = {}
    runs = {"imagefolder": run_imagefolder, "granary": run_granary}
    order = a.order.split(",")
    for name in order:
        results[name] = runs[name]()

    for name, r in results.items():
        line = (f"{name:>11}: {r['images']} images in {r['seconds']:.2f} s = {r['img_per_s']:.0f} img/s; "
                f"first batch {r['first_batch_s']:.2f} s, waiting for data {r['data_wait_s']:.2f} s")
        if not a.loader_only:
            line += f"; loss {r['loss']:.3f}, train accuracy {r['accuracy']:.1%}"
        print(line)
    if "agent_cpu_s" in results["granary"]:
        r = results["granary"]
        print(f"granaryd used {r['agent_cpu_s']:.1f} s of CPU during the Granary epoch "
              f"({r['agent_cpu_s'] / r['seconds']:.0%} of one core)")
    ok = all(r["images"] == results["imagefolder"]["images"] for r in results.values())
    if not ok:
        print("error: the two loaders delivered different numbers of images", file=sys.stderr)
    print(json.dumps({
        "bench": "train",
        "mode": "loader-only" if a.loader_only else "train",
        "granary_img_per_s": round(results["granary"]["img_per_s"], 1),
        "imagefolder_img_per_s": round(results["imagefolder"]["img_per_s"], 1),
        "images": results["granary"]["images"],
        "granary_data_wait_s": round(results["granary"]["data_wait_s"], 3),
        "imagefolder_data_wait_s": round(results["imagefolder"]["data_wait_s"], 3),
        "granaryd_cpu_s": round(results["granary"]["agent_cpu_s"], 2) if "agent_cpu_s" in results["granary"] else None,
    }))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
