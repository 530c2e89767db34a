"""The decode of `bench/run stall --decode`: what each contender does to a
JPEG sample, each the way its own documentation recommends, and the JPEG
dataset they read.

Every decoder delivers the same thing: the image resized to SIDE x SIDE,
RGB, as a flat uint8 tensor (3 * SIDE * SIDE values, CHW). The decoder is
a property of the contender (`stall_train.py --decoder`, passed per
contender by `bench/src/stall_loaders.rs`):

  torchvision  `torchvision.io.decode_jpeg(mode=RGB)`, then
               `transforms.v2.functional.resize(antialias=True)` on the
               uint8 tensor: what docs/python.md recommends for Granary
               without `prepare` (`granary.torch.decode_jpeg` calls
               torchvision's `decode_jpeg`), and torchvision's own
               recommendation for JPEG bytes in memory ("Decoding / Encoding
               images and videos", torchvision.io).
  pil          `PIL.Image.open(...).convert("RGB")`, then torchvision's
               `transforms.Resize((SIDE, SIDE))` (Pillow's antialiased
               bilinear resize) and `transforms.PILToTensor()`: webdataset's
               README pipeline (`.decode("pil")`, then a `preproc` of
               `transforms.Resize((224, 224))` and `ToTensor()`; uint8 kept
               here with `PILToTensor`), and mosaicml-streaming's, whose
               "jpeg"/"pil" MDS encodings decode with `PIL.Image.open`
               and whose vision examples then apply torchvision transforms
               (the benchmark's MDS shards store raw bytes, so the PIL
               open is done here, as its docs show for a bytes column).
  dali         NVIDIA DALI on the CPU (`device_id=None`, `exec_dynamic=True`):
               `fn.decoders.image(device="cpu", output_type=RGB)`, then
               `fn.resize(resize_x=SIDE, resize_y=SIDE, antialias=True)` and
               `fn.transpose` to CHW (DALI's "Image Decoder" and "Resize"
               operator docs, and its ResNet-50 example's pipeline on CPU).
               `stall_train.py --contender dali` reads with
               `fn.readers.webdataset`; [`dali_decode`] decodes bytes given in
               memory (`fn.external_source`), for the tests.

Every decoder runs on one intra-op thread per DataLoader worker (the
workers' setting), the same in every contender; DALI's pipeline has its
own thread pool (`num_threads`).

    stall_decode.py make ROOT FILES SIDE   # writes the dataset (once)
"""

import io
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
#: The decoders a contender may be given (`stall_train.py --decoder`).
DECODERS = ("torchvision", "pil", "dali")
_ONE_THREAD = [False]
_PIL_RESIZE = {}


def _one_thread():
    if not _ONE_THREAD[0]:
        torch.set_num_threads(1)
        _ONE_THREAD[0] = True


def decode(body, side):
    """torchvision: JPEG bytes (bytes, bytearray or a uint8 tensor) -> the
    image resized to side x side, RGB, as a flat uint8 tensor (CHW)."""
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms.v2 import functional as F

    _one_thread()
    data = body if isinstance(body, torch.Tensor) else torch.frombuffer(bytearray(body), dtype=torch.uint8)
    img = decode_jpeg(data, mode=ImageReadMode.RGB)
    return F.resize(img, [side, side], antialias=True).reshape(-1)


def pil_transform(side):
    """The torchvision transforms applied to a decoded PIL image (webdataset's
    and mosaicml-streaming's examples): resize to side x side, then a CHW
    uint8 tensor."""
    t = _PIL_RESIZE.get(side)
    if t is None:
        from torchvision import transforms

        t = _PIL_RESIZE[side] = transforms.Compose([transforms.Resize((side, side)), transforms.PILToTensor()])
    return t


def from_pil(img, side):
    """A decoded PIL image -> the flat uint8 tensor every decoder delivers."""
    _one_thread()
    return pil_transform(side)(img.convert("RGB")).reshape(-1)


def decode_pil(body, side):
    """PIL: JPEG bytes (bytes, bytearray or a uint8 tensor) -> as [`decode`]."""
    from PIL import Image

    data = body.numpy().tobytes() if isinstance(body, torch.Tensor) else bytes(body)
    with Image.open(io.BytesIO(data)) as img:
        return from_pil(img, side)


def decoder(name):
    """The per-sample decoder `name` ((bytes, side) -> flat tensor). DALI
    decodes whole batches in its own pipeline, not sample by sample."""
    if name == "torchvision":
        return decode
    if name == "pil":
        return decode_pil
    raise ValueError(f"no per-sample decoder {name!r} (known: torchvision, pil; dali decodes in its pipeline)")


def dali_images(jpegs, side):
    """DALI's CPU graph from encoded JPEGs to side x side RGB, CHW, uint8."""
    from nvidia.dali import fn, types

    img = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
    img = fn.resize(img, resize_x=side, resize_y=side, antialias=True)
    return fn.transpose(img, perm=[2, 0, 1])


def dali_decode(bodies, side, threads=1):
    """DALI on the CPU: a list of JPEG bytes -> one flat tensor per image, as
    [`decode`] (`fn.external_source`, one batch)."""
    import numpy as np
    from nvidia.dali import fn, pipeline_def

    batch = [np.frombuffer(bytes(b), dtype=np.uint8) for b in bodies]

    @pipeline_def(batch_size=len(batch), num_threads=threads, device_id=None, exec_dynamic=True)
    def pipe():
        return dali_images(fn.external_source(source=lambda: batch, batch=True), side)

    p = pipe()
    p.build()
    (out,) = p.run()
    return [torch.from_numpy(np.array(t)).reshape(-1) for t in out]


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
