#!/usr/bin/env python3
"""One contender of `bench/run stall`: a training loop whose GPU step is a
sleep (or, with --gpu-step, a real forward and backward pass), fed by one
data loader, timed batch by batch.

    stall_train.py --contender NAME --batch 32 --step-ms 20 \
        [--gpu-step resnet50|tiny] [--warmup-batches 5] [--batches 200] \
        [--window-s 20] [--marks] ...

Contenders (every one delivers the same thing to the loop: per batch, the
samples' bytes concatenated into one uint8 tensor, their lengths and their
labels; every sample's length and magic are checked):

  local           DataLoader over the dataset's files on local disk (the
                  GPU step's calibration), --workers processes
  granary_main    the default path: granary.torch.GranaryDataset(batches=True)
                  iterated in the training process through
                  granary.cuda.prefetch (one thread fetching two batches
                  ahead; with a GPU step on CUDA, the arena registered and
                  each batch's samples sent to the GPU from where they lie
                  on the prefetch thread's stream); needs --socket and
                  --dataset
  granary         granary.torch.GranaryDataset(batches=True) through a
                  DataLoader(batch_size=None), --workers processes; needs
                  --socket and --dataset
  boto3           DataLoader over a map-style Dataset doing one boto3
                  get_object per sample, --workers processes
  boto3_threads   the same, each worker fetching its batch with a pool of
                  --threads threads (Dataset.__getitems__)
  s3torch_map     s3torchconnector's S3MapDataset.from_objects,
                  DataLoader(shuffle=True), --workers processes
  s3torch_iter    s3torchconnector's S3IterableDataset.from_objects
                  (enable_sharding=True, keys in shuffled order),
                  --workers processes
  streaming       mosaicml-streaming's StreamingDataset over the MDS shards
                  bench/stall_shards.py wrote into the store (--remote), cached
                  in --cache (a fresh folder per run), shuffle=True,
                  --workers processes
  litdata         litdata's StreamingDataset over the chunks litdata.optimize
                  wrote (bench/stall_shards.py; --remote, --cache as for
                  streaming), shuffle=True, its StreamingDataLoader with
                  --workers processes
  webdataset      webdataset.WebDataset over tar shards (--remote), each read
                  with `pipe:curl` on a presigned URL through the proxy,
                  shard shuffle and a 1,000-sample shuffle buffer, batched in
                  the workers, WebLoader with --workers processes; with
                  --decoder pil, its README's pipeline: `.decode("pil")`
                  (the `x` member renamed `jpg` for its image handler), then
                  torchvision transforms
  dali            --decode only: NVIDIA DALI on the CPU (device_id=None),
                  its `fn.readers.webdataset` over the webdataset
                  contender's tar shards, downloaded through the proxy into
                  --cache (a fresh folder per run) at start, random_shuffle
                  with a 1,000-sample buffer (initial_fill) and the shards in
                  shuffled order, `fn.decoders.image(device="cpu")` and
                  `fn.resize` on --workers DALI threads, read through its
                  PyTorch plugin (DALIGenericIterator)

With --decode SIDE the samples are JPEGs, each decoded and resized to SIDE
x SIDE RGB by --decoder (torchvision, pil or dali: the one the
contender's docs recommend; bench/stall_decode.py has each with its
reference), and every decoded sample's shape is checked.

With --gpu-step MODEL the step is MODEL's forward and backward pass (bf16
autocast, channels_last, SGD, synthetic labels from the batch's labels)
on the batch itself: its bytes are moved to the device (from pinned memory,
non_blocking, for the DataLoader contenders: `pin_memory=True`), repeated or
cut to batch x 3 x 224 x 224 (x 32 x 32 for `tiny`) and scaled to [0, 1];
the step ends with a synchronisation, so the time in `next()` is the time
the GPU had nothing to do. The step's mean time is reported
(`gpu_step_ms`). CUDA is used when present, else the CPU (`tiny` checks
the plumbing on a machine without a GPU).

The loop: `--warmup-batches` batches (worker start-up, first requests) are
consumed and not measured, more until `--warmup-s` seconds after the first
batch; then batches are measured until `--batches` or
`--window-s` seconds, whichever comes first. For each measured batch the
time spent in `next()` is the GPU's wait; the GPU step then sleeps
`--step-ms` (no CPU). With `--marks`, `mark window-start` and `mark
window-end` lines let the caller read CPU counters at the window's edges.
The last line is one JSON object; the process then kills its workers and
exits at once.
"""

import argparse
import os
import random
import sys
import time
import warnings
import zlib
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

from bench_procs import finish as finish_run
from s3_samples import ProcessClient, read_keys

MAGIC = b"GRNSYNTH"
REPO = Path(__file__).resolve().parent.parent
#: --decode: the side every sample is decoded and resized to (0: bytes).
DECODE = [0]
#: --decoder: how the contender decodes (bench/stall_decode.py's DECODERS).
DECODER = ["torchvision"]


def label_of(key):
    """The class folder of `prefix/class/file` (the synthetic tree's layout)."""
    parts = key.split("/")
    return zlib.crc32(parts[-2].encode()) % 1000 if len(parts) >= 2 else 0


def as_sample(body, expected, key):
    if DECODE[0]:
        if len(body) != expected:
            raise RuntimeError(f"{key}: {len(body)} bytes (expected {expected})")
        from stall_decode import decoder

        return checked(decoder(DECODER[0])(body, DECODE[0]), key)
    if len(body) != expected or bytes(body[:8]) != MAGIC:
        raise RuntimeError(f"{key}: {len(body)} bytes (expected {expected}), starts {bytes(body[:8])!r}")
    return torch.frombuffer(bytearray(body), dtype=torch.uint8)


def checked(x, key):
    """A decoded sample: flat, 3 x side x side values."""
    if x.numel() != 3 * DECODE[0] * DECODE[0]:
        raise RuntimeError(f"{key}: decoded to {x.numel()} values (expected 3 x {DECODE[0]} x {DECODE[0]})")
    return x


def flat_collate(items):
    """[(uint8 tensor, label)] -> (all bytes in one tensor, lengths, labels)."""
    xs = [x for x, _ in items]
    lengths = torch.tensor([len(x) for x in xs], dtype=torch.int64)
    labels = torch.tensor([int(y) for _, y in items], dtype=torch.int64)
    return torch.cat(xs), lengths, labels


class LocalFiles(Dataset):
    """Sample i is file root/keys[i] (prefix stripped), read whole."""

    def __init__(self, root, keys, sizes):
        self.paths = [os.path.join(root, k.split("/", 1)[1]) for k in keys]
        self.keys, self.sizes = keys, sizes

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            body = f.read()
        return as_sample(body, self.sizes[i], self.keys[i]), label_of(self.keys[i])


class Boto3Samples(Dataset):
    """Sample i is object keys[i]: one get_object, body read whole."""

    def __init__(self, endpoint, bucket, keys, sizes, pool):
        self.s3 = ProcessClient(endpoint, pool)
        self.bucket, self.keys, self.sizes = bucket, keys, sizes

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, i):
        body = self.s3.get().get_object(Bucket=self.bucket, Key=self.keys[i])["Body"].read()
        return as_sample(body, self.sizes[i], self.keys[i]), label_of(self.keys[i])


class Boto3ThreadedSamples(Boto3Samples):
    """The ConcurrentDataloader recipe: a worker fetches its whole batch with
    a pool of threads (one boto3 client, thread-safe, shared by the pool)."""

    def __init__(self, endpoint, bucket, keys, sizes, threads):
        super().__init__(endpoint, bucket, keys, sizes, pool=threads)
        self.threads = threads
        self._pool = None
        self._pool_pid = None

    def __getitems__(self, indices):
        from concurrent.futures import ThreadPoolExecutor

        if self._pool is None or self._pool_pid != os.getpid():
            self.s3.get()
            self._pool = ThreadPoolExecutor(max_workers=self.threads)
            self._pool_pid = os.getpid()
        return list(self._pool.map(self.__getitem__, indices))


def s3torch_config():
    from s3torchconnector import S3ClientConfig

    # SeaweedFS serves buckets by path, not by virtual host.
    return S3ClientConfig(force_path_style=True)


def use_checkouts_package():
    """The `granary` package of this checkout, not one installed earlier:
    the benchmark measures this tree's library."""
    path = str(REPO / "client-c" / "python")
    if path not in sys.path:
        sys.path.insert(0, path)
    mod = sys.modules.get("granary")
    if mod is not None and not str(getattr(mod, "__file__", "")).startswith(path):
        raise RuntimeError(f"granary was imported from {mod.__file__} before the checkout's")


def gpu_wanted(a):
    """A real step on CUDA: the loaders then hand over page-locked memory."""
    return a.gpu_step is not None and torch.cuda.is_available()


def build_loader(a):
    mp = {"multiprocessing_context": "fork"} if a.workers > 0 else {}
    # With a real GPU step, every DataLoader pins its batches (the usual
    # recipe), so the step's copy to the device is DMA.
    mp["pin_memory"] = gpu_wanted(a)
    if DECODE[0] and a.workers > 0:
        # --decode windows come after a whole epoch and cross epochs: the
        # workers stay (the usual setting of a multi-epoch job), rather
        # than being started again, and their shards opened again, at
        # every epoch.
        mp["persistent_workers"] = True
    g = torch.Generator()
    g.manual_seed(a.seed)
    c = a.contender
    if c == "granary_main":
        use_checkouts_package()
        from granary import cuda as gcuda
        from granary.torch import GranaryDataset

        gpu = gpu_wanted(a)

        def collate_main(xs, labels):
            if DECODE[0]:
                # Prepared by the agent: (side, side, 3) views of the arena.
                xs = [x.reshape(-1) for x in xs]
                if any(len(x) != 3 * DECODE[0] * DECODE[0] for x in xs):
                    raise RuntimeError("a prepared sample of another shape")
            else:
                for x in xs:
                    if bytes(x[:8].numpy()) != MAGIC:
                        raise RuntimeError("a sample without the synthetic header")
            lengths = torch.tensor([len(x) for x in xs], dtype=torch.int64)
            # For the GPU the samples stay views of the (registered) arena
            # and go to the device from where they lie; without one, the
            # loop's contract is one tensor of the batch's bytes.
            return (list(xs) if gpu else torch.cat(list(xs))), lengths, labels

        ds = GranaryDataset(a.dataset, a.socket, batch_size=a.batch, seed=a.seed, batches=True,
                            collate=collate_main, epochs=a.epochs, timeout=120.0, pin_memory=gpu)
        return gcuda.prefetch(ds, "cuda" if gpu else "cpu", depth=2)
    if c == "granary":
        use_checkouts_package()
        from granary.torch import GranaryDataset

        def collate(xs, labels):
            if not DECODE[0]:
                for x in xs:
                    if bytes(x[:8].numpy()) != MAGIC:
                        raise RuntimeError("a sample without the synthetic header")
            return torch.cat(list(xs)), torch.tensor([len(x) for x in xs], dtype=torch.int64), labels

        decode = None
        if DECODE[0]:
            from stall_decode import decoder

            decode_jpeg, side = decoder(DECODER[0]), DECODE[0]

            def decode(x):
                return checked(decode_jpeg(x, side), "a granary sample")

        ds = GranaryDataset(a.dataset, a.socket, batch_size=a.batch, seed=a.seed, batches=True,
                            collate=collate, epochs=a.epochs, timeout=120.0, decode=decode)
        return DataLoader(ds, batch_size=None, num_workers=a.workers, **mp)
    keys, sizes = read_keys(a.keys)
    if c in ("local", "boto3", "boto3_threads", "s3torch_map"):
        if c == "local":
            ds = LocalFiles(a.local_root, keys, sizes)
        elif c == "boto3":
            ds = Boto3Samples(a.endpoint, a.bucket, keys, sizes, pool=4)
        elif c == "boto3_threads":
            ds = Boto3ThreadedSamples(a.endpoint, a.bucket, keys, sizes, threads=a.threads)
        else:
            from s3torchconnector import S3MapDataset

            size_of = dict(zip(keys, sizes))

            def transform(obj):
                key = obj.key
                return as_sample(obj.read(), size_of[key], key), label_of(key)

            ds = S3MapDataset.from_objects([f"s3://{a.bucket}/{k}" for k in keys], region=a.region,
                                           endpoint=a.endpoint, transform=transform,
                                           s3client_config=s3torch_config())
        # Permutation after permutation: the window never crosses an epoch's end.
        sampler = RandomSampler(ds, replacement=False, num_samples=len(keys) * 100, generator=g)
        return DataLoader(ds, batch_size=a.batch, sampler=sampler, num_workers=a.workers,
                          collate_fn=flat_collate, **mp)
    if c == "s3torch_iter":
        from s3torchconnector import S3IterableDataset

        size_of = dict(zip(keys, sizes))
        order = list(keys)
        random.Random(a.seed).shuffle(order)

        def transform(obj):
            key = obj.key
            return as_sample(obj.read(), size_of[key], key), label_of(key)

        ds = S3IterableDataset.from_objects([f"s3://{a.bucket}/{k}" for k in order], region=a.region,
                                            endpoint=a.endpoint, transform=transform, enable_sharding=True,
                                            s3client_config=s3torch_config())
        return DataLoader(ds, batch_size=a.batch, num_workers=a.workers, collate_fn=flat_collate, **mp)
    if c == "streaming":
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        # Earlier runs were killed; their shared memory must not confuse this one.
        clean_stale_shared_memory()

        class MdsSamples(StreamingDataset):
            def __getitem__(self, i):
                obj = super().__getitem__(i)
                return as_sample(obj["x"], obj["n"], f"mds sample {i}"), obj["y"]

        # S3_ENDPOINT_URL (set by the caller) points the library's boto3 client at the proxy.
        ds = MdsSamples(remote=a.remote, local=a.cache, shuffle=True, shuffle_seed=a.seed, batch_size=a.batch)
        return DataLoader(ds, batch_size=a.batch, num_workers=a.workers, collate_fn=flat_collate, **mp)
    if c == "litdata":
        import litdata
        from botocore.config import Config

        class LitdataSamples(litdata.StreamingDataset):
            def __getitem__(self, i):
                obj = super().__getitem__(i)
                return as_sample(obj["x"], obj["n"], f"litdata sample {i}"), obj["y"]

        # The boto3 client's options: the proxy, path-style addressing (as
        # SeaweedFS serves buckets) and the same retry rule as the boto3
        # contenders (botocore's standard mode) in place of litdata's own.
        import litdata.streaming.downloader as litdata_downloader

        # litdata downloads chunks with obstore, built from the boto3 client's
        # endpoint, and object_store refuses a plain-http endpoint unless its
        # client is told to allow it, which litdata does not do (it expects
        # https): allowed here, so that litdata keeps its own fast path.
        litdata_downloader._OBSTORE_CLIENT_OPTIONS = {**litdata_downloader._OBSTORE_CLIENT_OPTIONS,
                                                       "allow_http": True}
        options = {"endpoint_url": a.endpoint,
                   "config": Config(s3={"addressing_style": "path"}, retries={"mode": "standard"})}
        ds = LitdataSamples(a.remote, cache_dir=a.cache, shuffle=True, seed=a.seed, storage_options=options)
        return litdata.StreamingDataLoader(ds, batch_size=a.batch, num_workers=a.workers,
                                           collate_fn=flat_collate, **mp)
    if c == "webdataset":
        import boto3
        import webdataset as wds
        from botocore.config import Config
        from urllib.parse import urlparse

        remote = urlparse(a.remote)
        bucket, prefix = remote.netloc, remote.path.strip("/") + "/"
        s3 = boto3.session.Session().client("s3", endpoint_url=a.endpoint,
                                            config=Config(s3={"addressing_style": "path"}))
        names = sorted(o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
                       for o in page.get("Contents", []) if o["Key"].endswith(".tar"))
        if not names:
            raise RuntimeError(f"no .tar shards under {a.remote}")
        # webdataset reads cloud shards through a command (its docs: `pipe:curl`
        # or `pipe:aws s3 cp`); presigned URLs let curl read them through the proxy.
        urls = [f"pipe:curl -sfS '{s3.generate_presigned_url('get_object', Params={'Bucket': bucket, 'Key': k}, ExpiresIn=7200)}'"
                for k in names]

        def sample(s):
            return as_sample(s["x"], int(s["n"]), s["__key__"]), int(s["y"])

        # empty_check=False: with fewer shards than workers (small runs) some
        # workers have none, which is not an error.
        ds = (wds.WebDataset(urls, shardshuffle=len(urls), seed=a.seed, workersplitter=wds.split_by_worker,
                             empty_check=False)
              .shuffle(1000))
        if DECODE[0] and DECODER[0] == "pil":
            from stall_decode import from_pil

            def length_checked(s):
                if len(s["x"]) != int(s["n"]):
                    raise RuntimeError(f"{s['__key__']}: {len(s['x'])} bytes (expected {int(s['n'])})")
                return s

            def pil_sample(s):
                return checked(from_pil(s["jpg"], DECODE[0]), s["__key__"]), int(s["y"])

            # Its README's pipeline: .decode("pil") (an image handler, by
            # extension: the samples' `x` member is its `jpg`), then
            # torchvision transforms on the PIL image.
            ds = ds.map(length_checked).rename(jpg="x").decode("pil").map(pil_sample)
        else:
            ds = ds.map(sample)
        ds = ds.batched(a.batch, collation_fn=flat_collate, partial=False)
        return wds.WebLoader(ds, batch_size=None, num_workers=a.workers, **mp)
    if c == "dali":
        return dali_loader(a)
    raise SystemExit(f"stall_train: unknown contender {c!r}")


def download_shards(a, suffix):
    """The shards under --remote whose names end with `suffix`, downloaded
    through --endpoint (the proxy) into --cache with --workers threads, in
    an order shuffled by --seed: their local paths."""
    from concurrent.futures import ThreadPoolExecutor
    from urllib.parse import urlparse

    import boto3
    from botocore.config import Config

    remote = urlparse(a.remote)
    bucket, prefix = remote.netloc, remote.path.strip("/") + "/"
    s3 = boto3.session.Session().client("s3", endpoint_url=a.endpoint,
                                        config=Config(s3={"addressing_style": "path"}))
    names = sorted(o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
                   for o in page.get("Contents", []) if o["Key"].endswith(suffix))
    if not names:
        raise RuntimeError(f"no {suffix} shards under {a.remote}")
    random.Random(a.seed).shuffle(names)
    os.makedirs(a.cache, exist_ok=True)
    paths = [os.path.join(a.cache, k.rsplit("/", 1)[-1]) for k in names]
    with ThreadPoolExecutor(max_workers=max(1, a.workers)) as pool:
        list(pool.map(lambda kp: s3.download_file(bucket, kp[0], kp[1]), zip(names, paths)))
    return paths


def dali_loader(a):
    """`--contender dali`: DALI's webdataset reader over the tar shards, its
    CPU decode and resize, read through DALIGenericIterator; yields what
    every loader yields (one flat uint8 tensor, lengths, labels)."""
    if not DECODE[0]:
        raise SystemExit("stall_train: the dali contender runs with --decode only")
    from nvidia.dali import fn, pipeline_def
    from nvidia.dali.plugin.base_iterator import LastBatchPolicy
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    from stall_decode import dali_images

    side, paths = DECODE[0], download_shards(a, ".tar")

    @pipeline_def(batch_size=a.batch, num_threads=max(1, a.workers), device_id=None, exec_dynamic=True,
                  seed=a.seed)
    def pipe():
        jpegs, y, n = fn.readers.webdataset(paths=paths, ext=["x", "y", "n"], missing_component_behavior="error",
                                            random_shuffle=True, initial_fill=1000, name="Reader")
        # The label and length members are decimal text: padded to one
        # width so that every output is a dense batch.
        pad = {"axes": (0,), "shape": (20,), "fill_value": 32}
        return dali_images(jpegs, side), fn.pad(y, **pad), fn.pad(n, **pad), jpegs.shape()

    p = pipe()
    p.build()
    it = DALIGenericIterator([p], ["x", "y", "n", "len"], reader_name="Reader", auto_reset=True,
                             last_batch_policy=LastBatchPolicy.DROP)

    def as_int(row):
        return int(bytes(row.numpy().tolist()).strip())

    class DaliBatches:
        def __iter__(self):
            for (d,) in it:
                x, n = d["x"], d["n"]
                lengths = [int(v) for v in d["len"].reshape(-1)]
                if any(as_int(n[i]) != lengths[i] for i in range(len(lengths))):
                    raise RuntimeError("dali: a sample whose length is not its `n`")
                if tuple(x.shape[1:]) != (3, side, side):
                    raise RuntimeError(f"dali: a batch of shape {tuple(x.shape)}")
                labels = torch.tensor([as_int(r) for r in d["y"]], dtype=torch.int64)
                per = torch.full((len(labels),), 3 * side * side, dtype=torch.int64)
                yield x.reshape(-1), per, labels

    return DaliBatches()


def forever(loader):
    """The loader's batches, pass after pass (a training loop's epochs)."""
    while True:
        n = 0
        for item in loader:
            n += 1
            yield item
        if n == 0:
            return


def batch_bytes(x):
    """Bytes in a batch: one tensor, or a list of per-sample tensors."""
    return sum(len(t) for t in x) if isinstance(x, (list, tuple)) else len(x)


def make_gpu_step(model_name, batch):
    """The real step: (x, labels) -> None, MODEL's forward and backward pass
    on the batch's own bytes, synchronised. CUDA when present, else CPU."""
    import torch.nn.functional as F

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if model_name == "resnet50":
        import torchvision

        model, side = torchvision.models.resnet50(num_classes=1000), 224
    else:
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, stride=2), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 1000))
        side = 32
    torch.backends.cudnn.benchmark = True
    model = model.to(dev, memory_format=torch.channels_last).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    per = 3 * side * side

    def step(x, labels):
        if isinstance(x, (list, tuple)):
            flat = torch.cat([t.to(dev, non_blocking=True) for t in x])
        else:
            flat = x.to(dev, non_blocking=True)
        if not isinstance(labels, torch.Tensor):
            labels = torch.tensor(labels, dtype=torch.int64)
        n = len(labels)
        need = n * per
        if flat.numel() < need:
            flat = flat.repeat(need // flat.numel() + 1)
        inp = flat[:need].view(n, 3, side, side).float().div_(255).contiguous(memory_format=torch.channels_last)
        target = labels.to(dev, non_blocking=True) % 1000
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(inp), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    # Warm-up on random bytes: cuDNN's autotuning and the first kernels'
    # loading are not the loader's doing.
    for _ in range(3):
        step(torch.randint(0, 256, (batch * per,), dtype=torch.uint8),
             torch.randint(0, 1000, (batch,), dtype=torch.int64))
    return step, str(dev)


def finish(code, message=None, result=None):
    finish_run("stall_train", code, message, result)


def percentile(sorted_values, p):
    """Nearest rank, as the Rust side's report::percentile."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), int(-(-p * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contender", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--step-ms", type=float, required=True)
    ap.add_argument("--warmup-batches", type=int, default=5)
    ap.add_argument("--warmup-s", type=float, default=0.0,
                    help="after the warm-up batches, keep warming up until this long after the first batch")
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--window-s", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--keys")
    ap.add_argument("--local-root")
    ap.add_argument("--endpoint")
    ap.add_argument("--bucket")
    ap.add_argument("--region", default=os.environ.get("AWS_REGION", "us-east-1"))
    ap.add_argument("--socket")
    ap.add_argument("--dataset")
    ap.add_argument("--remote", help="streaming, litdata, webdataset, dali: s3://bucket/prefix of the shards")
    ap.add_argument("--cache", help="streaming, litdata, dali: the local cache folder")
    ap.add_argument("--marks", action="store_true")
    ap.add_argument("--limit-s", type=float, default=300.0, help="give up (exit 1) after this long")
    ap.add_argument("--decode", type=int, default=0,
                    help="samples are JPEGs: decode and resize each to this side (granary_main: prepared by the agent)")
    ap.add_argument("--decoder", choices=("torchvision", "pil", "dali"), default="torchvision",
                    help="--decode: how the contender decodes (its docs' recommendation; bench/stall_decode.py)")
    ap.add_argument("--epochs", type=int, default=1, help="granary: epochs of the pass")
    ap.add_argument("--gpu-step", choices=("resnet50", "tiny"),
                    help="a real forward and backward pass instead of the sleep (CUDA when present)")
    a = ap.parse_args()
    DECODE[0] = a.decode
    DECODER[0] = a.decoder
    import threading

    guard = threading.Timer(a.limit_s, lambda: finish(1, f"{a.contender}: gave up after {a.limit_s} s"))
    guard.daemon = True
    guard.start()
    warnings.filterwarnings("ignore", message=".*worker processes in total.*")

    def mark(what):
        if a.marks:
            print(f"mark {what}", flush=True)

    gpu_step, device = (None, None)
    if a.gpu_step is not None:
        try:
            gpu_step, device = make_gpu_step(a.gpu_step, a.batch)
        except Exception as e:  # noqa: BLE001
            finish(1, f"{a.contender}: the GPU step: {type(e).__name__}: {e}")
    step = a.step_ms / 1000.0
    busy = [0.0]  # the step's time, warm-up and window
    step_times = []

    def run_step(x, labels, timed):
        ts = time.monotonic()
        if gpu_step is None:
            time.sleep(step)
        else:
            gpu_step(x, labels)
        took = time.monotonic() - ts
        busy[0] += took
        if timed:
            step_times.append(took)

    t_start = time.monotonic()
    t1 = t0 = t_start
    samples = 0
    try:
        loader = build_loader(a)
        # A window after the first epoch (--decode) needs more than one pass
        # of the loaders whose iterator ends with the epoch.
        it = iter(loader) if a.contender.startswith("granary") else forever(loader)
        first_batch = None
        warmed = 0
        while warmed < a.warmup_batches or (
                first_batch is not None and time.monotonic() - t_start - first_batch < a.warmup_s):
            x, _, labels = next(it)
            warmed += 1
            if first_batch is None:
                first_batch = time.monotonic() - t_start
            run_step(x, labels, False)
        waits = []
        mark("window-start")
        t0 = time.monotonic()
        while len(waits) < a.batches and time.monotonic() - t0 < a.window_s:
            s = time.monotonic()
            try:
                x, lengths, labels = next(it)
            except StopIteration:
                break
            waits.append(time.monotonic() - s)
            if len(lengths) != len(labels) or int(lengths.sum()) != batch_bytes(x):
                raise RuntimeError("a batch whose lengths do not add up")
            samples += len(lengths)
            run_step(x, labels, True)
        t1 = time.monotonic()
        mark("window-end")
    except Exception as e:  # a worker's error arrives here
        finish(1, f"{a.contender}: {type(e).__name__}: {e}")
    wall = t1 - t0
    w = sorted(waits)
    versions = {"torch": torch.__version__}
    for mod in ("boto3", "s3torchconnector", "streaming", "litdata", "webdataset", "nvidia.dali"):
        if mod in sys.modules:
            versions[mod] = getattr(sys.modules[mod], "__version__", "?")
    finish(0, result={
        "contender": a.contender,
        "workers": a.workers,
        "batch": a.batch,
        "step_ms": a.step_ms,
        "batches": len(waits),
        "samples": samples,
        "wall_s": wall,
        "idle": sum(waits) / wall if wall > 0 else float("nan"),
        "img_per_s": samples / wall if wall > 0 else float("nan"),
        "wait_p50_ms": percentile(w, 50) * 1e3,
        "wait_p99_ms": percentile(w, 99) * 1e3,
        "first_batch_s": first_batch if first_batch is not None else float("nan"),
        # From the loader's construction to the window's end: how long the
        # GPU stepped, and the whole span (start-up included).
        "busy_s": busy[0],
        "gpu_step": a.gpu_step or "sleep",
        "device": device or "none",
        "gpu_step_ms": (sum(step_times) / len(step_times) * 1e3) if gpu_step is not None and step_times
        else None,
        "warmup_batches": warmed,
        "run_s": t1 - t_start,
        **versions,
    })


if __name__ == "__main__":
    main()
