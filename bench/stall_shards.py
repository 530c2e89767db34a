#!/usr/bin/env python3
"""Writes the samples of `bench/run stall` as shards in a streaming loader's
format and uploads them into the store, for the shard-reading contenders.

    stall_shards.py --format mds|litdata|wds --keys KEYS.tsv --local-root DIR \
        (--endpoint URL --bucket B --prefix P --work DIR | --out DIR)

KEYS.tsv holds one `key<TAB>size` line per sample (`prefix/class/file`); the
samples are read from DIR (the same files the store holds) and written in
that order, every format with 64 MiB shards, uncompressed, each sample as
its bytes `x`, its class `y` (int) and its length `n` (int):

  mds      mosaicml-streaming's MDSWriter (its defaults: 64 MiB, no
           compression), for the `streaming` contender
  litdata  litdata.optimize(chunk_bytes="64MB"), for `litdata`
  wds      webdataset's ShardWriter (tar, maxsize 64 MiB; members
           NNNNNNNN.x, .y, .n), for `webdataset`

The shards are uploaded with boto3 straight to the store (not through the
delay proxy) under PREFIX/. Credentials come from AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY / AWS_REGION. With `--out DIR` they are only written
into DIR (for a store that serves a folder: `bench/run stall --store
light`). Prints one JSON line: format, shards, bytes, seconds.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stall_train import label_of, read_keys  # noqa: E402

SHARD_BYTES = 64 << 20


def samples(keys, sizes, local_root):
    for k, n in zip(keys, sizes):
        with open(os.path.join(local_root, k.split("/", 1)[1]), "rb") as f:
            yield f.read(), label_of(k), n


def write_mds(items, out):
    from streaming import MDSWriter

    with MDSWriter(out=out, columns={"x": "bytes", "y": "int", "n": "int"}) as w:
        for x, y, n in items:
            w.write({"x": x, "y": y, "n": n})


class _LitdataSample:
    """litdata.optimize's per-input function: reads one file (a module-level
    class, so that optimize's worker can pickle it)."""

    def __init__(self, local_root):
        self.local_root = local_root

    def __call__(self, kn):
        key, n = kn
        with open(os.path.join(self.local_root, key.split("/", 1)[1]), "rb") as f:
            return {"x": f.read(), "y": label_of(key), "n": n}


def write_litdata(keys, sizes, local_root, out):
    import litdata

    litdata.optimize(fn=_LitdataSample(local_root), inputs=list(zip(keys, sizes)), output_dir=out,
                     chunk_bytes="64MB", num_workers=1, mode="overwrite")


def write_wds(items, out):
    import webdataset as wds

    os.makedirs(out, exist_ok=True)
    with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxsize=SHARD_BYTES, verbose=0) as w:
        for i, (x, y, n) in enumerate(items):
            w.write({"__key__": f"{i:08d}", "x": x, "y": str(y).encode(), "n": str(n).encode()})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("--format", "--keys", "--local-root"):
        ap.add_argument(name, required=True)
    for name in ("--endpoint", "--bucket", "--work", "--prefix", "--out"):
        ap.add_argument(name)
    a = ap.parse_args()
    upload = a.out is None
    if upload and None in (a.endpoint, a.bucket, a.work, a.prefix):
        raise SystemExit("stall_shards: --endpoint, --bucket, --work and --prefix, or --out")

    t = time.monotonic()
    keys, sizes = read_keys(a.keys)
    out = os.path.join(a.work, a.format) if upload else a.out
    if a.format == "mds":
        write_mds(samples(keys, sizes, a.local_root), out)
    elif a.format == "litdata":
        write_litdata(keys, sizes, a.local_root, out)
    elif a.format == "wds":
        write_wds(samples(keys, sizes, a.local_root), out)
    else:
        raise SystemExit(f"stall_shards: unknown format {a.format!r}")
    if upload:
        import boto3
        from botocore.config import Config

        s3 = boto3.session.Session().client("s3", endpoint_url=a.endpoint,
                                            config=Config(s3={"addressing_style": "path"}))
    shards, nbytes = 0, 0
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        if upload:
            s3.upload_file(path, a.bucket, f"{a.prefix}/{name}")
        shards += name.endswith((".mds", ".bin", ".tar"))
        nbytes += os.path.getsize(path)
    print(json.dumps({"format": a.format, "shards": shards, "bytes": nbytes, "seconds": time.monotonic() - t}),
          flush=True)


if __name__ == "__main__":
    main()
