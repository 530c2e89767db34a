"""Exceptions: one class per ``GRANARY_E_*`` code, all under :class:`GranaryError`.

Each carries the code (``.code``, a negative int), its C name (``.name``), the
library's description of the code (``granary_strerror``) and the detail of
the failure (``granary_last_error_message``, e.g. the agent's own words when
it refused a session).
"""

from __future__ import annotations

from . import _lib


class GranaryError(Exception):
    """A libgranary call failed; ``code`` is the ``GRANARY_E_*`` value."""

    code: int = _lib.E_INTERNAL

    def __init__(self, code: int | str | None = None, detail: str = "", context: str = ""):
        if isinstance(code, str):
            # Rebuilt from its text alone (e.g. re-raised by a DataLoader
            # from a worker process): keep the text as it is.
            self.name = _lib.CODE_NAMES.get(self.code, str(self.code))
            self.description = _lib.strerror(self.code)
            self.detail = code
            self.context = ""
            super().__init__(code)
            return
        if code is not None:
            self.code = code
        self.name = _lib.CODE_NAMES.get(self.code, str(self.code))
        self.description = _lib.strerror(self.code)
        self.detail = detail
        self.context = context
        text = f"{context}: " if context and context not in detail else ""
        if not detail:
            text += self.description
        elif self.description in detail:
            text += detail
        else:
            text += f"{self.description}: {detail}"
        text += f" [{self.name}]"
        super().__init__(text)


class InvalidArgument(GranaryError, ValueError):
    code = _lib.E_INVALID_ARGUMENT


class Timeout(GranaryError, TimeoutError):
    """No batch arrived within the timeout (the session goes on); for a
    sample: reading it timed out on every attempt."""

    code = _lib.E_TIMEOUT


class WouldBlock(GranaryError):
    code = _lib.E_WOULD_BLOCK


class Disconnected(GranaryError, ConnectionError):
    """The agent is gone (not listening, exited, crashed), closed the session,
    or stopped beating its heartbeat ("agent unresponsive")."""

    code = _lib.E_DISCONNECTED


class ProtocolError(GranaryError):
    code = _lib.E_PROTOCOL


class VersionMismatch(GranaryError):
    code = _lib.E_VERSION


class PermissionDenied(GranaryError, PermissionError):
    code = _lib.E_PERMISSION


class NotFound(GranaryError, LookupError):
    """No such dataset; for a sample: it is gone from the source."""

    code = _lib.E_NOT_FOUND


class Fenced(GranaryError):
    code = _lib.E_FENCED


class EndOfStream(GranaryError):
    """Every batch of the requested epochs was delivered."""

    code = _lib.E_END_OF_STREAM


class SourceError(GranaryError):
    """The data source failed to read a sample (per batch or per sample): a
    transient failure persisted through every retry."""

    code = _lib.E_IO


class NoMemory(GranaryError):
    code = _lib.E_NO_MEMORY


class Corrupt(GranaryError):
    """A descriptor failed validation; for a sample: its bytes failed a check."""

    code = _lib.E_CORRUPT


class Busy(GranaryError):
    code = _lib.E_BUSY


class InternalError(GranaryError):
    code = _lib.E_INTERNAL


class ReleasedError(GranaryError, ValueError):
    """A sample, batch or session was used after its release or close."""

    code = _lib.E_CLOSED


class ShortRead(GranaryError):
    """A sample is shorter or longer than catalogued: it changed in the
    source since the catalog was made."""

    code = _lib.E_SHORT_READ


class DatasetChanged(GranaryError):
    """The dataset's catalog is not the one a saved session state was
    taken against: an object was replaced, added or removed since. The
    message names the dataset and the objects."""

    code = _lib.E_DATASET_CHANGED


class DecodeError(GranaryError):
    """The agent's prepare stage could not decode the sample (not a JPEG,
    corrupt data, or more pixels or bytes than the agent allows)."""

    code = _lib.E_DECODE


_BY_CODE = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        Timeout,
        WouldBlock,
        Disconnected,
        ProtocolError,
        VersionMismatch,
        PermissionDenied,
        NotFound,
        Fenced,
        EndOfStream,
        SourceError,
        NoMemory,
        Corrupt,
        Busy,
        InternalError,
        ReleasedError,
        ShortRead,
        DatasetChanged,
        DecodeError,
    )
}


def failure_kind(status: int) -> str | None:
    """The short name of why a sample failed, from its status: ``"NotFound"``,
    ``"Io"``, ``"Timeout"``, ``"Corrupt"``, ``"ShortRead"`` or ``"Decode"``; None for 0; the
    ``GRANARY_E_*`` name for any other code."""
    if status == 0:
        return None
    return _lib.SAMPLE_FAILURE_KINDS.get(status) or _lib.CODE_NAMES.get(status, str(status))


def error_for(code: int, detail: str = "", context: str = "") -> GranaryError:
    """The exception for ``code`` (a subclass of :class:`GranaryError`)."""
    cls = _BY_CODE.get(code, GranaryError)
    return cls(code, detail, context)


def check(code: int, context: str) -> None:
    """Raises the exception for a failed call, with the thread's C error text."""
    if code != _lib.OK:
        raise error_for(code, _lib.last_error_message(), context)
