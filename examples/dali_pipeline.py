#!/usr/bin/env python3
"""NVIDIA DALI fed by Granary: fn.external_source over Granary batches.

Granary hands out each batch's JPEG bytes in place (numpy views into the
agent's arena); DALI decodes, resizes and normalises them. On a machine
without a GPU the pipeline runs on the CPU (``--device cpu``, the default
there); with one, ``--device gpu`` decodes on the GPU ("mixed" decoder).

    python -m granary.make_dataset --jpeg /tmp/jpegs --files 2000
    python examples/dali_pipeline.py --data /tmp/jpegs            # starts its own agent
    python examples/dali_pipeline.py --socket /run/granary/granary.sock --dataset imagenet

Needs ``pip install nvidia-dali-cuda130`` (or the build for your CUDA), the
``granary`` package (``pip install ./client-c/python``) and numpy.

Zero copy into DALI: with ``no_copy=True`` DALI reads the views directly, so
a Granary batch is released only after DALI can no longer be using it
(``prefetch_queue_depth + 1`` iterations later). Without it, DALI copies each
batch into its own buffers when it is fed, and the batch is released on the
next call.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

import numpy as np

import granary


class GranarySource:
    """An iterable for ``fn.external_source(num_outputs=2, batch=True)``:
    each item is ``([jpeg bytes as uint8 arrays], [labels as int32 arrays])``,
    one Granary batch. Each epoch is one session; StopIteration ends it, and
    the next call after that starts the next epoch."""

    def __init__(self, dataset: str, socket: str | None = None, *, batch_size: int = 64, seed: int = 0,
                 epoch: int = 0, rank: int = 0, world_size: int = 1, hold: int = 1, timeout: float = 30.0):
        self.options = dict(batch_size=batch_size, seed=seed, first_epoch=epoch, epochs=1, rank=rank,
                            world_size=world_size, timeout=timeout)
        self.dataset = dataset
        self.socket = socket
        self.hold = max(hold, 1)
        self.session = None
        self.held: collections.deque = collections.deque()
        self.ids: list[int] = []  # ids delivered, in order (for checks)

    def __iter__(self):
        return self

    def __next__(self):
        # DALI calls iter() once and, after a StopIteration and the
        # pipeline's reset(), next() again: that starts the next epoch.
        if self.session is None:
            self.session = granary.open_session(self.dataset, self.socket, **self.options)
            self.options["first_epoch"] += 1
        while len(self.held) >= self.hold:
            self.held.popleft().release()
        try:
            batch = self.session.next_batch()
        except granary.EndOfStream:
            self.close()
            raise StopIteration
        if batch.status != 0:
            err = batch.error
            batch.release()
            raise err
        self.held.append(batch)
        data = [s.numpy() for s in batch]  # views into the arena, no copy
        labels = [np.array([s.label], dtype=np.int32) for s in batch]
        self.ids.extend(s.id for s in batch)
        return data, labels

    def close(self):
        while self.held:
            self.held.popleft().release()
        if self.session is not None:
            self.session.close()
            self.session = None


def build_pipeline(source: GranarySource, *, batch_size: int, device: str = "cpu", size: int = 64,
                   num_threads: int = 2, no_copy: bool = True, prefetch_queue_depth: int = 2):
    from nvidia.dali import fn, pipeline_def, types

    source.hold = prefetch_queue_depth + 1 if no_copy else 1

    @pipeline_def(batch_size=batch_size, num_threads=num_threads,
                  device_id=0 if device == "gpu" else None, prefetch_queue_depth=prefetch_queue_depth)
    def granary_pipeline():
        jpegs, labels = fn.external_source(source=source, num_outputs=2, batch=True,
                                           dtype=[types.UINT8, types.INT32], no_copy=no_copy)
        images = fn.decoders.image(jpegs, device="mixed" if device == "gpu" else "cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=size, resize_y=size)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[0.5 * 255] * 3, std=[0.25 * 255] * 3)
        return images, labels

    return granary_pipeline()


def run_epoch(pipe) -> tuple[int, list[int], tuple]:
    """Runs the pipeline until the source ends; returns (images, labels, image shape)."""
    n, labels, shape = 0, [], ()
    while True:
        try:
            images, lab = pipe.run()
        except StopIteration:
            break
        if hasattr(images, "as_cpu"):
            images = images.as_cpu()
        arr = images.as_array()
        shape = arr.shape[1:]
        n += arr.shape[0]
        labels += [int(x) for x in lab.as_array().reshape(-1)]
    pipe.reset()
    return n, labels, shape


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="a JPEG dataset folder; starts a private granaryd serving it")
    p.add_argument("--socket", help="an agent's socket (instead of --data)")
    p.add_argument("--dataset", default="jpeg", help="dataset name on the agent (default jpeg)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--copy", action="store_true", help="let DALI copy each batch (no_copy=False)")
    a = p.parse_args(argv)
    try:
        import nvidia.dali  # noqa: F401
    except ImportError as e:
        print(f"DALI: SKIPPED: nvidia-dali is not installed ({e}); pip install nvidia-dali-cuda130")
        return 2
    agent = None
    socket = a.socket
    if a.data:
        from granary.agent import LocalAgent

        agent = LocalAgent({a.dataset: a.data}).start()
        socket = agent.socket
    try:
        source = GranarySource(a.dataset, socket, batch_size=a.batch_size)
        pipe = build_pipeline(source, batch_size=a.batch_size, device=a.device, no_copy=not a.copy)
        pipe.build()
        for epoch in range(a.epochs):
            t0 = time.monotonic()
            n, labels, shape = run_epoch(pipe)
            dt = time.monotonic() - t0
            print(f"epoch {epoch}: {n} images {shape} through DALI ({a.device}) in {dt:.2f} s, "
                  f"{n / dt:.0f} images/s; classes seen: {sorted(set(labels))}")
        source.close()
    finally:
        if agent is not None:
            agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
