"""Writes the fixtures of the `wids` index tests: three small WebDataset
shards made with Python's `tarfile`, and the index `widsindex create`
(the `wids` package, 0.1.11) writes of them:

    pip install wids==0.1.11
    python3 make.py    # in this folder

Shard s holds samples "s{s}/{i:03d}" (i < 3 + s) with members `.bin`
(bytes of sample(s, i)) and `.cls` (the label i + 10 * s). The index lists
the shards in the order 2, 0, 1 (it sorts by URL: the names sort so), so
that its order is not the listing's."""

import io
import json
import os
import subprocess
import tarfile

NAMES = {0: "b-shard.tar", 1: "c-shard.tar", 2: "a-shard.tar"}


def sample(s, i):
    return bytes((s * 31 + i * 7 + k) % 251 for k in range(50 + 40 * i))


def add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def main():
    for s, name in NAMES.items():
        with tarfile.open(name, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(3 + s):
                add(tar, f"s{s}/{i:03d}.bin", sample(s, i))
                add(tar, f"s{s}/{i:03d}.cls", str(i + 10 * s).encode())
    subprocess.run(
        ["widsindex", "create", "--name", "fixture", "--output", "shardindex.json"]
        + sorted(NAMES.values()),
        check=True,
    )
    with open("shardindex.json") as f:
        index = json.load(f)
    assert [s["nsamples"] for s in index["shardlist"]] == [5, 3, 4], index


if __name__ == "__main__":
    main()
