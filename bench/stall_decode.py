"""The decode of `bench/run stall --decode`: what every contender does to a
JPEG sample, the way torchvision's docs recommend (decode_jpeg, then
resize with antialiasing), and the JPEG dataset it reads.

    stall_decode.py make ROOT FILES SIDE   # writes the dataset (once)
"""

import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
_ONE_THREAD = [False]


def decode(body, side):
    """JPEG bytes (bytes, bytearray or a uint8 tensor) -> the image resized
    to side x side, RGB, as a flat uint8 tensor (3 * side * side values,
    CHW), on one intra-op thread (a DataLoader worker's setting, and the
    same in every contender)."""
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms.v2 import functional as F

    if not _ONE_THREAD[0]:
        torch.set_num_threads(1)
        _ONE_THREAD[0] = True
    data = body if isinstance(body, torch.Tensor) else torch.frombuffer(bytearray(body), dtype=torch.uint8)
    img = decode_jpeg(data, mode=ImageReadMode.RGB)
    return F.resize(img, [side, side], antialias=True).reshape(-1)


def make(root, files, side):
    """The JPEG dataset: `files` images of side x side in 100 class folders
    (granary.make_dataset.make_jpeg, this checkout's)."""
    sys.path.insert(0, str(REPO / "client-c" / "python"))
    from granary.make_dataset import make_jpeg

    spec = make_jpeg(root, files, classes=100, size=side, seed=0, quality=90)
    print(f"jpeg dataset: {files} images of {side}x{side}, {spec['total_bytes'] / 1e6:.1f} MB"
          f"{' (already there)' if spec.get('skipped') else ''}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "make":
        raise SystemExit(__doc__)
    make(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
