"""Named fields of WebDataset samples: Sample.fields() over shards written
by Python's own tarfile (what webdataset's TarWriter uses)."""

import io
import tarfile

import numpy as np

import granary
from conftest import format_table
from granary.agent import LocalAgent


def write_shards(root, out, per_shard=64):
    """The class folders of `root` as WebDataset shards: KEY.bin and KEY.cls."""
    classes = sorted(p for p in root.iterdir() if p.is_dir())
    samples = [(f, label) for label, c in enumerate(classes) for f in sorted(c.rglob("*")) if f.is_file()]
    out.mkdir()
    for n in range(0, len(samples), per_shard):
        with tarfile.open(out / f"shard-{n // per_shard:04d}.tar", "w") as tar:
            for f, label in samples[n : n + per_shard]:
                key = f.relative_to(root).with_suffix("").as_posix()
                for name, data in ((f"{key}.bin", f.read_bytes()), (f"{key}.cls", str(label).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return len(samples)


def epoch(sock, name, fields):
    out = []
    with granary.open_session(name, sock, batch_size=16, seed=3, epochs=1) as s:
        for batch in s:
            for smp in batch:
                out.append((smp.id, smp.label, fields(smp)))
    return out


def test_fields_are_the_members_without_a_copy(synth_root, tmp_path):
    shards = tmp_path / "wds"
    n = write_shards(synth_root, shards)
    with LocalAgent({"synth": synth_root}, extra_config=format_table("wds", shards, "webdataset")) as a:
        files = epoch(a.socket, "synth", lambda smp: smp.tobytes())

        def check(smp):
            f = smp.fields()
            assert list(f) == ["bin", "cls"]
            for view in f.values():
                assert isinstance(view, memoryview) and view.readonly
            # Slices of the sample's own bytes, in the arena: no copy.
            for view in f.values():
                addr = np.frombuffer(view, np.uint8).__array_interface__["data"][0]
                assert smp.address < addr and addr + len(view) <= smp.address + len(smp)
            assert f["cls"].tobytes() == str(smp.label).encode()
            return f["bin"].tobytes()

        wds = epoch(a.socket, "wds", check)
    assert len(files) == n == len(wds)
    assert files == wds


def test_fields_of_damaged_bytes_raise_corrupt():
    from granary import _lib

    raw = bytearray(tarfile.TarInfo("k.txt").tobuf(format=tarfile.USTAR_FORMAT))
    raw[124:136] = b"%011o\0" % 100  # 100 bytes of data, none there; checksum now wrong
    buf = (granary.core.ctypes.c_ubyte * len(raw)).from_buffer(raw)
    s = _lib.Sample(granary.core.ctypes.addressof(buf), len(raw), 0, -1, 0, 0)
    cursor = granary.core.ctypes.c_uint64(0)
    field = _lib.Field()
    rc = _lib.lib.granary_sample_next_field(
        granary.core.ctypes.byref(s), granary.core.ctypes.byref(cursor), granary.core.ctypes.byref(field)
    )
    assert rc == -13, rc  # GRANARY_E_CORRUPT
    assert "checksum" in _lib.last_error_message()
