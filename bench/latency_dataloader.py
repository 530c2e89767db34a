#!/usr/bin/env python3
"""The PyTorch baseline of `bench/run latency`: a DataLoader over a map-style
Dataset that does one boto3 `get_object` per sample and reads the body.

    latency_dataloader.py --endpoint http://127.0.0.1:PORT --bucket B \
        --keys KEYS.tsv --workers 8 [--batch 32] [--warmup-s 2] [--window-s 12]

KEYS.tsv holds one `key<TAB>size` line per sample. Credentials and region
come from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION.

Every body is read whole and checked cheaply: its length must be the
listed size and it must start with the synthetic generator's magic. The
sampler draws permutation after permutation of the dataset, so a
measurement never straddles the end of an epoch (no drain, no worker
restart). Each worker counts the samples it finished in a shared array;
measurement starts `--warmup-s` seconds after every worker has finished
its first sample (worker start-up and boto3 client creation excluded) and
lasts `--window-s` seconds. The rate is counted where the samples are
fetched (the workers) and, as a check, where they are consumed (batches
reaching the main process).

The last line printed is one JSON object. The process then kills its
workers and exits at once, so no request of this run overlaps the next one.
"""

import argparse
import multiprocessing
import threading
import time
import warnings

import boto3
import botocore
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

from bench_procs import children_cpu_seconds, finish as finish_run
from s3_samples import ProcessClient, read_keys

MAGIC = b"GRNSYNTH"


class S3Samples(Dataset):
    """Sample i is object keys[i]; one GET each, body read in full."""

    def __init__(self, endpoint, bucket, keys, sizes, counts, nbytes):
        self.s3 = ProcessClient(endpoint, pool=4)
        self.bucket = bucket
        self.keys = keys
        self.sizes = sizes
        self.counts = counts
        self.nbytes = nbytes

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, i):
        body = self.s3.get().get_object(Bucket=self.bucket, Key=self.keys[i])["Body"].read()
        if len(body) != self.sizes[i] or body[:8] != MAGIC:
            raise RuntimeError(
                f"{self.keys[i]}: {len(body)} bytes (expected {self.sizes[i]}), starts {body[:8]!r}"
            )
        info = torch.utils.data.get_worker_info()
        w = info.id if info is not None else 0
        self.counts[w] += 1
        self.nbytes[w] += len(body)
        return len(body)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--bucket", required=True)
    ap.add_argument("--keys", required=True)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--window-s", type=float, default=12.0)
    ap.add_argument("--start-limit-s", type=float, default=120.0,
                    help="give up when the workers have not all started by then")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--marks", action="store_true",
                    help="print `mark window-start` / `mark window-end` lines as the window opens and closes")
    a = ap.parse_args()
    # More workers than CPUs is the point of the higher worker counts here.
    warnings.filterwarnings("ignore", message=".*worker processes in total.*")

    keys, sizes = read_keys(a.keys)
    counts = multiprocessing.RawArray("q", max(a.workers, 1))
    nbytes = multiprocessing.RawArray("q", max(a.workers, 1))
    ds = S3Samples(a.endpoint, a.bucket, keys, sizes, counts, nbytes)
    g = torch.Generator()
    g.manual_seed(a.seed)
    sampler = RandomSampler(ds, replacement=False, num_samples=len(ds) * 1000, generator=g)
    loader = DataLoader(ds, batch_size=a.batch, sampler=sampler, num_workers=a.workers,
                        multiprocessing_context="fork" if a.workers > 0 else None)

    def mark(what):
        if a.marks:
            print(f"mark {what}", flush=True)

    t_start = time.monotonic()
    delivered = []  # (time, samples) per batch reaching the main process
    lock = threading.Lock()  # one of the two threads ends the process

    def finish(code, message=None, result=None):
        with lock:
            finish_run("latency_dataloader", code, message, result)

    def measure():
        # The window is timed here, not by the main loop: at long round trips
        # a batch takes seconds to arrive, and waiting for the next one would
        # stretch the run (the result does not depend on it).
        while min(counts) == 0:
            if time.monotonic() - t_start > a.start_limit_s:
                finish(1, f"workers not all started after {a.start_limit_s} s: {list(counts)}")
            time.sleep(0.01)
        ramp = time.monotonic() - t_start
        time.sleep(a.warmup_s)
        t0 = time.monotonic()
        n0, b0, cpu0 = sum(counts), sum(nbytes), children_cpu_seconds()
        mark("window-start")
        time.sleep(a.window_s)
        t1 = time.monotonic()
        n1, b1, cpu1 = sum(counts), sum(nbytes), children_cpu_seconds()
        mark("window-end")
        span = t1 - t0
        got = sum(s for t, s in list(delivered) if t0 <= t < t1)
        finish(0, result={
            "workers": a.workers,
            "batch": a.batch,
            "samples_per_s": (n1 - n0) / span,
            "mb_per_s": (b1 - b0) / span / 1e6,
            "delivered_per_s": got / span,
            "samples": n1 - n0,
            "window_s": span,
            "ramp_s": ramp,
            "warmup_s": a.warmup_s,
            "cpu_cores": (cpu1 - cpu0) / span,
            "torch": torch.__version__,
            "boto3": boto3.__version__,
            "botocore": botocore.__version__,
        })

    threading.Thread(target=measure, daemon=True).start()
    try:
        for batch in loader:
            delivered.append((time.monotonic(), len(batch)))
    except Exception as e:  # a worker's error arrives here
        finish(1, f"{type(e).__name__}: {e}")
    finish(1, "the sampler ran out")


if __name__ == "__main__":
    main()
