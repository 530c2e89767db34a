#!/usr/bin/env python3
"""Reference implementation of the Granary planner (docs/planner.md).

Reproduces, bit for bit, the order in which granaryd delivers samples to a
loader: the epoch permutation, the DistributedSampler-style shard of a rank,
and the batches. Standard library only.

As a module:

    from planner_reference import plan_batches
    batches = plan_batches(seed=42, epoch=0, n=10, rank=0, world_size=2,
                           batch_size=3, drop_last=False)

From the command line (one line per batch, space-separated sample indices):

    python3 planner_reference.py --seed 42 --epoch 0 --n 10 \\
        --rank 0 --world-size 2 --batch-size 3 [--drop-last]

`--permutation` prints the whole epoch permutation on one line instead.
"""

import argparse
import sys

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
ALGORITHM_TAG = 0x6772616E61727931  # ASCII "granary1", big-endian
MAX_SAMPLES = 1 << 48


def mix64(z):
    """SplitMix64's output function (a bijection of 64-bit integers)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def stream_key(seed, epoch):
    """mix64(mix64(seed ^ TAG) + epoch * GAMMA), modulo 2**64."""
    return mix64((mix64(seed ^ ALGORITHM_TAG) + epoch * GAMMA) & MASK64)


def bounded(state, s):
    """Draw j uniform in range(s) (s >= 1) from the SplitMix64 stream at `state`.

    Lemire's multiply-shift with rejection. Returns (new state, j).
    """
    while True:
        state = (state + GAMMA) & MASK64
        m = mix64(state) * s
        # Reject when the low word is below 2**64 mod s (not (-s) % s, which
        # is 0 for Python integers). The test `low < s` skips the modulo in
        # nearly every draw, since 2**64 mod s < s.
        low = m & MASK64
        if low >= s or low >= ((1 << 64) - s) % s:
            return state, m >> 64


def epoch_permutation(seed, epoch, n):
    """The permutation of range(n) for (seed, epoch): Fisher-Yates, last position first."""
    perm = list(range(n))
    state = stream_key(seed, epoch)
    for i in range(n - 1, 0, -1):
        state, j = bounded(state, i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def validate(n, rank, world_size, batch_size):
    """Raise ValueError naming the first bad parameter."""
    if n == 0:
        raise ValueError("num_samples is 0: a dataset must have at least one sample")
    if n > MAX_SAMPLES:
        raise ValueError(f"num_samples is {n}: the planner supports at most {MAX_SAMPLES} samples")
    if world_size == 0:
        raise ValueError("world_size is 0: it must be at least 1")
    if rank >= world_size:
        raise ValueError(f"rank {rank} is out of range for world_size {world_size}: "
                         "rank must be below world_size")
    if batch_size == 0:
        raise ValueError("batch_size is 0: it must be at least 1")


def rank_share(seed, epoch, n, rank, world_size, drop_last=False):
    """Samples of `rank` in `epoch`, as DistributedSampler(shuffle=True) lists them."""
    if drop_last:
        count = n // world_size                  # truncate to floor(n/ws)*ws
    else:
        count = (n + world_size - 1) // world_size  # pad to ceil(n/ws)*ws
    perm = epoch_permutation(seed, epoch, n)
    # The padded list is perm[i % n]; rank r takes entries r, r+ws, r+2ws, ...
    return [perm[(rank + k * world_size) % n] for k in range(count)]


def plan_batches(seed, epoch, n, rank, world_size, batch_size, drop_last=False):
    """The batches (lists of sample indices) of `rank` in `epoch`, in order."""
    validate(n, rank, world_size, batch_size)
    share = rank_share(seed, epoch, n, rank, world_size, drop_last)
    batches = [share[i:i + batch_size] for i in range(0, len(share), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


def worker_batches(seed, epoch, n, rank, world_size, batch_size, worker, workers, drop_last=False):
    """The batches of `rank` in `epoch` that worker `worker` of `workers`
    takes (OpenSession worker/workers): batches worker, worker + workers, ..."""
    return plan_batches(seed, epoch, n, rank, world_size, batch_size, drop_last)[worker::workers]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--epoch", type=int, required=True)
    parser.add_argument("--n", type=int, required=True, help="number of samples")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--drop-last", action="store_true")
    parser.add_argument("--permutation", action="store_true",
                        help="print the epoch permutation on one line instead of batches")
    args = parser.parse_args(argv)
    for name, value, limit in [("seed", args.seed, 1 << 64), ("epoch", args.epoch, 1 << 32),
                               ("n", args.n, 1 << 64), ("rank", args.rank, 1 << 32),
                               ("world-size", args.world_size, 1 << 32),
                               ("batch-size", args.batch_size, 1 << 32)]:
        if not 0 <= value < limit:
            parser.error(f"--{name} {value} is out of range [0, {limit - 1}]")
    try:
        if args.permutation:
            validate(args.n, 0, 1, 1)
            lines = [epoch_permutation(args.seed, args.epoch, args.n)]
        else:
            lines = plan_batches(args.seed, args.epoch, args.n, args.rank, args.world_size,
                                 args.batch_size, args.drop_last)
    except ValueError as err:
        parser.error(str(err))
    out = sys.stdout
    for line in lines:
        out.write(" ".join(map(str, line)))
        out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
