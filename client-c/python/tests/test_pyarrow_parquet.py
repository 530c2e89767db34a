"""Parquet files written by pyarrow, read per sample by the agent
(`format = "parquet"`): with the settings docs/formats.md names (no
compression, no dictionary, one value per data page), pages v1 and v2,
every sample's bytes and label are the file's row; a file written with
pyarrow's defaults (Snappy, dictionary, many rows per page) is refused
with a message naming the file."""

import os

import pytest

from conftest import format_table, read_epoch
from granary.agent import LocalAgent

if os.environ.get("CI") in ("1", "true"):
    import pyarrow  # noqa: F401  (CI installs it: client-c/python/ci.sh)
pa = pytest.importorskip("pyarrow", reason="SKIPPED: pyarrow is not installed (client-c/python/ci.sh installs it)")
pq = pytest.importorskip("pyarrow.parquet")

ROWS = 120


def rows(seed):
    """(sample bytes, label) of ROWS rows, 100 B to 11 KB each."""
    out = []
    x = seed
    for i in range(ROWS):
        x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
        n = 100 + x % 11_000
        out.append((bytes((x >> (8 * (k % 8))) & 0xFF ^ k & 0xFF for k in range(n)), int(x % 1000) - 500))
    return out


def write(path, data, **kw):
    table = pa.table(
        {
            "sample": pa.array([d for d, _ in data], type=pa.binary()),
            "label": pa.array([lbl for _, lbl in data], type=pa.int64()),
        }
    )
    pq.write_table(table, path, **kw)


PER_SAMPLE = dict(compression="none", use_dictionary=False, data_page_size=1, write_batch_size=1, write_statistics=False)


@pytest.mark.parametrize("page_version", ["1.0", "2.0"])
def test_pyarrow_files_are_read_value_by_value(tmp_path, page_version):
    root = tmp_path / "pq"
    root.mkdir()
    data = rows(7) + rows(11)
    write(root / "part-000.parquet", data[:ROWS], data_page_version=page_version, **PER_SAMPLE)
    write(root / "part-001.parquet", data[ROWS:], data_page_version=page_version, **PER_SAMPLE)
    with LocalAgent({"files": root}, extra_config=format_table("pq", root, "parquet")) as a:
        seen = read_epoch(a.socket, "pq")
    assert len(seen) == 2 * ROWS
    for i, (b, lbl) in enumerate(data):
        assert seen[i] == (b, lbl), f"row {i}: the file's bytes and label"


def test_pyarrow_defaults_are_refused_naming_the_file(tmp_path):
    root = tmp_path / "pq"
    root.mkdir()
    write(root / "defaults.parquet", rows(5))
    with pytest.raises(Exception) as e:
        with LocalAgent({"files": root}, extra_config=format_table("pq", root, "parquet")):
            pass
    assert "defaults.parquet" in str(e.value), str(e.value)
