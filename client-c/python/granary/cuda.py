"""CUDA: the arena as pinned host memory, so host-to-device copies are DMA.

A session's samples lie in its arena, a read-only mapping shared with the
agent (:attr:`granary.Session.arena`). :func:`pin_arena` registers that
mapping with CUDA as page-locked host memory (``cudaHostRegister`` with
``cudaHostRegisterReadOnly``, the flag a read-only mapping needs; then the
default flags). Every tensor that views the arena (``granary.torch.as_tensor``,
the ``x`` of a :class:`~granary.torch.GranaryDataset` item) is then pinned:
``tensor.is_pinned()`` is True and ``tensor.to("cuda", non_blocking=True)``
is one DMA transfer straight from the agent's memory, with no copy on the
CPU and no wait in the training loop.

When registration is refused (no read-only registration on this driver or
device, a locked-memory limit, a virtual machine that cannot pin shared
pages), the pin falls back to staging: :func:`to_device` copies the bytes
into page-locked buffers from PyTorch's caching host allocator (a ring of
``torch.empty(..., pin_memory=True)`` blocks, each reused once the transfer
that read it has finished) and transfers from there, still with
``non_blocking=True``. :attr:`ArenaPin.mode` says which
(``"registered"``, ``"staging"``, or ``"off"`` without CUDA or in a
DataLoader worker) and :attr:`ArenaPin.reason` why.

The registration lives as long as the mapping: it is undone
(``cudaHostUnregister``) just before the arena is unmapped, when the session
is closed and the last tensor viewing it is gone.

**Lifetime of a non-blocking copy.** A DMA transfer reads the arena after
:func:`to_device` has returned. :func:`to_device` therefore keeps the source
tensor alive (and so its Granary batch on loan: the agent cannot reuse the
bytes) until a CUDA event recorded after the transfer has completed; it
checks those events on every call, and :func:`wait_pending` waits for all.
A bare ``x.to("cuda", non_blocking=True)`` on an arena tensor does not do
this: keep ``x`` alive until the stream has passed the copy, or use
:func:`to_device`.

Typical use, in the training process itself (no DataLoader workers unless
transforms need CPU)::

    from granary.torch import GranaryDataset
    from granary.cuda import prefetch

    ds = GranaryDataset("train", batch_size=256, batches=True, pin_memory=True)
    for xs, ys in prefetch(ds, "cuda"):   # already on the GPU
        ...

:func:`prefetch` runs the dataset's iterator in one thread of the training
process, ``depth`` items ahead, and transfers each item on its own CUDA
stream; ``for xs, ys in ds: xs, ys = to_device((xs, ys), "cuda")`` does the
same without the thread (the next batch is then fetched only when the loop
asks for it).
"""

from __future__ import annotations

import ctypes
import queue
import threading
import weakref
from collections import deque
from typing import Optional

import torch

__all__ = [
    "ArenaPin",
    "REGISTER_READ_ONLY",
    "pin_arena",
    "pinned_ranges",
    "prefetch",
    "stack_pinned",
    "to_device",
    "wait_pending",
]

#: ``cudaHostRegisterDefault``, ``cudaHostRegisterPortable`` and
#: ``cudaHostRegisterReadOnly`` (driver ``CU_MEMHOSTREGISTER_READ_ONLY``).
REGISTER_DEFAULT = 0x00
REGISTER_PORTABLE = 0x01
REGISTER_READ_ONLY = 0x08

#: Flags tried in order: the arena is mapped read-only, so the read-only
#: flag comes first; the default flags succeed only where the driver pins
#: read-only pages anyway.
REGISTER_FLAGS = (REGISTER_READ_ONLY | REGISTER_PORTABLE, REGISTER_READ_ONLY, REGISTER_DEFAULT)

#: Pending non-blocking copies kept before :func:`to_device` waits for the
#: oldest one.
MAX_PENDING = 256

_lock = threading.RLock()
# base -> (end, ArenaPin) for every registered range.
_ranges: dict[int, tuple[int, "ArenaPin"]] = {}
# (event, source tensor) per non-blocking copy not yet known to be done.
_pending: deque = deque()


def _in_worker() -> bool:
    try:
        from torch.utils.data import get_worker_info
    except ImportError:  # pragma: no cover
        return False
    return get_worker_info() is not None


def _cuda_reason() -> Optional[str]:
    """Why CUDA cannot be used here, or None."""
    if not torch.cuda.is_available():
        return "CUDA is not available (torch.cuda.is_available() is False)"
    if _in_worker():
        return "in a DataLoader worker: CUDA is not used in forked workers; pin in the training process"
    return None


class ArenaPin:
    """How a session's arena is made DMA-able (see the module notes).

    ``mode``: ``"registered"`` (the mapping is page-locked with
    ``cudaHostRegister``; ``flags`` holds the flags that worked),
    ``"staging"`` (copies go through page-locked staging buffers;
    ``reason`` says why registration was not used) or ``"off"`` (no CUDA
    here; copies are plain ``Tensor.to``). ``base`` and ``size`` are the
    arena mapping's.
    """

    def __init__(self, mode: str, base: int, size: int, flags: Optional[int] = None, reason: str = ""):
        self.mode = mode
        self.base = base
        self.size = size
        self.flags = flags
        self.reason = reason
        #: The ``cudaHostUnregister`` result (0: success) once undone.
        self.unregister_result: Optional[int] = None
        self.asked = True  # whether registration was asked for

    @property
    def registered(self) -> bool:
        return self.mode == "registered" and self.unregister_result is None

    def unregister(self) -> None:
        """Undoes the registration (idempotent). Called on its own when the
        arena is about to be unmapped."""
        _unregister(self.base)

    def __repr__(self) -> str:
        extra = f" flags={self.flags:#x}" if self.flags is not None else ""
        why = f" reason={self.reason!r}" if self.reason else ""
        return f"<granary.cuda.ArenaPin {self.mode} base={self.base:#x} size={self.size}{extra}{why}>"


def _error_text(cudart, code: int) -> str:
    try:
        return f"{cudart.cudaGetErrorString(cudart.cudaError(code))} (cudaError {code})"
    except Exception:  # noqa: BLE001
        return f"cudaError {code}"


_cudart_lib = None


def _clear_last_error() -> None:
    """Resets the runtime's last error after a refused registration, so that
    PyTorch's next launch check does not report it as its own."""
    global _cudart_lib
    if _cudart_lib is None:
        _cudart_lib = False
        try:
            with open("/proc/self/maps") as maps:
                for line in maps:
                    path = line.split()[-1] if len(line.split()) >= 6 else ""
                    if "libcudart" in path:
                        _cudart_lib = ctypes.CDLL(path)
                        break
        except OSError:
            pass
    if _cudart_lib:
        try:
            _cudart_lib.cudaGetLastError()
        except AttributeError:
            pass


def _register(base: int, size: int) -> tuple[Optional[int], str]:
    """Registers ``[base, base+size)``; returns (flags, "") or (None, why)."""
    cudart = torch.cuda.cudart()
    torch.cuda.init()
    torch.cuda.current_stream()  # makes the device's primary context current here
    why = []
    for flags in REGISTER_FLAGS:
        code = int(cudart.cudaHostRegister(base, size, flags))
        if code == 0:
            return flags, ""
        _clear_last_error()
        why.append(f"flags {flags:#x}: {_error_text(cudart, code)}")
    return None, "cudaHostRegister refused the arena mapping: " + "; ".join(why)


def _unregister(base: int) -> None:
    with _lock:
        entry = _ranges.pop(base, None)
        if entry is None:
            return
        pin = entry[1]
        # The copies that read this range must be done before it goes.
        _wait_range(base, entry[0])
        try:
            code = int(torch.cuda.cudart().cudaHostUnregister(base))
            if code != 0:
                _clear_last_error()
        except Exception:  # noqa: BLE001 - interpreter shutdown, CUDA torn down
            code = -1
        pin.unregister_result = code


def _wait_range(base: int, end: int) -> None:
    for ev, src in list(_pending):
        p = src.data_ptr()
        if base <= p < end:
            ev.synchronize()


def pin_arena(session, *, register: bool = True) -> ArenaPin:
    """Makes ``session``'s arena DMA-able; returns how (:class:`ArenaPin`).

    Registers the arena mapping as page-locked host memory unless
    ``register=False`` (then, or when registration is refused, copies go
    through page-locked staging buffers). Idempotent per arena: calling it
    again returns the same pin, or registers the new arena after the
    session's agent came back with another one (:attr:`~granary.Session.resumes`).
    Without CUDA, or inside a DataLoader worker, it returns a pin of mode
    ``"off"`` and changes nothing.
    """
    base, size = session.arena
    reason = _cuda_reason()
    if reason is not None:
        return ArenaPin("off", base, size, reason=reason)
    with _lock:
        old = getattr(session, "_granary_pin", None)
        if old is not None and (old.base, old.size) == (base, size) and old.unregister_result is None:
            # The same arena: keep the registration, or a refusal (no retry
            # on every call), unless registration was not asked for before.
            if old.mode == "registered" or old.asked == register:
                return old
        if old is not None:
            old.unregister()
        mapping = session._mapping
        if mapping is None:
            raise ValueError(f"{session!r} is closed: its arena cannot be pinned")
        if not register:
            pin = ArenaPin("staging", base, size, reason="registration not asked for (register=False)")
        elif size == 0 or base == 0:
            pin = ArenaPin("staging", base, size, reason="the session has no arena mapping")
        else:
            flags, why = _register(base, size)
            if flags is None:
                pin = ArenaPin("staging", base, size, reason=why)
            else:
                pin = ArenaPin("registered", base, size, flags=flags)
                _ranges[base] = (base + size, pin)
                # Registered after the mapping's own finaliser (which
                # unmaps), so it runs first: unregister, then unmap.
                weakref.finalize(mapping, _unregister, base)
        pin.asked = register
        session._granary_pin = pin
        return pin


def pinned_ranges() -> list[tuple[int, int]]:
    """``(base, size)`` of every arena registered now."""
    with _lock:
        return [(b, e - b) for b, (e, _p) in sorted(_ranges.items())]


def _registered(t: torch.Tensor) -> bool:
    if not _ranges:
        return False
    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    with _lock:
        for base, (stop, _pin) in _ranges.items():
            if base <= start and end <= stop:
                return True
    return False


def _drain() -> None:
    while _pending and _pending[0][0].query():
        _pending.popleft()
    while len(_pending) > MAX_PENDING:
        ev, _src = _pending.popleft()
        ev.synchronize()


def wait_pending() -> None:
    """Waits for every non-blocking copy :func:`to_device` started, and lets
    go of the tensors (and Granary batches) they read."""
    with _lock:
        while _pending:
            ev, _src = _pending.popleft()
            ev.synchronize()


def _tensor_to_device(t: torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
    if t.device.type != "cpu" or device.type != "cuda" or not non_blocking or _cuda_reason() is not None:
        return t.to(device, non_blocking=non_blocking)
    if t.numel() == 0:
        return torch.empty(t.shape, dtype=t.dtype, device=device)
    with _lock:
        _drain()
        if t.is_contiguous() and (_registered(t) or t.is_pinned()):
            src = t  # DMA straight from the arena (or a pinned tensor)
        else:
            # Staging: one CPU copy into a page-locked block of the caching
            # host allocator; the copy below records its event on the block,
            # so the block is not handed out again before the DMA is done.
            src = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            src.copy_(t)
        out = src.to(device, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(device))
        # Keeps the source (hence the arena bytes' batch) alive until done.
        _pending.append((ev, src))
        return out


def to_device(obj, device=None, non_blocking: bool = True):
    """``obj`` (a tensor, or a tuple, list or dict of them, e.g. a
    :class:`~granary.torch.GranaryDataset` item) on ``device`` (default: the
    current CUDA device).

    A CPU tensor that views a registered arena, or is otherwise pinned, is
    transferred by DMA from where it is; any other is first copied into a
    page-locked staging block. With ``non_blocking=True`` (the default) the
    call returns before the transfer ends and the source tensor is kept
    alive until it has (see the module notes). Without CUDA it is
    ``Tensor.to``.
    """
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    if isinstance(obj, torch.Tensor):
        return _tensor_to_device(obj, device, non_blocking)
    if isinstance(obj, tuple):
        items = [to_device(o, device, non_blocking) for o in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if isinstance(obj, list):
        return [to_device(o, device, non_blocking) for o in obj]
    if isinstance(obj, dict):
        return {k: to_device(v, device, non_blocking) for k, v in obj.items()}
    return obj


def stack_pinned(xs) -> torch.Tensor:
    """``torch.stack(xs)`` into a page-locked tensor when CUDA is usable
    here (the training process), else a plain ``torch.stack``: a stacked
    batch is a copy anyway, and this way its transfer is DMA too."""
    if _cuda_reason() is not None:
        return torch.stack(xs)
    first = xs[0]
    out = torch.empty((len(xs), *first.shape), dtype=first.dtype, pin_memory=True)
    return torch.stack(xs, out=out)


_END = object()


class _Failed:
    def __init__(self, exc: BaseException):
        self.exc = exc


def _record_stream(obj, stream) -> None:
    if isinstance(obj, torch.Tensor):
        if obj.device.type == "cuda":
            obj.record_stream(stream)
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            _record_stream(o, stream)
    elif isinstance(obj, dict):
        for o in obj.values():
            _record_stream(o, stream)


def prefetch(iterable, device=None, depth: int = 2):
    """Yields the items of ``iterable`` (e.g. a
    :class:`~granary.torch.GranaryDataset`) on ``device``, fetched by one
    thread of this process up to ``depth`` items ahead.

    The thread iterates (the agent's next batch, its CRC check, the
    stacking: C and PyTorch calls that release the GIL) and starts each
    item's transfer with :func:`to_device` on a CUDA stream of its own; the
    consumer's stream waits for that transfer before the item is handed
    over, so the training loop neither waits for the agent nor for the copy
    while the GPU has work. Without CUDA the items are only fetched ahead.
    An error of the iterator is raised in the consumer; leaving the loop
    early stops the thread.
    """
    if depth < 1:
        raise ValueError("depth must be >= 1")
    cuda_on = torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda")
    if cuda_on:
        device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        # One intra-op thread for this thread's PyTorch work (the batch's
        # stacking, a collate's copies), as in a DataLoader worker: copies of
        # a few MB split across OpenMP threads only fight the training loop
        # and the agent for cores (on 2 cores a `torch.cat` of a batch took
        # 15 times the CPU). The setting is this thread's own; the training
        # loop's threads are left as they are.
        torch.set_num_threads(1)
        it = iter(iterable)
        try:
            if cuda_on:
                stream = torch.cuda.Stream(device)
                with torch.cuda.device(device), torch.cuda.stream(stream):
                    for item in it:
                        out = to_device(item, device)
                        ev = torch.cuda.Event()
                        ev.record(stream)
                        if not put((out, ev)):
                            return
            else:
                for item in it:
                    if not put((item, None)):
                        return
            put(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            put(_Failed(e))
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001
                    pass

    thread = threading.Thread(target=run, name="granary-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            got = q.get()
            if got is _END:
                return
            if isinstance(got, _Failed):
                raise got.exc
            out, ev = got
            if ev is not None:
                current = torch.cuda.current_stream(device)
                current.wait_event(ev)
                # Allocated on the thread's stream, used on this one.
                _record_stream(out, current)
            yield out
            del out, got
    finally:
        stop.set()
        thread.join(timeout=10)
