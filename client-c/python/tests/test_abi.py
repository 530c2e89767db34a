"""The ctypes mirror of libgranary's public structs (``granary/_lib.py``)
against the committed header ``client-c/include/granary.h`` (generated
from the Rust FFI types by cbindgen and checked by
``client-c/tests/header.rs``): every struct the package mirrors has the
header's fields, in the header's order, with the header's sizes. A field
added on one side only fails here, naming it."""

import ctypes
import re

import pytest

from granary import _lib
from conftest import REPO

HEADER = REPO / "client-c" / "include" / "granary.h"

C_SIZES = {
    "uint8_t": 1, "int8_t": 1, "char": 1, "uint16_t": 2, "int16_t": 2, "uint32_t": 4, "int32_t": 4,
    "uint64_t": 8, "int64_t": 8, "size_t": ctypes.sizeof(ctypes.c_size_t),
}


def header_fields(struct: str) -> list:
    """(name, size in bytes) of each field of `typedef struct NAME {...} NAME;`."""
    text = HEADER.read_text()
    m = re.search(r"typedef struct " + struct + r" \{(.*?)\} " + struct + ";", text, re.S)
    assert m, f"{struct} not in {HEADER}"
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
    fields = []
    for line in body.splitlines():
        line = line.strip()
        if not line:
            continue
        f = re.fullmatch(r"(?:const\s+)?([A-Za-z_0-9]+)\s*(\*?)\s*([A-Za-z_0-9]+)(?:\[([A-Z_0-9]+|\d+)\])?;", line)
        assert f, f"cannot read the field {line!r} of {struct}"
        ctype, ptr, name, count = f.groups()
        size = ctypes.sizeof(ctypes.c_void_p) if ptr else C_SIZES[ctype]
        if count:
            size *= int(count) if count.isdigit() else {"GRANARY_NOTE_MAX": _lib.NOTE_MAX,
                                                         "GRANARY_NAME_MAX": _lib.NAME_MAX}[count]
        fields.append((name, size))
    return fields


@pytest.mark.parametrize(
    "struct,mirror",
    [
        ("granary_session_options", _lib.SessionOptions),
        ("granary_session_info", _lib.SessionInfo),
        ("granary_sample", _lib.Sample),
        ("granary_field", _lib.Field),
        ("granary_assignment_info", _lib.AssignmentInfo),
        ("granary_peer_identity", _lib.PeerIdentity),
        ("granary_view_member", _lib.ViewMember),
    ],
)
def test_the_python_mirror_matches_the_header(struct, mirror):
    want = header_fields(struct)
    got = [(name, ctypes.sizeof(ctype)) for name, ctype in mirror._fields_]
    assert got == want, f"{mirror.__name__} differs from {struct} in granary.h"


def test_state_max_and_error_codes_match_the_header():
    text = HEADER.read_text()
    assert re.search(rf"#define GRANARY_STATE_MAX {_lib.STATE_MAX}\b", text)
    for code, name in _lib.CODE_NAMES.items():
        assert re.search(rf"\b{name} = {code},", text), name
