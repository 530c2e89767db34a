"""Error codes and the failure kinds of single samples (no agent needed)."""

from types import SimpleNamespace

import pytest

import granary
from granary import _lib
from granary.core import Sample
from granary.errors import error_for, failure_kind

KINDS = [
    (_lib.E_NOT_FOUND, "NotFound", granary.NotFound, "GRANARY_E_NOT_FOUND"),
    (_lib.E_IO, "Io", granary.SourceError, "GRANARY_E_IO"),
    (_lib.E_TIMEOUT, "Timeout", granary.Timeout, "GRANARY_E_TIMEOUT"),
    (_lib.E_CORRUPT, "Corrupt", granary.Corrupt, "GRANARY_E_CORRUPT"),
    (_lib.E_SHORT_READ, "ShortRead", granary.ShortRead, "GRANARY_E_SHORT_READ"),
    (_lib.E_DECODE, "Decode", granary.DecodeError, "GRANARY_E_DECODE"),
]


def test_codes_match_the_library():
    assert _lib.E_SHORT_READ == -17
    for code, name in _lib.CODE_NAMES.items():
        assert _lib.strerror(code) != "unknown error", name
    assert _lib.E_DATASET_CHANGED == -18
    assert "changed since the session state was saved" in _lib.strerror(-18)
    assert error_for(-18, "x").__class__ is granary.DatasetChanged
    assert _lib.E_DECODE == -19
    assert "decode" in _lib.strerror(-19)
    assert error_for(-19, "x").__class__ is granary.DecodeError
    assert _lib.strerror(-20) == "unknown error"
    assert "catalogued" in _lib.strerror(_lib.E_SHORT_READ)
    assert "transient" in _lib.strerror(_lib.E_IO)


@pytest.mark.parametrize("code,kind,cls,cname", KINDS)
def test_a_failed_sample_names_its_kind(code, kind, cls, cname):
    raw = _lib.Sample(data=None, length=0, id=77, label=3, status=code, crc32c=0)
    batch = SimpleNamespace(_live=True, _index=0, _epoch=0)
    smp = Sample(batch, raw)
    assert smp.status == code
    assert smp.kind == kind == failure_kind(code)
    err = smp.error
    assert type(err) is cls and err.code == code and err.name == cname
    assert kind in str(err) and "sample 77" in str(err)
    assert err.description == _lib.strerror(code)
    with pytest.raises(cls):
        smp.buffer()
    assert type(error_for(code)) is cls


def test_a_good_sample_has_no_kind():
    raw = _lib.Sample(data=None, length=0, id=1, label=0, status=0, crc32c=0)
    smp = Sample(SimpleNamespace(_live=True, _index=0, _epoch=0), raw)
    assert smp.kind is None and smp.error is None
    assert failure_kind(_lib.E_FENCED) == "GRANARY_E_FENCED"
