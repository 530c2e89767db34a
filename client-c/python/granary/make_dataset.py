"""Writes datasets to try Granary with.

``python -m granary.make_dataset --jpeg DIR --files N`` writes real JPEG
images (Pillow) in ImageNet-style class folders, so decode paths run on real
data: ``DIR/class_CCC/img_IIIIIIII.jpg``. Image ``i`` belongs to class
``i * classes // files``; each class has its own colour and stripe
orientation, with per-image noise, phase and offset, so a small CNN can
learn the classes. The agent's catalog and torchvision's ``ImageFolder``
give the same labels (class folders in sorted order) and, with these
names, the same sample order.

``python -m granary.make_dataset --synth DIR --files N`` writes the
self-verifying synthetic format of the quickstart (``tools/src/synth.rs``,
bit for bit the same files; see :mod:`granary.synth`).

Both are idempotent: a marker file in ``DIR`` records the parameters, and a
second run with the same ones does nothing.
"""

from __future__ import annotations

import argparse
import colorsys
import io
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Callable, Union

from . import synth

JPEG_MARKER = ".granary-jpeg.json"
SYNTH_MARKER = ".granary-synth-py.json"


def _width(n: int, least: int) -> int:
    return max(len(str(max(n - 1, 0))), least)


def jpeg_relative_path(i: int, files: int, classes: int) -> str:
    c = i * classes // files
    return f"class_{c:0{_width(classes, 3)}d}/img_{i:0{_width(files, 8)}d}.jpg"


def render_jpeg(i: int, files: int, classes: int, size: int = 64, seed: int = 0, quality: int = 90) -> bytes:
    """The JPEG bytes of image ``i`` (deterministic in all arguments)."""
    import numpy as np
    from PIL import Image

    c = i * classes // files
    rng = np.random.default_rng([seed, i])
    hue = c / classes
    base = np.array(colorsys.hsv_to_rgb(hue, 0.65, 0.85))
    other = np.array(colorsys.hsv_to_rgb((hue + 0.5) % 1.0, 0.8, 0.6))
    angle = c * 2.399963229728653  # the golden angle: distinct orientations
    freq = 2 * math.pi * (2.0 + (c % 5)) / size
    y, x = np.mgrid[0:size, 0:size].astype(np.float32)
    phase = rng.uniform(0, 2 * math.pi)
    stripes = 0.5 + 0.5 * np.sin(freq * (x * math.cos(angle) + y * math.sin(angle)) + phase)
    img = (1 - stripes)[..., None] * base + stripes[..., None] * other
    # A blob at a random place, and noise.
    cy, cx = rng.uniform(0.2, 0.8, 2) * size
    r = size * rng.uniform(0.1, 0.25)
    blob = ((x - cx) ** 2 + (y - cy) ** 2) < r * r
    img[blob] = 1.0 - img[blob]
    img += rng.normal(0.0, 0.06, img.shape)
    pixels = (np.clip(img, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="JPEG", quality=quality)
    return out.getvalue()


def _marker_ok(root: Path, name: str, spec: dict) -> bool:
    try:
        return json.loads((root / name).read_text()) == spec
    except (OSError, ValueError):
        return False


def _write_once(marker: Path, spec: dict, write: Callable[[], int]) -> dict:
    """Writes a dataset with ``write`` (which returns its total bytes) unless ``marker``
    says an earlier run wrote this ``spec``; returns the spec with ``total_bytes`` and
    ``skipped``. A marker of another spec is removed first, and the marker is written
    last, so an interrupted run writes again."""
    if marker.exists():
        old = json.loads(marker.read_text())
        total = old.pop("total_bytes", None)
        if old == spec and total is not None:
            return {**spec, "total_bytes": total, "skipped": True}
        marker.unlink()
    total = write()
    marker.write_text(json.dumps({**spec, "total_bytes": total}))
    return {**spec, "total_bytes": total, "skipped": False}


def make_jpeg(root: Union[str, Path], files: int, classes: int = 10, size: int = 64, seed: int = 0,
              quality: int = 90, progress: bool = False) -> dict:
    """Writes the JPEG dataset; returns the spec with ``total_bytes``."""
    if files < 1 or not 1 <= classes <= files:
        raise ValueError("need 1 <= classes <= files")
    if not 8 <= size <= 4096:
        raise ValueError("size must be in 8..=4096")
    root = Path(root)
    spec = {"generator": "granary-jpeg", "format": 1, "files": files, "classes": classes,
            "size": size, "seed": seed, "quality": quality}

    def write() -> int:
        root.mkdir(parents=True, exist_ok=True)
        total = 0
        t0 = time.monotonic()
        for i in range(files):
            path = root / jpeg_relative_path(i, files, classes)
            path.parent.mkdir(parents=True, exist_ok=True)
            data = render_jpeg(i, files, classes, size, seed, quality)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
            total += len(data)
            if progress and (i + 1) % 1000 == 0:
                print(f"  {i + 1}/{files} images, {total / 1e6:.1f} MB, "
                      f"{time.monotonic() - t0:.1f} s", file=sys.stderr)
        return total

    return _write_once(root / JPEG_MARKER, spec, write)


def make_synth(root: Union[str, Path], files: int, classes: int = 10, mean_size: int = 16_384,
               sigma: float = 0.5, seed: int = 0) -> dict:
    """Writes the synthetic (self-verifying) dataset; returns the spec with ``total_bytes``."""
    root = Path(root)
    spec = {"generator": "granary-synth-py", "format": 1, "files": files, "classes": classes,
            "mean_size": mean_size, "sigma": sigma, "seed": seed}
    return _write_once(root / SYNTH_MARKER, spec,
                       lambda: synth.generate(synth.Spec(root, files, classes, mean_size, sigma,
                                                         seed)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m granary.make_dataset", description=__doc__.split("\n\n")[0])
    kind = p.add_mutually_exclusive_group(required=True)
    kind.add_argument("--jpeg", metavar="DIR", help="write real JPEG images into DIR")
    kind.add_argument("--synth", metavar="DIR", help="write the self-verifying synthetic format into DIR")
    p.add_argument("--files", type=int, default=5000, help="number of samples (default 5000)")
    p.add_argument("--classes", type=int, default=10, help="number of class folders (default 10)")
    p.add_argument("--size", type=int, default=64, help="JPEG: width and height in pixels (default 64)")
    p.add_argument("--quality", type=int, default=90, help="JPEG: quality 1-95 (default 90)")
    p.add_argument("--mean-size", type=int, default=16_384, help="synth: mean file size in bytes")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    t0 = time.monotonic()
    if a.jpeg:
        r = make_jpeg(a.jpeg, a.files, a.classes, a.size, a.seed, a.quality, progress=True)
        where = a.jpeg
    else:
        r = make_synth(a.synth, a.files, a.classes, a.mean_size, seed=a.seed)
        where = a.synth
    state = "already there" if r["skipped"] else f"written in {time.monotonic() - t0:.1f} s"
    print(f"{r['files']} files in {r['classes']} classes, {r['total_bytes'] / 1e6:.1f} MB in {where} ({state})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
