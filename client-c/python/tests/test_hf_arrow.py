"""Hugging Face `datasets` saved with `save_to_disk`, read per sample by
the agent (`format = "arrow"`): every row's image bytes (the `Image`
feature's `bytes`) and `ClassLabel`, in the order of the rows; an Arrow
file whose images are stored by path only (as `datasets`' own cache of an
`imagefolder` holds them; `save_to_disk` embeds the bytes) is refused
naming the file."""

import io
import os

import pytest

from conftest import format_table, read_epoch
from granary.agent import LocalAgent

if os.environ.get("CI") in ("1", "true"):
    import datasets  # noqa: F401  (CI installs it: client-c/python/ci.sh)
datasets = pytest.importorskip("datasets", reason="SKIPPED: datasets is not installed (client-c/python/ci.sh installs it)")
Image = pytest.importorskip("PIL.Image")
np = pytest.importorskip("numpy")

ROWS = 90


def hf_table(root):
    """The dataset table of `save_to_disk` output at `root`: its images are the samples."""
    return format_table("hf", root, "arrow", 'sample_field = "image"\n')


def jpeg(i):
    img = np.zeros((16 + i % 7, 20, 3), np.uint8)
    img[..., 0] = i
    img[::2, :, 1] = 255 - i
    out = io.BytesIO()
    Image.fromarray(img).save(out, format="JPEG", quality=80 + i % 15)
    return out.getvalue()


def saved(root, images):
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(names=[f"c{k}" for k in range(5)]),
            "caption": datasets.Value("string"),
        }
    )
    ds = datasets.Dataset.from_dict(
        {"image": images, "label": [i % 5 for i in range(ROWS)], "caption": [f"row {i}" * (i % 3) for i in range(ROWS)]},
        features=features,
    )
    ds.save_to_disk(str(root), max_shard_size="40KB")
    return ds


def test_save_to_disk_rows_are_read_value_by_value(tmp_path):
    root = tmp_path / "hf"
    ds = saved(root, [{"bytes": jpeg(i), "path": None} for i in range(ROWS)])
    files = sorted(p.name for p in root.iterdir() if p.suffix == ".arrow")
    assert len(files) >= 2, files
    with LocalAgent({"files": root}, extra_config=hf_table(root)) as a:
        seen = read_epoch(a.socket, "hf")
    assert sorted(seen) == list(range(ROWS))
    rows = ds.cast_column("image", datasets.Image(decode=False))
    for i in range(ROWS):
        assert seen[i] == (rows[i]["image"]["bytes"], rows[i]["label"]), f"row {i}"
        assert seen[i][0] == jpeg(i)


def test_images_stored_by_path_are_refused_naming_the_file(tmp_path):
    pics = tmp_path / "pics"
    pics.mkdir()
    paths = []
    for i in range(ROWS):
        p = pics / f"{i}.jpg"
        p.write_bytes(jpeg(i))
        paths.append({"bytes": None, "path": str(p)})
    root = tmp_path / "hf"
    root.mkdir()
    from datasets.arrow_writer import ArrowWriter

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    with ArrowWriter(features=features, path=str(root / "data-00000-of-00001.arrow")) as w:
        w.write_batch({"image": [features["image"].encode_example(p) for p in paths], "label": [0] * ROWS})
        w.finalize()
    with pytest.raises(Exception) as e:
        with LocalAgent({"files": pics}, extra_config=hf_table(root)):
            pass
    assert "data-00000-of-" in str(e.value) and "stored by path" in str(e.value), str(e.value)
