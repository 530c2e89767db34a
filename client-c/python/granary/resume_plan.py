"""Where a :class:`~granary.torch.GranaryDataset` pass stands, and how to
go on from it with the same or another number of DataLoader workers, or
another world size: the arithmetic behind ``state_dict`` /
``load_state_dict``, kept free of torch and of the agent so that it can be
tested on its own.

Vocabulary (see ``docs/python.md``, "Checkpoints and resuming"):

* A **rank batch** is one of the batches the agent plans for a rank in a
  pass, numbered ``g = epoch_offset * nb + b`` across the pass's epochs
  (``nb`` rank batches per epoch, ``b`` the batch within its epoch).
* With ``W`` DataLoader workers, worker ``w`` takes the rank batches of
  each epoch whose ``b`` is ``w``, ``w + W``, ``w + 2W``, ... (the agent's
  worker split), so the DataLoader hands the training loop the rank's
  batches in the rank's own order.
* A **run** is what one session of a worker delivers: worker ``w`` of
  ``W`` from its session batch ``first`` on, ``limit`` batches of it at most
  (None: to the end of the pass), of which ``taken`` were handed out whole
  and ``skip`` samples of the next one (per-sample items).

The state of a worker is its plan and its runs. To go on, the states of
all workers are merged into the rank batches not yet delivered: a few
**leftovers** (single batches, the first ``skip`` samples of one already
delivered) below the point ``tail`` from which every rank batch is still to
come. The new workers share the leftovers round robin and split the tail
as above.
"""

from __future__ import annotations

import sys
from typing import Optional

#: Marks a worker state made by this module (version 1).
MARK = "granary_dataset_state"

#: The plan fields every state of one job must agree on; ``world_size`` and
#: ``batch_size`` may change together when their product (the global batch)
#: does not (elastic continuation).
PLAN_FIELDS = ("dataset", "seed", "epoch", "epochs", "drop_last", "assignment")


def per_worker(nb: int, w: int, workers: int) -> int:
    """Rank batches per epoch worker ``w`` of ``workers`` takes."""
    return 0 if nb <= w else (nb - w + workers - 1) // workers


def rank_index(nb: int, w: int, workers: int, j: int) -> int:
    """The rank batch of session batch ``j`` of worker ``w`` (past every
    rank batch when the worker has none)."""
    p = per_worker(nb, w, workers)
    if p == 0:
        return sys.maxsize
    e, r = divmod(j, p)
    return e * nb + w + r * workers


def first_session_batch(nb: int, w: int, workers: int, g: int) -> int:
    """The first session batch of worker ``w`` whose rank batch is ``g`` or
    later."""
    p = per_worker(nb, w, workers)
    if p == 0:
        return 0
    e, b = divmod(g, nb)
    r = 0 if b <= w else (b - w + workers - 1) // workers
    if r >= p:
        e, r = e + 1, 0
    return e * p + r


def fresh_runs(worker: int, workers: int) -> list:
    """The runs of a worker starting the pass."""
    return [dict(worker=worker, workers=workers, first=0, limit=None, taken=0, skip=0)]


def find_states(obj) -> list:
    """Every worker state of this module inside ``obj``: one of them, a list
    of them, or a whole ``StatefulDataLoader.state_dict()`` (any nesting)."""
    found: list = []

    def walk(o) -> None:
        if isinstance(o, dict):
            if o.get(MARK) == 1:
                found.append(o)
                return
            for v in o.values():
                walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)

    walk(obj)
    return found


def remaining(states: list, total: int) -> tuple[list, int]:
    """The rank batches the merged worker ``states`` have not delivered:
    ``(leftovers, tail)`` where ``leftovers`` is a sorted list of
    ``(g, skip)`` below ``tail`` and every rank batch from ``tail`` to
    ``total`` is still to come. Raises ``ValueError`` when the states do not
    cover every worker of their split (a state of one worker was given
    where the whole loader's is needed)."""
    nb = states[0]["nb"]
    left: dict[int, int] = {}
    tails = []
    for s in states:
        for r in s["runs"]:
            w, ws, j0 = r["worker"], r["workers"], r["first"] + r["taken"]
            if r["limit"] is not None:
                for i in range(r["limit"] - r["taken"]):
                    g = rank_index(nb, w, ws, j0 + i)
                    if g < total:
                        left[g] = r["skip"] if i == 0 else 0
            else:
                tails.append((w, ws, j0, r["skip"]))
    if tails:
        split = {ws for _, ws, _, _ in tails}
        covered = {w for w, _, _, _ in tails}
        if len(split) != 1 or covered != set(range(next(iter(split)))):
            raise ValueError(
                f"the saved state covers workers {sorted(covered)} of {sorted(split)}: "
                "pass the whole DataLoader state (every worker's) to load_state_dict"
            )
        starts = [rank_index(nb, w, ws, j) for w, ws, j, _ in tails]
        top = max(starts)
        for (w, ws, j, skip), g in zip(tails, starts):
            first = True
            while g <= top and g < total:
                left[g] = skip if first else 0
                first = False
                j += 1
                g = rank_index(nb, w, ws, j)
        tail = top + 1
    else:
        tail = total
    return sorted((g, s) for g, s in left.items() if g < tail), min(tail, total)


def share(leftovers: list, tail: int, total: int, nb: int, worker: int, workers: int) -> list:
    """The runs of worker ``worker`` of ``workers`` going on from
    ``(leftovers, tail)``: its leftovers (round robin), then its part of the
    tail."""
    runs = [
        dict(worker=0, workers=1, first=g, limit=1, taken=0, skip=skip)
        for i, (g, skip) in enumerate(leftovers)
        if i % workers == worker
    ]
    if tail < total:
        j = first_session_batch(nb, worker, workers, tail)
        if j < (total // nb) * per_worker(nb, worker, workers):
            runs.append(dict(worker=worker, workers=workers, first=j, limit=None, taken=0, skip=0))
    return runs


def elastic_step(leftovers: list, tail: int) -> Optional[int]:
    """The first rank batch not delivered when everything before it was
    and everything from it on was not (the committed global step); None
    when the position is not that clean (a batch half delivered, or one
    delivered beyond another that was not)."""
    if any(skip for _, skip in leftovers):
        return None
    if not leftovers:
        return tail
    start = leftovers[0][0]
    if [g for g, _ in leftovers] != list(range(start, tail)):
        return None
    return start


def _crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli, reflected 0x82F63B78), as the state's trailer."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def exact_twin(state: bytes) -> bytes:
    """A session state (``docs/c-api.md``, "Session state") with its
    locality digest left out: it opens the same plan in exact order. The
    provenance check of a locality-mode state opens it this way, on a
    connection without the job's view and layout (a locality session of
    the old layout could not open there, nor under the new agreement)."""
    magic = b"GRNYSTv1"
    if state[:8] != magic or len(state) < 14:
        raise ValueError("not a granary session state")
    name = int.from_bytes(state[8:10], "little")
    # seed u64, first_epoch, epoch_count, batch_size, rank, world_size
    # (u32 each), drop_last u8, worker, workers (u32 each).
    at = 10 + name + 8 + 5 * 4 + 1 + 2 * 4
    if len(state) < at + 5 or state[at] not in (0, 1):
        raise ValueError("not a granary session state")
    if state[at] == 0:
        return state
    body = state[:at] + b"\0" + state[at + 33 : -4]
    return body + _crc32c(body).to_bytes(4, "little")
