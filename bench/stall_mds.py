#!/usr/bin/env python3
"""Writes the samples of `bench/run stall` as MDS shards (mosaicml-streaming's
format) and uploads them into the store, for the `streaming` contender.

    stall_mds.py --keys KEYS.tsv --local-root DIR --endpoint URL --bucket B --prefix mds --work DIR

KEYS.tsv holds one `key<TAB>size` line per sample (`prefix/class/file`); the
samples are read from DIR (the same files the store holds), written in that
order with MDSWriter's defaults (64 MiB shards, no compression) as columns
`x` (bytes), `y` (the class, int) and `n` (the length, int), and uploaded
with boto3 straight to the store (not through the delay proxy). Credentials
come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_REGION. Prints
one JSON line: shards, bytes, seconds.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stall_train import label_of, read_keys  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("--keys", "--local-root", "--endpoint", "--bucket", "--work"):
        ap.add_argument(name, required=True)
    ap.add_argument("--prefix", default="mds")
    a = ap.parse_args()
    import boto3
    from botocore.config import Config
    from streaming import MDSWriter

    t = time.monotonic()
    keys, sizes = read_keys(a.keys)
    out = os.path.join(a.work, "mds")
    with MDSWriter(out=out, columns={"x": "bytes", "y": "int", "n": "int"}) as w:
        for k, n in zip(keys, sizes):
            with open(os.path.join(a.local_root, k.split("/", 1)[1]), "rb") as f:
                w.write({"x": f.read(), "y": label_of(k), "n": n})
    s3 = boto3.session.Session().client("s3", endpoint_url=a.endpoint,
                                        config=Config(s3={"addressing_style": "path"}))
    shards, nbytes = 0, 0
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        s3.upload_file(path, a.bucket, f"{a.prefix}/{name}")
        shards += name.endswith(".mds")
        nbytes += os.path.getsize(path)
    print(json.dumps({"shards": shards, "bytes": nbytes, "seconds": time.monotonic() - t}), flush=True)


if __name__ == "__main__":
    main()
