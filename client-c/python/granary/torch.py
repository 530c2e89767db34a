"""PyTorch integration: an ``IterableDataset`` fed by the node's granaryd.

Switching from a ``DataLoader`` over ``ImageFolder``::

    from granary.torch import GranaryDataset, decode_jpeg
    ds = GranaryDataset("imagenet", batch_size=256, decode=decode_jpeg, batches=True)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=4)

**Sharding.** The agent's planner splits each epoch's permutation among
the ranks the way ``DistributedSampler`` splits ``randperm``, so across all
ranks every sample comes once per epoch (as with ``DistributedSampler``,
when the sample count is not a multiple of the ranks, a few are repeated to
even them out, or dropped with ``drop_last=True``). Rank and world size
come from the arguments, else from ``torch.distributed`` when it is
initialised, else from the ``RANK`` and ``WORLD_SIZE`` environment
variables, else 0 of 1. The DataLoader workers of a rank share its batches
round robin (worker ``w`` of ``W`` takes batches ``w``, ``w + W``, ... of
each epoch, each worker in a session of its own), so the DataLoader hands
the training loop the rank's batches in the rank's own order. (In locality
mode each worker is a rank of its own, ``rank * num_workers + worker_id``
of ``world_size * num_workers``, as the layout says.)

**Checkpoints.** :meth:`GranaryDataset.state_dict` and
:meth:`GranaryDataset.load_state_dict` implement the stateful-dataset
protocol of ``torchdata.stateful_dataloader.StatefulDataLoader``: its
``state_dict()`` taken mid-epoch, loaded into a new process's loader,
continues the pass after the last item the training loop received. A
whole loader state given to ``ds.load_state_dict`` continues with another
number of workers, or another world size keeping the global batch. See
``docs/python.md``, "Checkpoints and resuming".

**Assignment.** ``assignment="distributed_sampler"`` (default) is the
exact order above. ``assignment="locality"`` keeps every global step (the
samples of all ranks' batch ``k``) exactly as in that order but lets each
node process the samples its agent already keeps, moving only a few
between nodes to keep every rank's batch size equal; it needs peers (the
job's ``view`` from :func:`gather_view`, or agents with a configured view)
and a call of :meth:`GranaryDataset.prepare` on every rank. The job runs it
only when every rank's agent computes the same inputs (seed, epoch, view,
capacities, dataset, layout); otherwise every rank runs the exact order and
the log (logger ``granary``) says why. What differs from
``DistributedSampler``: each rank's share of a global batch, hence
per-rank BatchNorm statistics (unless ``SyncBatchNorm``) and which samples
meet per-rank augmentation seeds; the global batch and the summed gradient
are the same.

**Epochs.** One pass over the dataset (``iter()``) delivers ``epochs``
epochs starting at ``epoch``; call :meth:`GranaryDataset.set_epoch` before
each pass for a new order, as with ``DistributedSampler.set_epoch``.

**Items.** ``batches=False`` (default): one ``(x, label)`` per sample.
``batches=True``: one ``(xs, labels)`` per Granary batch, with ``xs``
stacked into one tensor when every ``x`` has the same shape (else a list)
and ``labels`` an ``int64`` tensor; use ``DataLoader(batch_size=None)``.
``with_ids=True`` appends the sample ids. ``x`` is the sample's bytes as a
``uint8`` tensor made with ``torch.frombuffer``, in place in the agent's
arena (no copy); ``decode`` (e.g. :func:`decode_jpeg`) and ``transform``
are applied to it in the worker. For a dataset the agent prepares
(``[dataset.prepare]``, docs/prepare.md) ``x`` is already the decoded,
resized image, a ``(height, width, 3)`` ``uint8`` RGB tensor viewing the
arena: give no ``decode``; random augmentation stays in ``transform`` or on
the GPU.

**Lifetime.** A Granary batch goes back to the agent once the iterator has
moved past it *and* no tensor viewing its bytes is alive any more (so the
default collate or a worker's hand-off to the main process, which copy,
always see intact bytes). Tensors kept longer pin their batch; more than
``max_held_batches`` pinned batches is an error (copy what you keep, with
``.clone()``). Arena tensors are read-only memory: never write into them.

**Failed samples.** A sample the agent could not read (after its retries)
is, with ``on_error="report"`` (default), left out: the pass goes on with
every sample that was read, each batch with failures emits a
:class:`SampleFailureWarning`, and :attr:`GranaryDataset.failed_samples`
counts them by kind (in the process that iterates: each DataLoader worker
counts its own). ``on_error="raise"`` is the strict mode: the first failed
sample raises its error. ``on_error="skip"`` leaves failed samples out
without a warning.
"""

from __future__ import annotations

import copy
import io
import logging
import os
import time
import uuid
import warnings
import weakref
from collections import deque
from typing import Callable, Iterator, Optional

import torch
from torch.utils.data import IterableDataset, get_worker_info

from . import _lib, resume_plan
from . import cuda as _cuda
from .core import DEFAULT_TIMEOUT, Client, Sample, agree, default_socket, encode_layout, encode_view
from .errors import Disconnected, EndOfStream, GranaryError, NotFound, Timeout

__all__ = ["GranaryDataset", "SampleFailureWarning", "as_tensor", "decode_jpeg", "gather_view", "rank_and_world"]

ON_ERROR = ("report", "raise", "skip")
ASSIGNMENTS = ("distributed_sampler", "locality")

log = logging.getLogger("granary")


class SampleFailureWarning(UserWarning):
    """Samples of a batch could not be read and were left out
    (``on_error="report"``)."""


def as_tensor(sample: Sample) -> torch.Tensor:
    """The sample's bytes as a ``uint8`` tensor, without a copy: 1-D, or
    ``(height, width, 3)`` (HWC, RGB) for a dataset the agent prepares
    (``[dataset.prepare]``, :attr:`granary.Sample.prepared_shape`).

    The tensor keeps the arena mapped while it lives; its bytes are valid
    until the sample's batch is released. Do not write into it.
    """
    buf = sample.buffer()
    if len(buf) == 0:
        return torch.empty(0, dtype=torch.uint8)
    t = torch.frombuffer(buf, dtype=torch.uint8)
    shape = sample.prepared_shape
    if shape is not None and t.numel() == shape[0] * shape[1] * shape[2]:
        t = t.view(shape)
    return t


def decode_jpeg(data: torch.Tensor) -> torch.Tensor:
    """JPEG bytes (a 1-D ``uint8`` tensor) to a ``3×H×W`` ``uint8`` RGB tensor.

    Uses ``torchvision.io.decode_jpeg`` when torchvision is installed, else
    Pillow.
    """
    try:
        from torchvision.io import ImageReadMode
        from torchvision.io import decode_jpeg as tv_decode
    except ImportError:
        tv_decode = None
    if tv_decode is not None:
        return tv_decode(data, mode=ImageReadMode.RGB)
    import numpy as np
    from PIL import Image

    img = Image.open(io.BytesIO(data.numpy().tobytes())).convert("RGB")
    return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).contiguous()


def rank_and_world(rank: Optional[int] = None, world_size: Optional[int] = None) -> tuple[int, int]:
    """This process's rank and world size: the arguments, else
    ``torch.distributed``, else ``RANK``/``WORLD_SIZE``, else ``(0, 1)``."""
    if rank is not None and world_size is not None:
        r, w = rank, world_size
    else:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            r, w = dist.get_rank(), dist.get_world_size()
        else:
            r, w = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        r = rank if rank is not None else r
        w = world_size if world_size is not None else w
    if w < 1 or not 0 <= r < w:
        raise ValueError(f"rank {r} is out of range for world size {w}")
    return r, w


def gather_view(
    socket: Optional[str] = None,
    *,
    job_id: Optional[str] = None,
    epoch: Optional[int] = None,
    group=None,
    timeout: Optional[float] = DEFAULT_TIMEOUT,
) -> Optional[bytes]:
    """The job's membership view, gathered through its ``torch.distributed``
    process group, handed to this rank's agent; call it on every rank
    (it is a collective) before making the :class:`GranaryDataset`, and pass
    the result as its ``view``.

    Each rank asks its agent who it is, the ranks all-gather the answers
    (ranks on the same node name the same agent once), every rank hands the
    view to its agent, and the ranks wait at a barrier, so every agent
    listens for its peers before the first sample is asked for. The job id
    is ``job_id``, else ``$TORCHELASTIC_RUN_ID``, else ``$SLURM_JOB_ID``,
    else one rank 0 makes up; the view epoch is ``epoch``, else rank 0's
    clock in milliseconds, so a relaunch hands in a newer view and the
    agents end the sessions of the old one.

    Returns None (and gathers nothing) when ``torch.distributed`` is not
    initialised or this rank's agent does not take views from loaders
    (``peers.membership`` other than ``"session"``: its view comes from its
    configuration, or peers are off). The agents of one job must be given
    the same ``peers.membership``.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    with Client(socket) as client:
        me = client.peer_identity(timeout)
    proposal = None
    if dist.get_rank(group) == 0:
        job = job_id or os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID")
        job = job or f"granary-{uuid.uuid4().hex[:16]}"
        proposal = (job, epoch if epoch is not None else time.time_ns() // 1_000_000)
    entries: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(entries, (me.membership, me.node_id, me.addr, me.capacity, proposal), group=group)
    modes = {e[0] for e in entries}
    if modes != {"session"}:
        if me.membership == "session":
            raise GranaryError(
                _lib.E_INVALID_ARGUMENT,
                f"the job's agents disagree on peers.membership ({sorted(modes)}); "
                'every agent of a job needs membership = "session" to take a view from it',
                "granary.torch.gather_view",
            )
        return None
    job, view_epoch = next(e[4] for e in entries if e[4] is not None)
    view = encode_view(job, view_epoch, [(e[1], e[2], e[3]) for e in entries])
    with Client(socket) as client:
        client.join_view(view, timeout)
    dist.barrier(group)
    return view


class GranaryDataset(IterableDataset):
    """Samples of dataset ``dataset`` served by the agent at ``socket``.

    Parameters are those of a session (``batch_size``, ``seed``, ``epoch``
    (the first), ``epochs``, ``drop_last``, ``rank``, ``world_size``,
    ``timeout`` in seconds for each batch, None for no limit) plus
    ``decode``, ``transform`` (applied to each decoded ``x``),
    ``target_transform`` (to each label), ``batches``, ``collate`` (for
    ``batches=True``: ``collate(xs, labels) -> item``), ``with_ids``,
    ``on_error`` (what to do with samples the source failed to read:
    ``"report"``, the default, leaves them out with a warning and counts
    them in :attr:`failed_samples`; ``"raise"``, strict, raises the first
    one's error; ``"skip"`` leaves them out silently),
    ``max_held_batches``, ``view`` (the job's membership view from
    :func:`gather_view`, handed to the agent with each session) and
    ``assignment`` (``"distributed_sampler"``, the default, or
    ``"locality"``, which needs :meth:`prepare`) and ``verify_crc``
    (default False: each sample's identity is checked, its bytes were
    checked by the agent when they landed; True: every sample's bytes are
    also checked against the CRC-32C the agent recorded before they are
    handed out, one pass over them, and a mismatch is a ``Corrupt`` failed
    sample) and ``resume_timeout`` (seconds to wait for an agent
    that went away to come back, then resume at the first batch not handed
    out; None: fail at once). See the module documentation.
    """

    def __init__(
        self,
        dataset: str,
        socket: Optional[str] = None,
        *,
        batch_size: int = 32,
        seed: int = 0,
        epoch: int = 0,
        epochs: int = 1,
        drop_last: bool = False,
        decode: Optional[Callable[[torch.Tensor], object]] = None,
        transform: Optional[Callable] = None,
        target_transform: Optional[Callable] = None,
        batches: bool = False,
        collate: Optional[Callable] = None,
        with_ids: bool = False,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        timeout: Optional[float] = DEFAULT_TIMEOUT,
        on_error: str = "report",
        max_held_batches: int = 8,
        view: Optional[bytes] = None,
        assignment: str = "distributed_sampler",
        verify_crc: bool = False,
        resume_timeout: Optional[float] = 60.0,
        accept_changed_dataset: bool = False,
        pin_memory: bool = False,
    ):
        super().__init__()
        if on_error not in ON_ERROR:
            raise ValueError('on_error must be "report", "raise" or "skip"')
        if assignment not in ASSIGNMENTS:
            raise ValueError('assignment must be "distributed_sampler" or "locality"')
        self.dataset = dataset
        self.socket = str(socket) if socket is not None else default_socket()
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = epoch
        self.epochs = epochs
        self.drop_last = drop_last
        self.decode = decode
        self.transform = transform
        self.target_transform = target_transform
        self.batches = batches
        self.collate = collate
        self.with_ids = with_ids
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout
        self.on_error = on_error
        self.max_held_batches = max_held_batches
        self.view = view
        self.assignment = assignment
        self.verify_crc = verify_crc
        self.resume_timeout = resume_timeout
        self.accept_changed_dataset = accept_changed_dataset
        self.pin_memory = pin_memory  # granary.cuda: arena registered, stacks page-locked
        # This process's position in its pass (state_dict), and the saved
        # states the next pass goes on from (load_state_dict).
        self._position: Optional[dict] = None
        self._pending: Optional[list] = None
        # The rank's batches and samples per epoch (__len__), by plan.
        self._sizes: Optional[tuple] = None
        # Set by prepare(): the rank layout's node ids, the DataLoader
        # workers per rank, the process group, and the agreed digest of the
        # current epoch (None: exact order).
        self._node_ids: Optional[list] = None
        self._workers = 1
        self._group = None
        self._locality: Optional[bytes] = None
        self._layout: Optional[bytes] = None
        #: Samples left out because they failed, by kind (``"Io"``,
        #: ``"NotFound"``, ...), counted in this process.
        self.failed_samples: dict[str, int] = {}

    def set_epoch(self, epoch: int) -> None:
        """The first epoch of the next pass (a new order per epoch). After
        :meth:`prepare` in locality mode it is a collective (every rank
        calls it): the job agrees on the new epoch's assignment."""
        self.epoch = epoch
        if self._node_ids is not None:
            self._agree()

    def prepare(self, num_workers: int = 0, group=None) -> str:
        """Decides, with every rank of the job, the assignment the next
        passes use; call it on every rank (a collective over ``group``, the
        default process group) before making the DataLoader, with its
        ``num_workers``. Returns ``"locality"`` or
        ``"distributed_sampler"``; when the dataset asked for locality and
        the job cannot run it, the reason goes to the ``granary`` log."""
        if self.assignment != "locality":
            return "distributed_sampler"
        import torch.distributed as dist

        self._workers = max(int(num_workers), 1)
        self._group = group
        with Client(self.socket) as client:
            me = client.peer_identity(self.timeout)
        if dist.is_available() and dist.is_initialized():
            ids: list = [None] * dist.get_world_size(group)
            dist.all_gather_object(ids, me.node_id, group=group)
        else:
            ids = [me.node_id]
        self._node_ids = ids
        return self._agree()

    def _agree(self) -> str:
        """Every rank asks its agent about this epoch; the job decides."""
        import torch.distributed as dist

        rank, world = rank_and_world(self.rank, self.world_size)
        w = self._workers
        info = None
        try:
            view = self.view
            if view is None:
                raise GranaryError(
                    _lib.E_INVALID_ARGUMENT,
                    "no membership view: pass the one gather_view() returns as view=",
                    "granary.torch.GranaryDataset.prepare",
                )
            self._layout = encode_layout(view, self._node_ids, w)
            with Client(self.socket) as client:
                info = client.assignment(
                    self.dataset, view=view, layout=self._layout, **self._plan_options(rank * w, world * w)
                )
        except GranaryError as e:
            from .core import AssignmentInfo

            info = AssignmentInfo(False, bytes(32), str(e))
        if dist.is_available() and dist.is_initialized():
            infos: list = [None] * dist.get_world_size(self._group)
            dist.all_gather_object(infos, info, group=self._group)
        else:
            infos = [info]
        digest, why = agree(infos)
        self._locality = digest
        if digest is None:
            log.warning(
                "granary: dataset %r epoch %d runs in exact (DistributedSampler) order, not "
                "locality-aware: %s",
                self.dataset,
                self.epoch,
                why,
            )
            return "distributed_sampler"
        log.info("granary: dataset %r epoch %d runs the locality-aware assignment", self.dataset, self.epoch)
        return "locality"

    def __len__(self) -> int:
        """Items this rank's pass yields (all its DataLoader workers
        together): its batches (``batches=True``) or samples over the pass's
        epochs, less those a state given to :meth:`load_state_dict` says
        were delivered. Asks the agent (one short session). Samples left out
        because they failed make a pass shorter. Knowing it, PyTorch
        Lightning does not read a batch ahead of the training step, so the
        loader state in its checkpoints is exactly what the steps used."""
        rank, world = rank_and_world(self.rank, self.world_size)
        key = (rank, world, self.batch_size, self.drop_last, self.seed, self.epoch)
        if self._sizes is None or self._sizes[0] != key:
            probe = self._open(rank, world, {}, 0, 0, 1)
            info = probe.info
            probe.close()
            self._sizes = (key, info.rank_batches_per_epoch or info.batches_per_epoch, info.samples_per_epoch)
        _, nb, samples = self._sizes
        total = self.epochs * nb
        left = total
        pending = self._pending
        if pending and pending[0]["plan"]["world_size"] == world and pending[0]["nb"] == nb:
            leftovers, tail = resume_plan.remaining(pending, total)
            left = len(leftovers) + (total - tail)
        if self.batches:
            return left
        # Every batch is full but the last of each epoch.
        short = nb * self.batch_size - samples
        return max(left * self.batch_size - short * self.epochs, 0) if left == total else left * self.batch_size

    def shard(self) -> tuple[int, int]:
        """``(rank, world_size)`` of this process's session, counting
        DataLoader workers: ``rank * num_workers + worker_id`` of
        ``world_size * num_workers``."""
        rank, world = rank_and_world(self.rank, self.world_size)
        info = get_worker_info()
        if info is None:
            return rank, world
        return rank * info.num_workers + info.id, world * info.num_workers

    def _x(self, sample: Sample):
        x = as_tensor(sample)
        if self.decode is not None:
            x = self.decode(x)
        if self.transform is not None:
            x = self.transform(x)
        return x

    def _y(self, label: int):
        return self.target_transform(label) if self.target_transform is not None else label

    def _batch_item(self, xs: list, ys: list, ids: list):
        if self.collate is not None:
            item = self.collate(xs, ys)
            return (*item, torch.tensor(ids, dtype=torch.int64)) if self.with_ids else item
        if xs and all(isinstance(x, torch.Tensor) for x in xs) and len({tuple(x.shape) for x in xs}) == 1:
            xs = _cuda.stack_pinned(xs) if self.pin_memory else torch.stack(xs)
        if ys and all(isinstance(y, int) for y in ys):
            ys = torch.tensor(ys, dtype=torch.int64)
        if self.with_ids:
            return xs, ys, torch.tensor(ids, dtype=torch.int64)
        return xs, ys

    def _count_failures(self, batch, failed: dict) -> None:
        for kind, n in failed.items():
            self.failed_samples[kind] = self.failed_samples.get(kind, 0) + n
        if self.on_error == "report":
            what = ", ".join(f"{n} {kind}" for kind, n in sorted(failed.items()))
            warnings.warn(
                f"granary: dataset {self.dataset!r} epoch {batch.epoch} batch {batch.index}: "
                f"{sum(failed.values())} of {len(batch)} samples could not be read ({what}) "
                "and were left out; on_error=\"raise\" makes this an error",
                SampleFailureWarning,
                stacklevel=3,
            )

    def _session_assignment(self) -> dict:
        """The session options of the assignment the job agreed on."""
        if self.assignment != "locality":
            return {}
        if self._node_ids is None:
            warnings.warn(
                'granary: assignment="locality" needs GranaryDataset.prepare() on every rank; '
                "running the exact (DistributedSampler) order",
                stacklevel=3,
            )
            return {}
        info = get_worker_info()
        workers = info.num_workers if info is not None else 1
        if workers != self._workers:
            raise GranaryError(
                _lib.E_INVALID_ARGUMENT,
                f"prepare(num_workers={self._workers}) but the DataLoader runs {workers} workers: "
                "call prepare() with the DataLoader's num_workers",
                "granary.torch.GranaryDataset",
            )
        if self._locality is None:
            return {}
        return {"layout": self._layout, "locality": self._locality}

    # -- checkpoints -------------------------------------------------------

    def state_dict(self) -> dict:
        """Where this process's pass stands (the stateful-dataset protocol of
        ``torchdata.stateful_dataloader.StatefulDataLoader``): the plan's
        inputs, the dataset's provenance and, per session, the batches
        handed to the training loop (not what was prefetched). In a
        DataLoader worker it is that worker's; ``StatefulDataLoader``
        gathers them into its own ``state_dict()``."""
        if self._position is not None:
            return copy.deepcopy(self._position)
        if self._pending is not None:
            return {"pending": copy.deepcopy(self._pending)}
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Makes the next pass go on where a saved state stood: this
        dataset's own ``state_dict()``, or a whole
        ``StatefulDataLoader.state_dict()`` (every worker's). The next pass
        may run another number of DataLoader workers, or another world size
        with the same global batch (``batch_size * world_size``); every
        remaining sample of the pass comes once. Before the first batch, the
        agent checks the saved provenance: a dataset that changed since
        raises :class:`~granary.errors.DatasetChanged` naming the objects,
        unless ``accept_changed_dataset=True``."""
        states = resume_plan.find_states(state)
        self._pending = states or None
        self._position = None

    def _plan_inputs(self, world: int) -> dict:
        return dict(
            dataset=self.dataset,
            seed=self.seed,
            epoch=self.epoch,
            epochs=self.epochs,
            drop_last=self.drop_last,
            assignment=self.assignment,
            batch_size=self.batch_size,
            world_size=world,
        )

    def _plan_options(self, rank: int, world: int) -> dict:
        """The session options that say which plan ``rank`` of ``world``
        reads from this pass on."""
        return dict(
            batch_size=self.batch_size,
            seed=self.seed,
            first_epoch=self.epoch,
            epochs=self.epochs,
            rank=rank,
            world_size=world,
            drop_last=self.drop_last,
        )

    def _open(self, rank: int, world: int, assignment: dict, first_batch: int, worker: int, workers: int, **extra):
        with Client(self.socket) as client:
            session = client.open_session(
                self.dataset,
                **self._plan_options(rank, world),
                timeout=self.timeout,
                view=self.view,
                verify_crc=self.verify_crc,
                first_batch=first_batch,
                # The dataset resumes itself (below), across its
                # DataLoader workers, with its own timeout and log.
                resume_timeout=None,
                worker=worker,
                workers=workers,
                **assignment,
                **extra,
            )
        if self.pin_memory:
            _cuda.pin_arena(session)
        return session

    def _runs(self, rank: int, world: int, wid: int, workers: int, assignment: dict) -> dict:
        """This process's position at the start of a pass: fresh, or going
        on from the states given to :meth:`load_state_dict`."""
        locality = self.assignment == "locality"
        plan = self._plan_inputs(world)
        position = {
            resume_plan.MARK: 1,
            "plan": plan,
            "rank": rank,
            "wid": wid,
            "W": workers,
            "nb": None,
            "catalog": None,
            "runs": resume_plan.fresh_runs(0, 1) if locality else resume_plan.fresh_runs(wid, workers),
        }
        pending, self._pending = self._pending, None
        if (
            pending
            and any(p["plan"]["epoch"] != plan["epoch"] for p in pending)
            and all(
                r.get("done") or (r["limit"] is not None and r["taken"] >= r["limit"])
                for p in pending
                for r in p["runs"]
            )
        ):
            # A state saved after its pass ended, loaded for another epoch
            # (set_epoch): that pass starts afresh.
            pending = None
        if not pending:
            return position
        old = pending[0]["plan"]
        for field in resume_plan.PLAN_FIELDS:
            if any(p["plan"][field] != plan[field] for p in pending):
                raise ValueError(
                    f"granary: the saved state is of another pass ({field}: {old[field]!r}, this "
                    f"dataset has {plan[field]!r}); set the same {field} before loading it"
                )
        if len({p["rank"] for p in pending}) != 1:
            raise ValueError("granary: the saved state mixes ranks: load each rank's own state")
        # The provenance check, before the first batch: a session opened
        # from the saved state's own session state.
        if pending[0].get("catalog"):
            with Client(self.socket) as client:
                saved = pending[0]["catalog"]
                probe = client.open_session(
                    None,
                    state=resume_plan.exact_twin(saved) if locality else saved,
                    accept_changed=self.accept_changed_dataset,
                    timeout=self.timeout, resume_timeout=None,
                )
            probe.close()
        same_rank = old["world_size"] == world and old["batch_size"] == self.batch_size and pending[0]["rank"] == rank
        own = len(pending) == 1 and pending[0]["wid"] == wid and pending[0]["W"] == workers and same_rank
        position["catalog"] = pending[0].get("catalog")
        if own:
            position["runs"] = copy.deepcopy(pending[0]["runs"])
            position["nb"] = pending[0]["nb"]
            return position
        if locality:
            return self._locality_runs(position, pending, rank, world, wid, workers)
        nb = pending[0]["nb"]
        total = self.epochs * nb
        leftovers, tail = resume_plan.remaining(pending, total)
        if same_rank:
            position["nb"] = nb
            position["runs"] = resume_plan.share(leftovers, tail, total, nb, wid, workers)
            return position
        # Elastic: another world size with the same global batch goes on at
        # the committed global step.
        if old["world_size"] * old["batch_size"] != world * self.batch_size:
            raise ValueError(
                f"granary: the saved state's global batch is {old['world_size']} x {old['batch_size']}; "
                f"this job's is {world} x {self.batch_size}: a job going on with another world size "
                "keeps the global batch (batch_size * world_size)"
            )
        step = resume_plan.elastic_step(leftovers, tail)
        if step is None:
            raise ValueError(
                "granary: the saved state stops inside a batch (per-sample items, or workers not in "
                "step); another world size can go on only at a step boundary: save with batches=True"
            )
        probe = self._open(rank, world, assignment, 0, 0, 1)
        nb_new = probe.info.rank_batches_per_epoch
        probe.close()
        epoch, b = divmod(step, nb)
        start = epoch * nb_new + b
        position["nb"] = nb_new
        position["runs"] = resume_plan.share([], start, self.epochs * nb_new, nb_new, wid, workers)
        return position

    def _locality_runs(self, position: dict, pending: list, rank: int, world: int, wid: int, workers: int) -> dict:
        """Locality mode going on from another rank's, worker count's or
        world size's state: at the committed global step. Each DataLoader
        worker is a session rank of its own (``rank * W + w`` of
        ``world * W``), so the job's global step spans ``W`` training steps;
        the saved state must stand at a whole one (every old worker took as
        many batches), and the new layout's step boundaries must meet it.
        The new plan's steps from there are the rest of the epoch, whatever
        its layout: a global step's samples do not depend on the layout."""
        old = pending[0]["plan"]
        if old["world_size"] * old["batch_size"] != world * self.batch_size:
            raise ValueError(
                f"granary: the saved state's global batch is {old['world_size']} x {old['batch_size']}; "
                f"this job's is {world} x {self.batch_size}: a job going on with another world size "
                "keeps the global batch (batch_size * world_size)"
            )
        nb = next((p["nb"] for p in pending if p["nb"]), None)
        if nb is None:
            # No worker of the saved state opened a session: nothing taken.
            return position
        total = self.epochs * nb
        got = sorted(p["wid"] for p in pending)
        old_workers = pending[0]["W"]
        if got != list(range(old_workers)) or any(p["W"] != old_workers or p["nb"] not in (nb, None) for p in pending):
            raise ValueError(
                f"granary: the saved state covers workers {got} of {old_workers}: pass the whole "
                "DataLoader state (every worker's) to load_state_dict"
            )
        taken = set()
        for p in pending:
            runs = p["runs"]
            if len(runs) != 1 or runs[0]["skip"] or runs[0]["limit"] is not None:
                raise ValueError(
                    'granary: assignment="locality" goes on only from a state saved at a step '
                    "boundary (batches=True)"
                )
            r = runs[0]
            taken.add(total if r.get("done") else r["first"] + r["taken"])
        if len(taken) != 1:
            raise ValueError(
                f'granary: assignment="locality" with {old_workers} DataLoader workers goes on '
                f"only from a training step that is a multiple of {old_workers} (the saved workers "
                f"took {sorted(taken)} batches): save the state at such a step"
            )
        epoch, step = divmod(taken.pop(), nb)
        # Samples of the epoch the job took: `step` global steps of the old
        # session layout (old world size times its workers).
        done = step * old["world_size"] * old_workers * old["batch_size"]
        per_step = world * workers * self.batch_size
        if done % per_step:
            raise ValueError(
                f"granary: the saved state stands {done} samples into epoch {self.epoch + epoch}, "
                f"not a whole global step of this job's {world} ranks x {workers} workers x "
                f"{self.batch_size}: resume with a worker count whose steps meet it"
            )
        srank, sworld = rank * workers + wid, world * workers
        probe = self._open(srank, sworld, {}, 0, 0, 1)
        nb_new = probe.info.rank_batches_per_epoch or probe.info.batches_per_epoch
        probe.close()
        position["nb"] = nb_new
        first = epoch * nb_new + done // per_step
        run = resume_plan.fresh_runs(0, 1)[0]
        run["first"] = first
        if epoch >= self.epochs or first >= self.epochs * nb_new:
            run["done"] = True
        position["runs"] = [run]
        return position

    def __iter__(self) -> Iterator:
        rank, world = rank_and_world(self.rank, self.world_size)
        winfo = get_worker_info()
        wid, workers = (winfo.id, winfo.num_workers) if winfo is not None else (0, 1)
        assignment = self._session_assignment()
        position = self._runs(rank, world, wid, workers, assignment)
        self._position = position
        if self.assignment == "locality":
            # Locality sessions split the job per worker, as the layout says.
            srank, sworld = self.shard()
        else:
            srank, sworld = rank, world
        held: deque = deque()  # (batch, weak refs to buffers still viewed)

        def sweep(session) -> None:
            for _ in range(len(held)):
                batch, refs = held.popleft()
                refs = [r for r in refs if r() is not None]
                if refs:
                    held.append((batch, refs))
                else:
                    session._release_handle(batch)
            if len(held) > self.max_held_batches:
                raise GranaryError(
                    _lib.E_INVALID_ARGUMENT,
                    f"{len(held)} batches are still viewed by tensors kept from earlier items; "
                    "the agent cannot reuse their memory. Copy samples you keep (tensor.clone()) "
                    "or raise max_held_batches",
                    "granary.torch.GranaryDataset",
                )

        session = None
        try:
            for run in position["runs"]:
                if run.get("done") or (run["limit"] is not None and run["taken"] >= run["limit"]):
                    continue

                def open_at(first_batch: int, run=run):
                    return self._open(srank, sworld, assignment, first_batch, run["worker"], run["workers"])

                try:
                    session = open_at(run["first"] + run["taken"])
                except Disconnected as gone:
                    # The agent is restarting as this pass (or this worker) starts.
                    if self.resume_timeout is None:
                        raise
                    session = self._resume(None, gone, open_at, run["first"] + run["taken"])
                if position["nb"] is None:
                    position["nb"] = session.info.rank_batches_per_epoch or session.info.batches_per_epoch
                if position["catalog"] is None:
                    position["catalog"] = session.state()
                while run["limit"] is None or run["taken"] < run["limit"]:
                    sweep(session)
                    try:
                        batch = session.next_batch()
                    except EndOfStream:
                        run["done"] = True
                        break
                    except Disconnected as gone:
                        if self.resume_timeout is None:
                            raise
                        session = self._resume(session, gone, open_at, run["first"] + run["taken"])
                        continue
                    yield from self._items(batch, run, held)
                # The consumer may still hold the last items (a DataLoader
                # collates after the iterator ends): the session ends when
                # they are gone.
                _close_when_unviewed(session, held)
                held = deque()
                session = None
        except BaseException:
            if session is not None:
                session.close()
            raise

    def _items(self, batch, run: dict, held: deque) -> Iterator:
        """The items of one batch; counts them into ``run`` before each is
        handed on (the position a state taken right after it records)."""
        if batch.status != 0 and self.on_error == "raise":
            # The first failed sample's own error (its kind), else the
            # batch's.
            err = next((smp.error for smp in batch if smp.status != 0), None) or batch.error
            batch.release()
            raise err  # type: ignore[misc]
        try:
            xs, ys, ids = [], [], []
            failed: dict[str, int] = {}
            skip = run["skip"]
            for i, sample in enumerate(batch):
                if i < skip:
                    continue  # handed out before the state was saved
                if sample.status != 0:
                    if self.on_error == "raise":
                        raise sample.error  # type: ignore[misc]
                    kind = sample.kind or "Unknown"
                    failed[kind] = failed.get(kind, 0) + 1
                    run["skip"] = i + 1
                    continue
                x, y = self._x(sample), self._y(sample.label)
                if self.batches:
                    xs.append(x)
                    ys.append(y)
                    ids.append(sample.id)
                else:
                    run["skip"] = i + 1
                    if run["skip"] == len(batch):
                        run["taken"] += 1
                        run["skip"] = 0
                    if self.with_ids:
                        yield x, y, sample.id
                    else:
                        yield x, y
                del x
            if failed:
                self._count_failures(batch, failed)
            if self.batches:
                run["taken"] += 1
                run["skip"] = 0
                if xs:
                    item = self._batch_item(xs, ys, ids)
                    del xs
                    yield item
                    del item
            elif run["skip"] != 0:
                # The batch's last samples failed and were left out.
                run["taken"] += 1
                run["skip"] = 0
        except BaseException:
            batch.release()
            raise
        refs = batch._retire()
        held.append((batch, refs))

    def _resume(self, old, gone: GranaryError, open_at: Callable, handed: int):
        """The agent went away: waits up to ``resume_timeout`` for it to
        come back and opens the same pass after the ``handed`` batches
        already handed out, so the consumer sees each batch once."""
        if old is not None:
            try:
                old.close()
            except GranaryError:
                pass
        deadline = time.monotonic() + self.resume_timeout
        pause = 0.05
        while True:
            try:
                session = open_at(handed)
            except (Disconnected, NotFound, Timeout) as e:
                if time.monotonic() + pause > deadline:
                    raise GranaryError(
                        _lib.E_DISCONNECTED,
                        f"the agent went away ({gone.detail or gone}) and did not come back within "
                        f"{self.resume_timeout} s: {e}",
                        "granary.torch.GranaryDataset",
                    ) from e
                time.sleep(pause)
                pause = min(pause * 2, 1.0)
                continue
            log.warning(
                "granary: the agent at %s went away (%s); dataset %r resumed after %d batches",
                self.socket,
                gone.detail or gone,
                self.dataset,
                handed,
            )
            return session


def _close_when_unviewed(session, held) -> None:
    live = [obj for _batch, refs in held for r in refs if (obj := r()) is not None]
    if not live:
        session.close()
        return
    left = [len(live)]

    def gone() -> None:
        left[0] -= 1
        if left[0] == 0:
            session.close()

    for obj in live:
        weakref.finalize(obj, gone)


# Arena memory is mapped read-only; torch.frombuffer is given a writable
# ctypes view of it (to keep the mapping alive), so torch does not warn.
warnings.filterwarnings("ignore", message="The given buffer is not writable", module="granary")
