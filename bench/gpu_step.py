#!/usr/bin/env python3
"""A real GPU step fed by three loaders: how long the GPU waits for data.

    GRANARY_LIB=... GRANARYD=... python3 bench/gpu_step.py [--model resnet50]
        [--batch 64] [--samples 2048] [--steps 30] [--warmup 5] [--workers 4]

Each sample is a prepared 3x224x224 uint8 image (raw bytes in a file, as
the agent would cache a decoded sample); the step is ResNet-50 forward and
backward (bf16 autocast, channels_last, SGD) on synthetic labels, made
synchronous (as `bench/run stall` models a step), so the time spent getting
the next batch onto the GPU is the GPU's idle time. Loaders:

  granary_main     GranaryDataset(batches=True, pin_memory=True) iterated in
                   the training process, granary.cuda.to_device (the arena,
                   registered, straight to the GPU; no worker, no hand-over)
  granary_thread   the same, through granary.cuda.prefetch: one thread of
                   the training process fetches two batches ahead and
                   transfers them on its own CUDA stream
  granary_workers  the same dataset through DataLoader(batch_size=None,
                   num_workers=--workers, pin_memory=True): the hand-over
                   through shared memory, then the DataLoader's pinning
  local_files      DataLoader over the same files on local disk (page cache
                   warm), shuffle, num_workers=--workers, pin_memory=True

Prints one line per loader, then one JSON object with every loader's
figures (keyed by loader name). Without CUDA
(--model tiny --device cpu) it checks the plumbing only.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

REPO = Path(__file__).resolve().parent.parent
# This checkout's package, not one installed earlier.
sys.path.insert(0, str(REPO / "client-c" / "python"))
from granary import cuda as gcuda  # noqa: E402
from granary.agent import LocalAgent  # noqa: E402
from granary.torch import GranaryDataset  # noqa: E402

SHAPE = (3, 224, 224)
NBYTES = 3 * 224 * 224
CLASSES = 10


def write_dataset(root: Path, n: int) -> None:
    g = torch.Generator().manual_seed(0)
    for i in range(n):
        d = root / f"class_{i % CLASSES:03d}"
        d.mkdir(exist_ok=True)
        (d / f"img_{i:06d}.raw").write_bytes(
            torch.randint(0, 256, (NBYTES,), dtype=torch.uint8, generator=g).numpy().tobytes())


class LocalFiles(Dataset):
    def __init__(self, root: Path):
        self.paths = sorted(root.glob("class_*/*.raw"))

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        p = self.paths[i]
        with open(p, "rb") as f:
            x = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
        return x.view(SHAPE), int(p.parent.name.split("_")[1])


def model_and_step(name: str, device):
    if name == "tiny":
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 7, stride=4), torch.nn.AdaptiveAvgPool2d(1),
                                    torch.nn.Flatten(), torch.nn.Linear(8, CLASSES))
    else:
        import torchvision

        model = getattr(torchvision.models, name)(num_classes=CLASSES)
    model = model.to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    def step(xs, ys):
        x = ((xs.float() - mean) / std).contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = loss_fn(model(x), ys)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return loss

    return step


def run(name, batches, step, device, warmup, steps):
    it = iter(batches)
    for _ in range(warmup):
        xs, ys = next(it)
        step(xs, ys)
    waits, busy = [], []
    t0 = time.perf_counter()
    for _ in range(steps):
        s = time.perf_counter()
        try:
            xs, ys = next(it)
        except StopIteration:
            break
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()  # the batch is on the GPU
        m = time.perf_counter()
        step(xs, ys)
        waits.append(m - s)
        busy.append(time.perf_counter() - m)
    wall = time.perf_counter() - t0
    del it
    res = {"loader": name, "steps": len(waits), "wall_s": wall, "idle": sum(waits) / wall,
           "wait_ms_mean": 1e3 * sum(waits) / len(waits), "step_ms_mean": 1e3 * sum(busy) / len(busy),
           "img_per_s": len(waits) * xs.shape[0] / wall}
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--root", help="dataset folder (default: a temporary one)")
    a = ap.parse_args()
    device = torch.device(a.device)
    root = Path(a.root or tempfile.mkdtemp(prefix="gpu_step_"))
    root.mkdir(parents=True, exist_ok=True)
    if not any(root.glob("class_*/*.raw")):
        t = time.perf_counter()
        write_dataset(root, a.samples)
        print(f"wrote {a.samples} samples of {NBYTES} bytes in {time.perf_counter() - t:.1f} s", flush=True)
    step = model_and_step(a.model, device)
    epochs = 1 + (a.warmup + a.steps) * a.batch // a.samples
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    results = []
    with LocalAgent({"prepared": root}) as agent:
        def granary_ds():
            return GranaryDataset("prepared", agent.socket, batch_size=a.batch, seed=1, epochs=epochs,
                                  batches=True, pin_memory=device.type == "cuda",
                                  collate=lambda xs, ys: (gcuda.stack_pinned(xs).view(len(xs), *SHAPE),
                                                          torch.tensor(ys, dtype=torch.int64)))

        def main_process():
            for xs, ys in granary_ds():
                yield gcuda.to_device((xs, ys), device)

        def thread():
            return gcuda.prefetch(granary_ds(), device, depth=2)

        def workers():
            loader = DataLoader(granary_ds(), batch_size=None, num_workers=a.workers,
                                pin_memory=device.type == "cuda", multiprocessing_context="fork")
            for xs, ys in loader:
                yield xs.to(device, non_blocking=True), ys.to(device, non_blocking=True)

        def local():
            loader = DataLoader(LocalFiles(root), batch_size=a.batch, shuffle=True, num_workers=a.workers,
                                pin_memory=device.type == "cuda", multiprocessing_context="fork",
                                persistent_workers=False, drop_last=True)
            while True:
                for xs, ys in loader:
                    yield xs.to(device, non_blocking=True), ys.to(device, non_blocking=True)

        for name, gen in (("granary_main", main_process), ("granary_thread", thread),
                          ("granary_workers", workers), ("local_files", local)):
            res = run(name, gen(), step, device, a.warmup, a.steps)
            res.update(device=dev_name, model=a.model, batch=a.batch, workers=0 if name.startswith(("granary_main", "granary_thread")) else a.workers)
            results.append(res)
            print(f"{name:16s} idle {100 * res['idle']:5.1f} %  wait {res['wait_ms_mean']:7.2f} ms  "
                  f"step {res['step_ms_mean']:7.2f} ms  {res['img_per_s']:8.1f} img/s  ({dev_name}, {a.model}, "
                  f"batch {a.batch})", flush=True)
            gcuda.wait_pending()
    # The result: one JSON object, the last line (every loader's figures).
    print(json.dumps({"benchmark": "gpu_step", "loaders": {r["loader"]: r for r in results}}))


if __name__ == "__main__":
    main()
