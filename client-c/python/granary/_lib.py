"""Loading libgranary and declaring its C API for ctypes.

The declarations mirror ``client-c/include/granary.h`` (ABI version 1).
Where the library is looked for, in order:

1. the file named by the ``GRANARY_LIB`` environment variable;
2. ``libgranary.so`` inside this package (``pip install`` bundles it);
3. ``target/release/libgranary.so`` of the Granary checkout this package was
   installed from or is imported from (``CARGO_TARGET_DIR`` is honoured);
4. the dynamic linker's search path (``LD_LIBRARY_PATH``, system install).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

ABI_VERSION = 1
WAIT_FOREVER = -1
BATCH_END_OF_EPOCH = 1
BATCH_END_OF_STREAM = 2
RESUME_OFF = 0xFFFFFFFF

OK = 0
E_INVALID_ARGUMENT = -1
E_TIMEOUT = -2
E_WOULD_BLOCK = -3
E_DISCONNECTED = -4
E_PROTOCOL = -5
E_VERSION = -6
E_PERMISSION = -7
E_NOT_FOUND = -8
E_FENCED = -9
E_END_OF_STREAM = -10
E_IO = -11
E_NO_MEMORY = -12
E_CORRUPT = -13
E_BUSY = -14
E_INTERNAL = -15
E_CLOSED = -16
E_SHORT_READ = -17
E_DATASET_CHANGED = -18
E_DECODE = -19

CODE_NAMES = {
    OK: "GRANARY_OK",
    E_INVALID_ARGUMENT: "GRANARY_E_INVALID_ARGUMENT",
    E_TIMEOUT: "GRANARY_E_TIMEOUT",
    E_WOULD_BLOCK: "GRANARY_E_WOULD_BLOCK",
    E_DISCONNECTED: "GRANARY_E_DISCONNECTED",
    E_PROTOCOL: "GRANARY_E_PROTOCOL",
    E_VERSION: "GRANARY_E_VERSION",
    E_PERMISSION: "GRANARY_E_PERMISSION",
    E_NOT_FOUND: "GRANARY_E_NOT_FOUND",
    E_FENCED: "GRANARY_E_FENCED",
    E_END_OF_STREAM: "GRANARY_E_END_OF_STREAM",
    E_IO: "GRANARY_E_IO",
    E_NO_MEMORY: "GRANARY_E_NO_MEMORY",
    E_CORRUPT: "GRANARY_E_CORRUPT",
    E_BUSY: "GRANARY_E_BUSY",
    E_INTERNAL: "GRANARY_E_INTERNAL",
    E_CLOSED: "GRANARY_E_CLOSED",
    E_SHORT_READ: "GRANARY_E_SHORT_READ",
    E_DATASET_CHANGED: "GRANARY_E_DATASET_CHANGED",
    E_DECODE: "GRANARY_E_DECODE",
}

# Why a single sample failed (its status), by the short name of the kind.
SAMPLE_FAILURE_KINDS = {
    E_NOT_FOUND: "NotFound",
    E_IO: "Io",
    E_TIMEOUT: "Timeout",
    E_CORRUPT: "Corrupt",
    E_SHORT_READ: "ShortRead",
    E_DECODE: "Decode",
}


class SessionOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("abi_version", ctypes.c_uint32),
        ("dataset", ctypes.c_char_p),
        ("seed", ctypes.c_uint64),
        ("first_epoch", ctypes.c_uint32),
        ("epoch_count", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
        ("rank", ctypes.c_uint32),
        ("world_size", ctypes.c_uint32),
        ("drop_last", ctypes.c_uint32),
        ("ready_capacity", ctypes.c_uint32),
        ("release_capacity", ctypes.c_uint32),
        ("view", ctypes.c_void_p),
        ("view_len", ctypes.c_size_t),
        ("view_required", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("layout", ctypes.c_void_p),
        ("layout_len", ctypes.c_size_t),
        ("locality", ctypes.c_uint32),
        ("reserved2", ctypes.c_uint32),
        ("locality_digest", ctypes.c_uint8 * 32),
        ("no_crc_check", ctypes.c_uint32),
        ("resume_timeout_ms", ctypes.c_uint32),
        ("first_batch", ctypes.c_uint64),
        ("resume_state", ctypes.c_void_p),
        ("resume_state_len", ctypes.c_size_t),
        ("accept_changed_dataset", ctypes.c_uint32),
        ("worker", ctypes.c_uint32),
        ("workers", ctypes.c_uint32),
        ("reserved3", ctypes.c_uint32),
    ]


#: Most bytes of a session state (``GRANARY_STATE_MAX``).
STATE_MAX = 4096


NOTE_MAX = 512


class AssignmentInfo(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("locality", ctypes.c_uint32),
        ("digest", ctypes.c_uint8 * 32),
        ("note", ctypes.c_char * NOTE_MAX),
    ]


class JobPosition(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("epoch", ctypes.c_uint32),
        ("step", ctypes.c_uint64),
        ("ranks_known", ctypes.c_uint32),
        ("nodes", ctypes.c_uint32),
        ("first_batch", ctypes.c_uint64),
        ("rank_known", ctypes.c_uint32),
        ("rank_epoch", ctypes.c_uint32),
        ("rank_step", ctypes.c_uint64),
    ]


NAME_MAX = 256


class PeerIdentity(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("membership", ctypes.c_uint32),
        ("capacity", ctypes.c_uint64),
        ("view_epoch", ctypes.c_uint64),
        ("members", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("view_digest", ctypes.c_uint8 * 32),
        ("node_id", ctypes.c_char * NAME_MAX),
        ("addr", ctypes.c_char * NAME_MAX),
        ("job_id", ctypes.c_char * NAME_MAX),
    ]


class ViewMember(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_char_p),
        ("addr", ctypes.c_char_p),
        ("capacity", ctypes.c_uint64),
    ]


class SessionInfo(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("ready_capacity", ctypes.c_uint32),
        ("release_capacity", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("session_id", ctypes.c_uint64),
        ("samples_per_epoch", ctypes.c_uint64),
        ("batches_per_epoch", ctypes.c_uint64),
        ("arena_size", ctypes.c_uint64),
        ("rank_batches_per_epoch", ctypes.c_uint64),
        ("prepared_height", ctypes.c_uint32),
        ("prepared_width", ctypes.c_uint32),
        ("prepared_channels", ctypes.c_uint32),
        ("reserved2", ctypes.c_uint32),
    ]


class Sample(ctypes.Structure):
    _fields_ = [
        # A plain address (not c_char_p, which would copy the bytes).
        ("data", ctypes.c_void_p),
        ("length", ctypes.c_uint64),
        ("id", ctypes.c_uint64),
        ("label", ctypes.c_int32),
        ("status", ctypes.c_int32),
        ("crc32c", ctypes.c_uint32),
    ]


class Field(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_void_p),
        ("name_length", ctypes.c_uint64),
        ("data", ctypes.c_void_p),
        ("length", ctypes.c_uint64),
    ]


# The structs, as pinned in client-c/src/ffi/types.rs.
assert ctypes.sizeof(SessionOptions) == 184, ctypes.sizeof(SessionOptions)
assert ctypes.sizeof(AssignmentInfo) == 40 + NOTE_MAX, ctypes.sizeof(AssignmentInfo)
assert ctypes.sizeof(PeerIdentity) == 64 + 3 * NAME_MAX, ctypes.sizeof(PeerIdentity)
assert ctypes.sizeof(ViewMember) == 24, ctypes.sizeof(ViewMember)
assert ctypes.sizeof(SessionInfo) == 72, ctypes.sizeof(SessionInfo)
assert ctypes.sizeof(Sample) == 40, ctypes.sizeof(Sample)
assert ctypes.sizeof(Field) == 32, ctypes.sizeof(Field)

_vp = ctypes.c_void_p
_int = ctypes.c_int


def _candidates() -> list[str]:
    out: list[str] = []
    env = os.environ.get("GRANARY_LIB")
    if env:
        # Named explicitly: use it or fail, never fall back silently.
        return [env]
    here = Path(__file__).resolve().parent
    out.append(str(here / "libgranary.so"))
    out += [str(d / "libgranary.so") for d in release_dirs()]
    out.append("libgranary.so")
    return out


def release_dirs() -> list[Path]:
    """The ``release`` folders of Cargo target directories where the checkout's
    libgranary and granaryd may be: the one recorded at install time, then
    ``$CARGO_TARGET_DIR``, then ``target/`` of the checkout."""
    here = Path(__file__).resolve().parent
    roots: list[Path] = []
    dirs: list[Path] = []
    try:
        from . import _build  # written by setup.py at install time

        if getattr(_build, "TARGET_DIR", ""):
            dirs.append(Path(_build.TARGET_DIR) / "release")
        if getattr(_build, "REPO_ROOT", ""):
            roots.append(Path(_build.REPO_ROOT))
    except ImportError:
        pass
    # Imported from a checkout (client-c/python/granary): the repo is 3 up.
    roots.append(here.parents[2])
    target = os.environ.get("CARGO_TARGET_DIR")
    for root in roots:
        if target:
            t = Path(target)
            dirs.append((t if t.is_absolute() else root / t) / "release")
        dirs.append(root / "target" / "release")
    unique: list[Path] = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    return unique


def _load() -> tuple[ctypes.CDLL, str]:
    tried = []
    for c in _candidates():
        if os.sep in c and not os.path.exists(c):
            tried.append(f"{c} (absent)")
            continue
        try:
            return ctypes.CDLL(c), c
        except OSError as e:
            tried.append(f"{c} ({e})")
    raise ImportError(
        "granary: cannot load libgranary.so. Build it with "
        "`cargo build --release -p granary-client` and reinstall the package, "
        "or point GRANARY_LIB at it. Tried: " + "; ".join(tried)
    )


lib, path = _load()


def _declare(name: str, restype, *argtypes) -> None:
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)


_declare("granary_abi_version", ctypes.c_uint32)
_declare("granary_strerror", ctypes.c_char_p, _int)
_declare("granary_last_error_message", ctypes.c_char_p)
_declare("granary_connect", _int, ctypes.c_char_p, ctypes.POINTER(_vp))
_declare("granary_client_free", None, _vp)
_declare("granary_session_options_init", _int, ctypes.POINTER(SessionOptions))
_declare("granary_session_open", _int, _vp, ctypes.POINTER(SessionOptions), ctypes.POINTER(_vp))
_declare("granary_session_get_info", _int, _vp, ctypes.POINTER(SessionInfo))
_declare("granary_session_arena", _int, _vp, ctypes.POINTER(_vp), ctypes.POINTER(ctypes.c_uint64))
_declare("granary_next_batch", _int, _vp, _int, ctypes.POINTER(_vp))
_declare("granary_batch_len", ctypes.c_size_t, _vp)
_declare("granary_batch_epoch", ctypes.c_uint32, _vp)
_declare("granary_batch_index", ctypes.c_uint64, _vp)
_declare("granary_batch_flags", ctypes.c_uint32, _vp)
_declare("granary_batch_status", _int, _vp)
_declare("granary_batch_sample", _int, _vp, ctypes.c_size_t, ctypes.POINTER(Sample))
_declare("granary_batch_release", _int, _vp, _vp)
_declare(
    "granary_sample_next_field",
    _int,
    ctypes.POINTER(Sample),
    ctypes.POINTER(ctypes.c_uint64),
    ctypes.POINTER(Field),
)
_declare("granary_session_close", _int, _vp)
_declare("granary_get_peer_identity", _int, _vp, ctypes.POINTER(PeerIdentity), _int)
_declare(
    "granary_view_encode",
    _int,
    ctypes.c_char_p,
    ctypes.c_uint64,
    ctypes.POINTER(ViewMember),
    ctypes.c_size_t,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.POINTER(ctypes.c_size_t),
)
_declare("granary_join_view", _int, _vp, ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64), _int)
_declare("granary_session_view", _int, _vp, ctypes.POINTER(ctypes.c_uint64))
_declare("granary_session_resumes", _int, _vp, ctypes.POINTER(ctypes.c_uint32))
_declare(
    "granary_session_state",
    _int,
    _vp,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.POINTER(ctypes.c_size_t),
)
_declare(
    "granary_layout_encode",
    _int,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.POINTER(ctypes.c_char_p),
    ctypes.c_size_t,
    ctypes.c_uint32,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.POINTER(ctypes.c_size_t),
)
_declare("granary_assignment_query", _int, _vp, ctypes.POINTER(SessionOptions), ctypes.POINTER(AssignmentInfo))
_declare("granary_job_position", _int, _vp, ctypes.POINTER(SessionOptions), ctypes.POINTER(JobPosition))

if lib.granary_abi_version() < ABI_VERSION:
    raise ImportError(
        f"granary: {path} speaks ABI version {lib.granary_abi_version()}, "
        f"this package needs {ABI_VERSION}"
    )


def strerror(code: int) -> str:
    return lib.granary_strerror(code).decode("utf-8", "replace")


def last_error_message() -> str:
    return lib.granary_last_error_message().decode("utf-8", "replace")
