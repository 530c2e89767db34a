"""The dataset generators: real JPEGs, and the synthetic format."""

import pytest

from granary import synth
from granary.make_dataset import main, make_jpeg, make_synth


def test_jpeg_dataset_is_real_jpegs_in_imagefolder_layout(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    r = make_jpeg(tmp_path, files=30, classes=3, size=24, seed=2)
    assert not r["skipped"] and r["total_bytes"] > 0
    files = sorted(tmp_path.rglob("*.jpg"))
    assert len(files) == 30
    for i, f in enumerate(files):
        assert f.parent.name == f"class_{i * 3 // 30:03d}"
        assert f.read_bytes()[:2] == b"\xff\xd8"  # SOI marker
        with Image.open(f) as im:
            assert im.format == "JPEG" and im.size == (24, 24) and im.mode == "RGB"
    # Idempotent; a different spec regenerates.
    assert make_jpeg(tmp_path, files=30, classes=3, size=24, seed=2)["skipped"]
    assert not make_jpeg(tmp_path, files=30, classes=3, size=24, seed=3)["skipped"]
    tv = pytest.importorskip("torchvision")
    folder = tv.datasets.ImageFolder(str(tmp_path))
    assert [label for _, label in folder.samples] == [i * 3 // 30 for i in range(30)]


def test_synthetic_files_verify_and_corruption_is_caught(tmp_path):
    make_synth(tmp_path, files=20, classes=4, mean_size=2048, seed=9)
    spec = synth.Spec(tmp_path, 20, 4, 2048, 0.5, 9)
    for i in range(20):
        data = (tmp_path / spec.relative_path(i)).read_bytes()
        assert synth.verify(data) == (i, i * 4 // 20, len(data))
    data = bytearray((tmp_path / spec.relative_path(7)).read_bytes())
    data[len(data) // 2] ^= 1
    with pytest.raises(synth.VerifyError, match="content mismatch"):
        synth.verify(bytes(data))
    data = bytearray((tmp_path / spec.relative_path(7)).read_bytes())
    data[9] ^= 1
    with pytest.raises(synth.VerifyError, match="header checksum"):
        synth.verify(bytes(data))
    with pytest.raises(synth.VerifyError, match="length"):
        synth.verify(bytes((tmp_path / spec.relative_path(3)).read_bytes()[:-1]))


def test_python_generator_writes_what_the_rust_generator_writes():
    # SHA-256 of files 0, 10, ..., 290 as tools/src/synth.rs writes them for
    # 300 files with the defaults (100 classes, ~110 KB, sigma 0.5, seed 0).
    import hashlib

    spec = synth.Spec("/nonexistent", num_files=300)
    h = hashlib.sha256()
    for i in range(0, 300, 10):
        h.update(spec.render(i))
    assert h.hexdigest() == "ce9edfc95ba70baf7977d160bf219873e64c27fa7e1ebe6d5370faed535be372"
    assert spec.relative_path(299) == "class_099/img_00000299.bin"

    spec = synth.Spec("/nonexistent")
    assert spec.relative_path(0) == "class_000/img_00000000.bin"
    assert spec.relative_path(19_999) == "class_099/img_00019999.bin"
    sizes = [spec.size_of(i) for i in range(2000)]
    assert all(synth.MIN_FILE_SIZE <= s <= synth.MAX_FILE_SIZE for s in sizes)
    assert 100_000 < sum(sizes) / len(sizes) < 120_000


def test_command_line(tmp_path, capsys):
    assert main(["--synth", str(tmp_path / "s"), "--files", "8", "--classes", "2", "--mean-size", "1024"]) == 0
    assert "8 files in 2 classes" in capsys.readouterr().out
    assert len(list((tmp_path / "s").rglob("*.bin"))) == 8
