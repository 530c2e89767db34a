"""Clients, sessions, batches and samples over libgranary.

Lifetimes follow the C API (docs/c-api.md), with checks the C API cannot
make:

* A :class:`Sample`'s bytes are read in place, inside the agent's read-only
  arena mapping. They are valid until the sample's :class:`Batch` is
  released. After that every accessor of the sample raises
  :class:`~granary.errors.ReleasedError`, and the memoryview it handed out
  is released (using it raises ``ValueError``), so a stale sample can never
  read memory the agent has reused.
* Arrays and tensors made from a sample (``numpy()``, ``granary.torch``)
  share its memory too, and cannot be revoked. Each holds a reference that
  keeps the arena *mapped* while it lives, even past the session's close,
  so reading one never crashes; but once the batch is released the agent
  may reuse those bytes. Copy what you keep beyond the batch.
* A session is closed (in C) when it has been closed in Python and the last
  such array or tensor is gone.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Iterator, Optional

from . import _lib
from ._lib import lib
from .errors import EndOfStream, GranaryError, ReleasedError, check, error_for, failure_kind

DEFAULT_SOCKET = "/run/granary/granary.sock"
DEFAULT_TIMEOUT = 30.0
#: Seconds a session waits for a lost agent to come back (``resume_timeout``).
DEFAULT_RESUME_TIMEOUT = 60.0

_DEFAULT = object()


def default_socket() -> str:
    """``$GRANARY_SOCKET``, else the packaged agent's ``/run/granary/granary.sock``."""
    return os.environ.get("GRANARY_SOCKET") or DEFAULT_SOCKET


def _timeout_ms(timeout: Optional[float]) -> int:
    if timeout is None or timeout == math.inf:
        return _lib.WAIT_FOREVER
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0 or None, not {timeout}")
    return min(int(math.ceil(timeout * 1000.0)), 2**31 - 1)


#: Session handles closed by their mapping's finalizer. At interpreter exit
#: (and in a garbage cycle) the finalizer can run while the Session, or a
#: suspended generator holding a batch, still has the handle: every later
#: call on it is refused instead of reaching freed memory.
_CLOSED_HANDLES: set = set()


def _close_session_handle(handle: int, pid: int) -> None:
    # A forked child inherits the handle but must not close its parent's
    # session (that would hang up the parent's connection to the agent).
    if handle and os.getpid() == pid:
        _CLOSED_HANDLES.add(handle)
        lib.granary_session_close(handle)


class _Mapping:
    """Owns the C session handle, hence the arena mapping.

    The Python :class:`Session` holds one reference, and so does every
    sample buffer handed out (and, through it, every array or tensor made
    from it). ``granary_session_close`` runs when the last one goes.
    """

    __slots__ = ("handle", "__weakref__")

    def __init__(self, handle: int):
        self.handle = handle
        weakref.finalize(self, _close_session_handle, handle, os.getpid())


@dataclass(frozen=True)
class SessionInfo:
    """What the agent said about a session (``granary_session_get_info``)."""

    session_id: int
    samples_per_epoch: int
    batches_per_epoch: int
    arena_size: int
    ready_capacity: int
    release_capacity: int
    #: Batches the whole rank receives per epoch (``batches_per_epoch`` is
    #: this session's part when it takes one worker's share).
    rank_batches_per_epoch: int = 0
    #: ``(height, width, channels)`` of every sample when the agent prepares
    #: the dataset (``[dataset.prepare]``: decoded, resized uint8 RGB, row-major
    #: HWC); None for a dataset served as stored bytes.
    prepared_shape: Optional[tuple] = None


class Sample:
    """One sample of a batch: metadata and a zero-copy view of its bytes.

    Valid until its batch is released; afterwards every accessor raises
    :class:`~granary.errors.ReleasedError`.
    """

    __slots__ = ("_batch", "_id", "_label", "_status", "_crc", "_len", "_addr", "_buf", "_mv")

    def __init__(self, batch: "Batch", raw: _lib.Sample):
        self._batch = batch
        self._id = raw.id
        self._label = raw.label
        self._status = raw.status
        self._crc = raw.crc32c
        self._len = raw.length
        self._addr = raw.data or 0
        self._buf = None
        self._mv = None

    def _check(self) -> None:
        if not self._batch._live:
            raise ReleasedError(
                detail=f"sample {self._id} belongs to batch {self._batch._index} of epoch "
                f"{self._batch._epoch}, which was released",
                context="granary.Sample",
            )

    @property
    def id(self) -> int:
        """Stable sample id within the dataset."""
        self._check()
        return self._id

    @property
    def label(self) -> int:
        """Class label, -1 when the dataset has none."""
        self._check()
        return self._label

    @property
    def status(self) -> int:
        """0, or the negative ``GRANARY_E_*`` code of this sample."""
        self._check()
        return self._status

    @property
    def crc32c(self) -> int:
        """CRC-32C of the bytes, as recorded by the agent."""
        self._check()
        return self._crc

    @property
    def address(self) -> int:
        """Address of the first byte (inside the arena mapping); 0 for a failed sample."""
        self._check()
        return self._addr

    @property
    def prepared_shape(self) -> Optional[tuple]:
        """``(height, width, channels)`` when the agent prepares the dataset
        (the sample is decoded, resized uint8 RGB, row-major HWC), else None."""
        return self._batch._session.info.prepared_shape

    @property
    def kind(self) -> Optional[str]:
        """Why the sample failed, or None: ``"NotFound"`` (gone from the
        source), ``"Io"`` (a transient failure persisted), ``"Timeout"`` (the
        read timed out), ``"Corrupt"`` (its bytes failed a check),
        ``"ShortRead"`` (its size changed since the catalog was made) or
        ``"Decode"`` (the agent's prepare stage could not decode it)."""
        self._check()
        return failure_kind(self._status)

    @property
    def error(self) -> Optional[GranaryError]:
        """The sample's error as an exception (:class:`~granary.errors.NotFound`,
        :class:`~granary.errors.SourceError`, :class:`~granary.errors.Timeout`,
        :class:`~granary.errors.Corrupt`, :class:`~granary.errors.ShortRead`
        or :class:`~granary.errors.DecodeError`),
        or None."""
        self._check()
        if self._status == 0:
            return None
        return error_for(
            self._status,
            f"sample {self._id} could not be read ({failure_kind(self._status)})",
            "granary.Sample",
        )

    def __len__(self) -> int:
        self._check()
        return self._len

    def buffer(self):
        """The ctypes ``c_ubyte`` array over the sample's bytes (no copy).

        It keeps the arena mapped while it lives. The memory is read-only:
        writing through it crashes the process. Prefer :attr:`data`.
        """
        self._check()
        if self._status != 0:
            raise self.error  # type: ignore[misc]
        buf = self._buf
        if buf is None:
            buf = (ctypes.c_ubyte * self._len).from_address(self._addr)
            # Keeps the mapping (and so the bytes' address space) alive for
            # as long as anything refers to this buffer.
            buf._granary_mapping = self._batch._session._mapping
            self._buf = buf
        return buf

    @property
    def data(self) -> memoryview:
        """A read-only ``memoryview`` (format ``B``) of the bytes, without a copy.

        Released, together with the sample, when the batch is released.
        """
        self._check()
        mv = self._mv
        if mv is None:
            mv = memoryview(self.buffer()).cast("B").toreadonly()
            self._mv = mv
        return mv

    def fields(self) -> dict:
        """The named fields of a sample of a ``format = "webdataset"``
        dataset: ``{extension: memoryview}`` (``"jpg"``, ``"cls"``, …), each
        a read-only slice of :attr:`data` (no copy), in stored order; the
        first member of a name wins. Parsed by libgranary, which checks every
        tar header's checksum and bounds against the sample's length.

        Raises :class:`~granary.errors.Corrupt` for malformed bytes, and the
        sample's error for a failed sample.
        """
        self._check()
        if self._status != 0:
            raise self.error  # type: ignore[misc]
        data = self.data
        raw = _lib.Sample(self._addr, self._len, self._id, self._label, 0, self._crc)
        cursor = ctypes.c_uint64(0)
        field = _lib.Field()
        out: dict = {}
        while True:
            rc = lib.granary_sample_next_field(
                ctypes.byref(raw), ctypes.byref(cursor), ctypes.byref(field)
            )
            if rc == 0:
                return out
            if rc < 0:
                check(rc, "granary_sample_next_field")
            name = ctypes.string_at(field.name, field.name_length).decode("utf-8", "replace")
            start = (field.data or self._addr) - self._addr
            if name not in out:
                out[name] = data[start : start + field.length]

    def numpy(self):
        """A read-only ``numpy.uint8`` array over the bytes (no copy).

        Valid until the batch is released (see the module notes).
        """
        import numpy as np

        return np.frombuffer(self.data, dtype=np.uint8)

    def tobytes(self) -> bytes:
        """A copy of the bytes."""
        return self.data.tobytes()

    def __bytes__(self) -> bytes:
        return self.tobytes()

    def _invalidate(self) -> Optional[weakref.ref]:
        """Drops this sample's views; returns a weak reference to its buffer
        when one was handed out (alive while arrays or tensors use it)."""
        ref = None
        if self._mv is not None:
            try:
                self._mv.release()
            except BufferError:
                pass  # numpy arrays still export it; they keep the buffer alive
            self._mv = None
        if self._buf is not None:
            ref = weakref.ref(self._buf)
            self._buf = None
        return ref

    def __repr__(self) -> str:
        state = "" if self._batch._live else ", released"
        return f"<granary.Sample id={self._id} label={self._label} len={self._len}{state}>"


class Batch:
    """A batch on loan from the agent. Release it (``release()``, ``with``,
    or let :meth:`Session.__iter__` do it) so the agent can reuse its memory."""

    __slots__ = ("_session", "_handle", "_live", "_len", "_epoch", "_index", "_flags", "_status", "_samples", "__weakref__")

    def __init__(self, session: "Session", handle: int, status: int):
        self._session = session
        self._handle = handle
        self._live = True
        self._len = lib.granary_batch_len(handle)
        self._epoch = lib.granary_batch_epoch(handle)
        self._index = lib.granary_batch_index(handle)
        self._flags = lib.granary_batch_flags(handle)
        self._status = status
        self._samples: list[Optional[Sample]] = [None] * self._len

    def _check(self) -> None:
        if not self._live or self._session._gone():
            raise ReleasedError(
                detail=f"batch {self._index} of epoch {self._epoch} was released",
                context="granary.Batch",
            )

    @property
    def released(self) -> bool:
        return not self._live

    @property
    def epoch(self) -> int:
        self._check()
        return self._epoch

    @property
    def index(self) -> int:
        """Index of the batch within its epoch for this rank."""
        self._check()
        return self._index

    @property
    def status(self) -> int:
        """0, or the batch's negative ``GRANARY_E_*`` status (e.g. a source error)."""
        self._check()
        return self._status

    @property
    def error(self) -> Optional[GranaryError]:
        self._check()
        if self._status == 0:
            return None
        return error_for(
            self._status,
            f"batch {self._index} of epoch {self._epoch} could not be filled",
            "granary.Batch",
        )

    @property
    def end_of_epoch(self) -> bool:
        self._check()
        return bool(self._flags & _lib.BATCH_END_OF_EPOCH)

    @property
    def end_of_stream(self) -> bool:
        self._check()
        return bool(self._flags & _lib.BATCH_END_OF_STREAM)

    def __len__(self) -> int:
        self._check()
        return self._len

    def __getitem__(self, i: int) -> Sample:
        self._check()
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"sample index {i} out of range for a batch of {self._len}")
        s = self._samples[i]
        if s is None:
            raw = _lib.Sample()
            check(lib.granary_batch_sample(self._handle, i, ctypes.byref(raw)), "granary_batch_sample")
            s = Sample(self, raw)
            self._samples[i] = s
        return s

    def __iter__(self) -> Iterator[Sample]:
        for i in range(len(self)):
            yield self[i]

    @property
    def samples(self) -> list[Sample]:
        return list(self)

    @property
    def ids(self) -> list[int]:
        return [s.id for s in self]

    @property
    def labels(self) -> list[int]:
        return [s.label for s in self]

    def _retire(self) -> list[weakref.ref]:
        """Makes the batch and its samples unusable, without handing it back
        yet; returns weak references to the buffers still in use."""
        self._live = False
        refs = []
        for s in self._samples:
            if s is not None:
                r = s._invalidate()
                if r is not None and r() is not None:
                    refs.append(r)
        self._samples = []
        return refs

    def release(self) -> None:
        """Hands the batch back to the agent. Idempotent."""
        if self._handle is None:
            return
        self._retire()
        self._session._release_handle(self)

    def __enter__(self) -> "Batch":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if not self._live else f"{self._len} samples"
        return f"<granary.Batch epoch={self._epoch} index={self._index} {state}>"


def _options(
    dataset: str,
    *,
    batch_size: int = 32,
    seed: int = 0,
    first_epoch: int = 0,
    epochs: int = 1,
    rank: int = 0,
    world_size: int = 1,
    drop_last: bool = False,
    ready_capacity: int = 0,
    release_capacity: int = 0,
    view: Optional[bytes] = None,
    view_required: bool = False,
    layout: Optional[bytes] = None,
    locality: Optional[bytes] = None,
    verify_crc: bool = False,
    first_batch: int = 0,
    resume_timeout: Optional[float] = DEFAULT_RESUME_TIMEOUT,
    worker: int = 0,
    workers: int = 1,
    state: Optional[bytes] = None,
    accept_changed: bool = False,
):
    """The C options struct, and the buffers it points into (keep them
    alive while it is used)."""
    opts = _lib.SessionOptions()
    check(lib.granary_session_options_init(ctypes.byref(opts)), "granary_session_options_init")
    name = (dataset or "").encode("utf-8")
    keep: list = [name]
    opts.dataset = name
    opts.seed = seed & (2**64 - 1)
    opts.first_epoch = first_epoch
    opts.epoch_count = epochs
    opts.batch_size = batch_size
    opts.rank = rank
    opts.world_size = world_size
    opts.drop_last = 1 if drop_last else 0
    opts.ready_capacity = ready_capacity
    opts.release_capacity = release_capacity

    def point_at(data: bytes) -> tuple:
        """`data` in a buffer kept alive with the options: (pointer, length)."""
        buf = ctypes.create_string_buffer(bytes(data), len(data))
        keep.append(buf)
        return ctypes.cast(buf, ctypes.c_void_p), len(data)

    if view is not None:
        opts.view, opts.view_len = point_at(view)
        opts.view_required = 1 if view_required else 0
    if layout is not None:
        opts.layout, opts.layout_len = point_at(layout)
    opts.no_crc_check = 0 if verify_crc else 1
    opts.first_batch = first_batch
    opts.worker = worker
    opts.workers = workers
    if state is not None:
        opts.resume_state, opts.resume_state_len = point_at(state)
        opts.accept_changed_dataset = 1 if accept_changed else 0
    if resume_timeout is None or resume_timeout <= 0:
        opts.resume_timeout_ms = _lib.RESUME_OFF
    else:
        opts.resume_timeout_ms = max(1, min(int(resume_timeout * 1000), _lib.RESUME_OFF - 1))
    if locality is not None:
        if len(locality) != 32:
            raise ValueError("locality: the agreed digest is 32 bytes")
        opts.locality = 1
        opts.locality_digest[:] = list(bytes(locality))
    return opts, keep


class Session:
    """An open session: the stream of batches of one loader (one rank).

    Use it from one thread at a time (calls are serialised by a lock).
    Iterating yields batches and releases each one when the loop moves on.

    When the agent goes away (a crash, a restart), the next call waits up
    to ``resume_timeout`` seconds (default 60) for it to come back and goes
    on with the next batch of the same plan (:attr:`resumes` counts how
    often); ``resume_timeout=None`` raises
    :class:`~granary.errors.Disconnected` at once instead.
    """

    def __init__(
        self,
        client: "Client",
        dataset: str,
        *,
        batch_size: int = 32,
        seed: int = 0,
        first_epoch: int = 0,
        epochs: int = 1,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        ready_capacity: int = 0,
        release_capacity: int = 0,
        timeout: Optional[float] = DEFAULT_TIMEOUT,
        view: Optional[bytes] = None,
        view_required: bool = False,
        layout: Optional[bytes] = None,
        locality: Optional[bytes] = None,
        verify_crc: bool = False,
        first_batch: int = 0,
        resume_timeout: Optional[float] = DEFAULT_RESUME_TIMEOUT,
        worker: int = 0,
        workers: int = 1,
        state: Optional[bytes] = None,
        accept_changed: bool = False,
    ):
        if client._handle is None:
            raise ReleasedError(detail="the client was closed", context="granary.Session")
        opts, keep = _options(
            dataset,
            batch_size=batch_size,
            seed=seed,
            first_epoch=first_epoch,
            epochs=epochs,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            ready_capacity=ready_capacity,
            release_capacity=release_capacity,
            view=view,
            view_required=view_required,
            layout=layout,
            locality=locality,
            verify_crc=verify_crc,
            first_batch=first_batch,
            resume_timeout=resume_timeout,
            worker=worker,
            workers=workers,
            state=state,
            accept_changed=accept_changed,
        )
        _timeout_ms(timeout)  # validate early
        self.dataset = dataset
        self.timeout = timeout
        self._lock = threading.Lock()
        self._lent: set[Batch] = set()
        self._closed = False
        handle = ctypes.c_void_p()
        check(
            lib.granary_session_open(client._handle, ctypes.byref(opts), ctypes.byref(handle)),
            f"opening a session on dataset {dataset!r} at {client.socket}",
        )
        self._handle: int = handle.value  # type: ignore[assignment]
        _CLOSED_HANDLES.discard(self._handle)  # a new session at a freed one's address
        self._mapping: Optional[_Mapping] = _Mapping(self._handle)
        info = _lib.SessionInfo()
        info.struct_size = ctypes.sizeof(info)
        check(lib.granary_session_get_info(self._handle, ctypes.byref(info)), "granary_session_get_info")
        self.info = SessionInfo(
            info.session_id,
            info.samples_per_epoch,
            info.batches_per_epoch,
            info.arena_size,
            info.ready_capacity,
            info.release_capacity,
            info.rank_batches_per_epoch,
            (info.prepared_height, info.prepared_width, info.prepared_channels)
            if info.prepared_height
            else None,
        )
        base = ctypes.c_void_p()
        size = ctypes.c_uint64()
        check(lib.granary_session_arena(self._handle, ctypes.byref(base), ctypes.byref(size)), "granary_session_arena")
        self._arena = (base.value or 0, size.value)
        self._resumes = 0
        del keep
        #: The digest of the locality-aware assignment this session
        #: delivers, None in exact order.
        self.locality = locality
        #: The epoch of the membership view handed in with ``view``, once
        #: the agent holds it; None otherwise.
        self.view_epoch: Optional[int] = None
        #: Why the agent refused the view handed in (the session reads
        #: through whatever view it holds); None otherwise.
        self.view_error: Optional[GranaryError] = None
        if view is not None:
            epoch = ctypes.c_uint64()
            rc = lib.granary_session_view(self._handle, ctypes.byref(epoch))
            if rc == _lib.OK:
                self.view_epoch = epoch.value
            else:
                self.view_error = error_for(rc, _lib.last_error_message(), "granary_session_view")

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def arena(self) -> tuple[int, int]:
        """``(base address, size)`` of the read-only arena mapping; every
        sample's bytes lie inside it (the new agent's after a resume)."""
        with self._lock:
            if self._closed:
                return self._arena
            base, size = ctypes.c_void_p(), ctypes.c_uint64()
            check(lib.granary_session_arena(self._handle, ctypes.byref(base), ctypes.byref(size)), "granary_session_arena")
            self._arena = (base.value or 0, size.value)
            return self._arena

    @property
    def resumes(self) -> int:
        """How many times the session reopened itself after its agent went
        away (see ``resume_timeout``)."""
        with self._lock:
            if not self._closed:
                n = ctypes.c_uint32()
                check(lib.granary_session_resumes(self._handle, ctypes.byref(n)), "granary_session_resumes")
                self._resumes = n.value
            return self._resumes

    def state(self) -> bytes:
        """The session's checkpointable state: the plan's inputs, the
        committed position (the batches :meth:`next_batch` handed out) and
        the dataset's provenance. ``open_session(state=...)`` opens the
        session again at the next batch, in any process, against this agent
        or a restarted one; the agent refuses with
        :class:`~granary.errors.DatasetChanged`, naming the changed objects,
        when the dataset changed since (``accept_changed=True`` opens
        anyway)."""
        with self._lock:
            self._usable()
            buf = ctypes.create_string_buffer(_lib.STATE_MAX)
            n = ctypes.c_size_t()
            check(
                lib.granary_session_state(self._handle, buf, _lib.STATE_MAX, ctypes.byref(n)),
                "granary_session_state",
            )
            return buf.raw[: n.value]

    def _gone(self) -> bool:
        """Closed, or its C session already closed by the finalizer."""
        return self._closed or self._handle in _CLOSED_HANDLES

    def _usable(self) -> None:
        if self._gone():
            raise ReleasedError(detail=f"the session on {self.dataset!r} was closed", context="granary.Session")

    def next_batch(self, timeout=_DEFAULT) -> Batch:
        """The next batch, waiting up to ``timeout`` seconds (default: the
        session's; None waits forever; 0 does not wait).

        Raises :class:`~granary.errors.EndOfStream` after the last batch,
        :class:`~granary.errors.Timeout`, :class:`~granary.errors.Disconnected`
        when the agent went away (never later than the timeout), ...
        A batch the agent could not fill is returned with a non-zero
        ``status``; its failed samples raise when their bytes are read.
        """
        ms = _timeout_ms(self.timeout if timeout is _DEFAULT else timeout)
        out = ctypes.c_void_p()
        with self._lock:
            self._usable()
            rc = lib.granary_next_batch(self._handle, ms, ctypes.byref(out))
            if out.value is None:
                check(rc, f"next batch of dataset {self.dataset!r}")
                raise GranaryError(rc, "no batch and no error", "granary_next_batch")
            batch = Batch(self, out.value, rc)
            self._lent.add(batch)
            return batch

    def try_next_batch(self) -> Optional[Batch]:
        """The next batch if one is ready, else None."""
        try:
            return self.next_batch(timeout=0)
        except GranaryError as e:
            if e.code == _lib.E_WOULD_BLOCK:
                return None
            raise

    def __iter__(self) -> Iterator[Batch]:
        """Yields batches until the end of the stream; each is released when
        the loop asks for the next one (or stops)."""
        while True:
            try:
                batch = self.next_batch()
            except EndOfStream:
                return
            try:
                yield batch
            finally:
                batch.release()

    def _release_handle(self, batch: Batch) -> None:
        with self._lock:
            handle, batch._handle = batch._handle, None
            if handle is None or batch not in self._lent:
                return
            self._lent.discard(batch)
            if self._gone():
                return
            check(lib.granary_batch_release(self._handle, handle), "granary_batch_release")

    def close(self) -> None:
        """Releases every batch still on loan and closes the session.
        Idempotent. Arrays and tensors still viewing samples keep the
        arena mapped (and the C session open) until they are gone."""
        with self._lock:
            if self._closed:
                return
            lent, self._lent = list(self._lent), set()
            gone = self._gone()
            for b in lent:
                b._retire()
                handle, b._handle = b._handle, None
                if handle is not None and not gone:
                    lib.granary_batch_release(self._handle, handle)
            self._closed = True
            self._mapping = None  # the C close runs now unless views remain

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"id={self.info.session_id}"
        return f"<granary.Session {self.dataset!r} {state}>"


MEMBERSHIP_MODES = {0: "off", 1: "static", 2: "slurm", 3: "session", 4: "dns"}


@dataclass(frozen=True)
class PeerIdentity:
    """Who an agent is among its job's agents (``granary_get_peer_identity``),
    and the membership view it holds."""

    membership: str
    """Where its view comes from: "off", "static", "slurm", "session"
    (handed in by loaders, see :func:`granary.torch.gather_view`) or "dns"
    (a DNS name the agent resolves itself; it takes no view from loaders)."""
    node_id: str
    addr: str
    capacity: int
    job_id: str
    view_epoch: int
    view_digest: bytes
    members: int


def encode_view(job_id: str, epoch: int, members) -> bytes:
    """The canonical bytes of the membership view of job ``job_id`` at
    ``epoch`` with ``members`` (:class:`PeerIdentity` or ``(node_id, addr,
    capacity)`` tuples, in any order; repeats count once)."""
    rows = []
    for m in members:
        if isinstance(m, PeerIdentity):
            m = (m.node_id, m.addr, m.capacity)
        node_id, addr, capacity = m
        rows.append((node_id.encode("utf-8"), addr.encode("utf-8"), int(capacity)))
    arr = (_lib.ViewMember * max(len(rows), 1))()
    for i, (node_id, addr, capacity) in enumerate(rows):
        arr[i].id = node_id
        arr[i].addr = addr
        arr[i].capacity = capacity
    job = job_id.encode("utf-8")
    need = ctypes.c_size_t()
    rc = lib.granary_view_encode(job, epoch, arr, len(rows), None, 0, ctypes.byref(need))
    if rc not in (_lib.OK, _lib.E_NO_MEMORY):
        check(rc, "granary_view_encode")
    buf = ctypes.create_string_buffer(need.value)
    check(
        lib.granary_view_encode(job, epoch, arr, len(rows), buf, need.value, ctypes.byref(need)),
        "granary_view_encode",
    )
    return buf.raw[: need.value]


def encode_layout(view: bytes, node_ids, workers: int = 1) -> bytes:
    """The job's rank layout for the locality-aware assignment:
    ``node_ids[r]`` is the node id (:attr:`PeerIdentity.node_id`, a member of
    ``view``) rank ``r`` runs on; with ``workers`` sessions per rank,
    session rank ``r * workers + w`` runs where rank ``r`` does."""
    ids = [str(n).encode("utf-8") for n in node_ids]
    arr = (ctypes.c_char_p * max(len(ids), 1))(*ids)
    vbuf = ctypes.create_string_buffer(bytes(view), len(view))
    need = ctypes.c_size_t()
    rc = lib.granary_layout_encode(vbuf, len(view), arr, len(ids), workers, None, 0, ctypes.byref(need))
    if rc not in (_lib.OK, _lib.E_NO_MEMORY):
        check(rc, "granary_layout_encode")
    buf = ctypes.create_string_buffer(need.value)
    check(
        lib.granary_layout_encode(vbuf, len(view), arr, len(ids), workers, buf, need.value, ctypes.byref(need)),
        "granary_layout_encode",
    )
    return buf.raw[: need.value]


@dataclass(frozen=True)
class AssignmentInfo:
    """An agent's answer to :meth:`Client.assignment`."""

    locality: bool
    """Whether the locality-aware assignment is available."""
    digest: bytes
    """SHA-256 of its inputs (zeros when not available)."""
    note: str
    """Why not, when not available."""


@dataclass(frozen=True)
class JobPosition:
    """An agent's answer to :meth:`Client.job_position`: where the job
    stands in a plan, from the agent's own sessions and its peers' job
    status."""

    epoch: int
    """The epoch of the job's committed step."""
    step: int
    """Batches of ``epoch`` every known rank of the plan has taken."""
    ranks_known: int
    """Ranks of the plan whose position the agent knows."""
    nodes: int
    """Agents whose reports named a rank of the plan (its own included)."""
    first_batch: int
    """Pass as ``first_batch=`` with the same options to open at the
    committed step."""
    rank_position: Optional[tuple[int, int]]
    """The queried rank's own ``(epoch, step)``, when known."""


def agree(infos) -> tuple[Optional[bytes], str]:
    """A job's decision from every rank's :class:`AssignmentInfo`
    (``infos[r]`` is rank ``r``'s): ``(digest, "")`` when every rank can run
    the locality-aware assignment with one digest, else ``(None, why)``
    naming the first rank that differs. The same rule as libgranary's."""
    infos = list(infos)
    if not infos:
        return None, "no rank answered"
    for r, i in enumerate(infos):
        if not i.locality:
            return None, f"rank {r} cannot run the locality-aware assignment: {i.note}"
    for r, i in enumerate(infos):
        if i.digest != infos[0].digest:
            return None, (
                f"rank {r}'s inputs (digest {i.digest[:6].hex()}…) differ from rank 0's "
                f"({infos[0].digest[:6].hex()}…): the ranks disagree on the seed, epochs, "
                "batch size, view, layout or dataset"
            )
    return infos[0].digest, ""


class Client:
    """A connection point to one agent (``granary_connect``)."""

    def __init__(self, socket: Optional[str] = None):
        self.socket = str(socket) if socket is not None else default_socket()
        self._pid = os.getpid()
        handle = ctypes.c_void_p()
        check(
            lib.granary_connect(os.fsencode(self.socket), ctypes.byref(handle)),
            f"connecting to the agent at {self.socket}",
        )
        self._handle: Optional[int] = handle.value

    def open_session(self, dataset: str, **options) -> Session:
        """Opens a session; see :class:`Session` for the options."""
        return Session(self, dataset, **options)

    def peer_identity(self, timeout: Optional[float] = DEFAULT_TIMEOUT) -> PeerIdentity:
        """Asks the agent who it is among its job's agents."""
        if self._handle is None:
            raise ReleasedError(detail="the client was closed", context="granary.Client")
        out = _lib.PeerIdentity()
        out.struct_size = ctypes.sizeof(out)
        check(
            lib.granary_get_peer_identity(self._handle, ctypes.byref(out), _timeout_ms(timeout)),
            f"asking the agent at {self.socket} who it is",
        )
        return PeerIdentity(
            MEMBERSHIP_MODES.get(out.membership, str(out.membership)),
            out.node_id.decode("utf-8", "replace"),
            out.addr.decode("utf-8", "replace"),
            out.capacity,
            out.job_id.decode("utf-8", "replace"),
            out.view_epoch,
            bytes(out.view_digest),
            out.members,
        )

    def assignment(self, dataset: str, **options) -> AssignmentInfo:
        """Whether the session these options describe (those of
        :class:`Session`, with ``view`` and ``layout``) could be delivered
        in the locality-aware assignment, and the digest of its inputs."""
        if self._handle is None:
            raise ReleasedError(detail="the client was closed", context="granary.Client")
        options.pop("timeout", None)
        options.pop("locality", None)
        opts, keep = _options(dataset, **options)
        out = _lib.AssignmentInfo()
        out.struct_size = ctypes.sizeof(out)
        check(
            lib.granary_assignment_query(self._handle, ctypes.byref(opts), ctypes.byref(out)),
            f"asking the agent at {self.socket} for the assignment of {dataset!r}",
        )
        del keep
        return AssignmentInfo(bool(out.locality), bytes(out.digest), out.note.decode("utf-8", "replace"))

    def job_position(self, dataset: str, **options) -> JobPosition:
        """Where the job stands in the plan these options describe (those of
        :class:`Session`: ``seed``, ``batch_size``, ``world_size``,
        ``drop_last``; ``rank``, ``first_epoch``, ``epochs``, ``worker``
        and ``workers`` say which ``first_batch`` to answer with). A
        replacement rank asks its own agent and opens with
        ``first_batch=pos.first_batch``. Raises ``NotFound`` when no agent of
        the job reported a rank of the plan."""
        if self._handle is None:
            raise ReleasedError(detail="the client was closed", context="granary.Client")
        options.pop("first_batch", None)
        opts, keep = _options(dataset, **options)
        out = _lib.JobPosition()
        out.struct_size = ctypes.sizeof(out)
        check(
            lib.granary_job_position(self._handle, ctypes.byref(opts), ctypes.byref(out)),
            f"asking the agent at {self.socket} where the job stands in {dataset!r}",
        )
        del keep
        rank = (out.rank_epoch, out.rank_step) if out.rank_known else None
        return JobPosition(out.epoch, out.step, out.ranks_known, out.nodes, out.first_batch, rank)

    def join_view(self, view: bytes, timeout: Optional[float] = DEFAULT_TIMEOUT) -> int:
        """Hands the agent the job's membership view without opening a
        session; returns the epoch of the view it holds now."""
        if self._handle is None:
            raise ReleasedError(detail="the client was closed", context="granary.Client")
        buf = ctypes.create_string_buffer(bytes(view), len(view))
        epoch = ctypes.c_uint64()
        check(
            lib.granary_join_view(self._handle, buf, len(view), ctypes.byref(epoch), _timeout_ms(timeout)),
            f"handing the membership view to the agent at {self.socket}",
        )
        return epoch.value

    def close(self) -> None:
        """Frees the client; sessions opened from it stay open."""
        h, self._handle = self._handle, None
        if h is not None and os.getpid() == self._pid:
            lib.granary_client_free(h)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<granary.Client {self.socket}>"


def connect(socket: Optional[str] = None) -> Client:
    """Connects to the agent at ``socket`` (default: ``$GRANARY_SOCKET`` or
    ``/run/granary/granary.sock``)."""
    return Client(socket)


def open_session(dataset: str, socket: Optional[str] = None, **options) -> Session:
    """Connects and opens one session (the client is freed; the session
    does not need it)."""
    with Client(socket) as c:
        return c.open_session(dataset, **options)
