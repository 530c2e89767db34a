#!/usr/bin/env python3
"""Reference implementation of Granary's locality-aware assignment
(docs/planner.md, "Locality-aware assignment"; peer/src/assign.rs).

Reproduces, exactly, which node and which local rank processes each sample
of a global step. Standard library only.

As a module:

    from assign_reference import assign_step, global_step
    a = assign_step(samples=[10, 11, 12, 13], holders=[1, None, 1, 1],
                    node_of_rank=[0, 1], nodes=2, batch_size=2)
    a["ranks"]      # [[11, 13], [10, 12]]: each rank's samples
    a["nodes"]      # each node's samples, in step order
    a["local"], a["uncached"], a["moved"]  # 2, 1, 1
    a["transfers"]  # [(1, 0, 1)]: (from, to, count)

From the command line:

    python3 assign_reference.py --nodes 2 --node-of-rank 0 1 --batch-size 2 \\
        --samples 10 11 12 13 --holders 1 - 1 1

prints one line per rank, then `moved M transfers F>T:K ...`
(here `11 13`, `10 12`, `moved 1 transfers 1>0:1`).

`--stdin` reads cases from standard input (used by the Rust test
peer/tests/assign_python.rs), four lines per case:

    NODES BATCH_SIZE
    node of every rank
    samples
    holders ('-' for none)

and writes, per case, one line per rank (`r SAMPLES`), one per node
(`n SAMPLES`), then `s LOCAL UNCACHED MOVED` and `t FROM TO COUNT ...`.
"""

import argparse
import heapq
import sys


def assign_step(samples, holders, node_of_rank, nodes, batch_size):
    """The assignment of one global step; raises ValueError on bad input."""
    if nodes < 1:
        raise ValueError("layout has no nodes")
    if not node_of_rank:
        raise ValueError("layout has no ranks")
    ranks_of = [[] for _ in range(nodes)]
    for rank, v in enumerate(node_of_rank):
        if not 0 <= v < nodes:
            raise ValueError(f"rank {rank} is on node {v}, out of range")
        ranks_of[v].append(rank)
    if batch_size < 1:
        raise ValueError("batch_size is 0")
    b = batch_size
    if len(samples) != len(node_of_rank) * b:
        raise ValueError("step does not hold world_size * batch_size samples")
    if len(holders) != len(samples):
        raise ValueError("one holder per sample is needed")

    quota = [len(r) * b for r in ranks_of]
    count = [0] * nodes
    node_at = [None] * len(samples)
    surplus = [[] for _ in range(nodes)]
    uncached = []

    # 1. Own samples first, up to the quota.
    for pos, h in enumerate(holders):
        if h is None:
            uncached.append(pos)
        elif not 0 <= h < nodes:
            raise ValueError(f"holder {h} at position {pos} is out of range")
        elif count[h] < quota[h]:
            count[h] += 1
            node_at[pos] = h
        else:
            surplus[h].append(pos)
    local = sum(count)

    # 2. Uncached samples fill deficits, nodes in ascending index.
    nxt = 0
    for v in range(nodes):
        while count[v] < quota[v] and nxt < len(uncached):
            node_at[uncached[nxt]] = v
            count[v] += 1
            nxt += 1

    # 3. Two-heap balancing: largest surplus into largest deficit, ties to
    # the smaller node index (min-heaps of (-amount, node)).
    give_heap = [(-len(s), v) for v, s in enumerate(surplus) if s]
    take_heap = [(count[v] - quota[v], v) for v in range(nodes) if count[v] < quota[v]]
    heapq.heapify(give_heap)
    heapq.heapify(take_heap)
    moved_from = [0] * nodes
    transfers = []
    while give_heap and take_heap:
        give, u = heapq.heappop(give_heap)
        take, w = heapq.heappop(take_heap)
        give, take = -give, -take
        k = min(give, take)
        start = moved_from[u]
        for pos in surplus[u][start:start + k]:
            node_at[pos] = w
        moved_from[u] = start + k
        transfers.append((u, w, k))
        if give > k:
            heapq.heappush(give_heap, (-(give - k), u))
        if take > k:
            heapq.heappush(take_heap, (-(take - k), w))

    # 4. Node lists in step order; local rank j takes j*b .. (j+1)*b.
    node_lists = [[] for _ in range(nodes)]
    for s, v in zip(samples, node_at):
        node_lists[v].append(s)
    ranks = [None] * len(node_of_rank)
    for v in range(nodes):
        for j, rank in enumerate(ranks_of[v]):
            ranks[rank] = node_lists[v][j * b:(j + 1) * b]
    return {
        "nodes": node_lists,
        "ranks": ranks,
        "local": local,
        "uncached": len(uncached),
        "moved": sum(moved_from),
        "transfers": transfers,
    }


def global_step(permutation, world_size, batch_size, drop_last, step):
    """(samples, per-rank batch size) of a step, or None past the last one.

    Step k is entries k*B*ws .. min((k+1)*B, ns)*ws of the padded permutation
    padded[i] = permutation[i % n]; rank r's exact batch is samples[r::ws].
    """
    n = len(permutation)
    per_rank = n // world_size if drop_last else -(-n // world_size)
    start = step * batch_size
    if start >= per_rank:
        return None
    end = min(per_rank, start + batch_size)
    if drop_last and end - start < batch_size:
        return None
    samples = [permutation[i % n] for i in range(start * world_size, end * world_size)]
    return samples, end - start


def _ints(line):
    return [int(x) for x in line.split()]


def _holders(words):
    return [None if w == "-" else int(w) for w in words]


def _run_stdin():
    lines = sys.stdin.read().split("\n")
    out = []
    for i in range(0, len(lines) - 3, 4):
        nodes, batch = _ints(lines[i])
        a = assign_step(_ints(lines[i + 2]), _holders(lines[i + 3].split()),
                        _ints(lines[i + 1]), nodes, batch)
        out.extend("r " + " ".join(map(str, r)) for r in a["ranks"])
        out.extend("n " + " ".join(map(str, n)) for n in a["nodes"])
        out.append(f"s {a['local']} {a['uncached']} {a['moved']}")
        out.append("t " + " ".join(f"{f} {t} {k}" for f, t, k in a["transfers"]))
    sys.stdout.write("".join(line + "\n" for line in out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stdin", action="store_true")
    ap.add_argument("--nodes", type=int)
    ap.add_argument("--node-of-rank", type=int, nargs="+")
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--samples", type=int, nargs="+")
    ap.add_argument("--holders", nargs="+")
    args = ap.parse_args()
    try:
        if args.stdin:
            _run_stdin()
            return
        if None in (args.nodes, args.node_of_rank, args.batch_size, args.samples, args.holders):
            ap.error("--nodes, --node-of-rank, --batch-size, --samples and --holders are needed")
        a = assign_step(args.samples, _holders(args.holders), args.node_of_rank,
                        args.nodes, args.batch_size)
    except ValueError as e:
        sys.exit(f"assign_reference.py: {e}")
    for r in a["ranks"]:
        print(" ".join(map(str, r)))
    print(f"moved {a['moved']} transfers "
          + " ".join(f"{f}>{t}:{k}" for f, t, k in a["transfers"]))


if __name__ == "__main__":
    main()
