"""Granary's Python client: zero-copy batches from the node's granaryd.

::

    import granary
    with granary.connect("/run/granary/granary.sock") as client:
        with client.open_session("imagenet", batch_size=256, seed=42) as session:
            for batch in session:               # released when the loop moves on
                for sample in batch:
                    view = sample.data          # memoryview into the arena, no copy
                    label = sample.label

PyTorch: :mod:`granary.torch`. Datasets for trying it out:
``python -m granary.make_dataset``. A private agent: :mod:`granary.agent`.
"""

from ._lib import ABI_VERSION, path as library_path
from .core import (
    DEFAULT_SOCKET,
    AssignmentInfo,
    Batch,
    Client,
    JobPosition,
    PeerIdentity,
    Sample,
    Session,
    SessionInfo,
    connect,
    agree,
    default_socket,
    encode_layout,
    encode_view,
    open_session,
)
from .errors import (
    Busy,
    Corrupt,
    Disconnected,
    EndOfStream,
    Fenced,
    GranaryError,
    InternalError,
    InvalidArgument,
    NoMemory,
    NotFound,
    PermissionDenied,
    ProtocolError,
    ReleasedError,
    ShortRead,
    SourceError,
    Timeout,
    VersionMismatch,
    WouldBlock,
    DatasetChanged,
    DecodeError,
)

__version__ = "0.1.0"

__all__ = [
    "ABI_VERSION",
    "AssignmentInfo",
    "DEFAULT_SOCKET",
    "Batch",
    "Busy",
    "Client",
    "JobPosition",
    "Corrupt",
    "DatasetChanged",
    "DecodeError",
    "Disconnected",
    "EndOfStream",
    "Fenced",
    "GranaryError",
    "InternalError",
    "InvalidArgument",
    "NoMemory",
    "NotFound",
    "PeerIdentity",
    "PermissionDenied",
    "ProtocolError",
    "ReleasedError",
    "Sample",
    "Session",
    "SessionInfo",
    "ShortRead",
    "SourceError",
    "Timeout",
    "VersionMismatch",
    "WouldBlock",
    "agree",
    "connect",
    "default_socket",
    "encode_layout",
    "encode_view",
    "library_path",
    "open_session",
]
