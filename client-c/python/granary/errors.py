"""Exceptions: one class per ``GRANARY_E_*`` code, all under :class:`GranaryError`.

Each carries the code (``.code``, a negative int), its C name (``.name``), the
library's description of the code (``granary_strerror``) and the detail of
the failure (``granary_last_error_message``, e.g. the agent's own words when
it refused a session).
"""

from __future__ import annotations

from . import _lib

#: The class of each ``GRANARY_E_*`` code, filled as they are defined.
_BY_CODE: dict = {}


class GranaryError(Exception):
    """A libgranary call failed; ``code`` is the ``GRANARY_E_*`` value."""

    code: int = _lib.E_INTERNAL

    def __init_subclass__(cls, code: int | None = None, **kwargs):
        """``class X(GranaryError, code=...)``: the class of that code, the
        one :func:`error_for` raises for it."""
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code
            _BY_CODE[code] = cls

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


class InvalidArgument(GranaryError, ValueError, code=_lib.E_INVALID_ARGUMENT):
    """An argument or option the library or the agent refused."""


class Timeout(GranaryError, TimeoutError, code=_lib.E_TIMEOUT):
    """No batch arrived within the timeout (the session goes on); for a
    sample: reading it timed out on every attempt."""


class WouldBlock(GranaryError, code=_lib.E_WOULD_BLOCK):
    """No batch is ready (a call that does not wait)."""


class Disconnected(GranaryError, ConnectionError, code=_lib.E_DISCONNECTED):
    """The agent is gone (not listening, exited, crashed), closed the session,
    or stopped beating its heartbeat ("agent unresponsive")."""


class ProtocolError(GranaryError, code=_lib.E_PROTOCOL):
    """A malformed message."""


class VersionMismatch(GranaryError, code=_lib.E_VERSION):
    """The protocol, ABI or layout version differs from the agent's."""


class PermissionDenied(GranaryError, PermissionError, code=_lib.E_PERMISSION):
    """The agent's allowlist refused this user."""


class NotFound(GranaryError, LookupError, code=_lib.E_NOT_FOUND):
    """No such dataset; for a sample: it is gone from the source."""


class Fenced(GranaryError, code=_lib.E_FENCED):
    """The agent fenced the session after a protocol violation."""


class EndOfStream(GranaryError, code=_lib.E_END_OF_STREAM):
    """Every batch of the requested epochs was delivered."""


class SourceError(GranaryError, code=_lib.E_IO):
    """The data source failed to read a sample (per batch or per sample): a
    transient failure persisted through every retry."""


class NoMemory(GranaryError, code=_lib.E_NO_MEMORY):
    """Out of memory."""


class Corrupt(GranaryError, code=_lib.E_CORRUPT):
    """A descriptor failed validation; for a sample: its bytes failed a check."""


class Busy(GranaryError, code=_lib.E_BUSY):
    """The agent is busy (its session limit is reached)."""


class InternalError(GranaryError, code=_lib.E_INTERNAL):
    """An internal error."""


class ReleasedError(GranaryError, ValueError, code=_lib.E_CLOSED):
    """A sample, batch or session was used after its release or close."""


class ShortRead(GranaryError, code=_lib.E_SHORT_READ):
    """A sample is shorter or longer than catalogued: it changed in the
    source since the catalog was made."""


class DatasetChanged(GranaryError, code=_lib.E_DATASET_CHANGED):
    """The dataset's catalog is not the one a saved session state was
    taken against: an object was replaced, added or removed since. The
    message names the dataset and the objects."""


class DecodeError(GranaryError, code=_lib.E_DECODE):
    """The agent's prepare stage could not decode the sample (not a JPEG,
    corrupt data, or more pixels or bytes than the agent allows)."""


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
