"""bench/stall_decode.py: the decoders of `bench/run stall --decode` (each
contender's own docs' choice: torchvision, PIL, DALI on the CPU) deliver
the same shape and nearly the same pixels for one JPEG of
`granary.make_dataset.make_jpeg`. The DALI case is skipped, loudly, when
nvidia-dali is not installed."""

import sys

import pytest

from conftest import REPO

pytest.importorskip("torchvision")
import torch  # noqa: E402

from granary.make_dataset import make_jpeg  # noqa: E402

try:
    import nvidia.dali  # noqa: F401

    DALI = None
except ImportError as e:  # pragma: no cover - depends on the machine
    DALI = f"nvidia-dali is not installed ({e})"

SIDE = 224
#: Mean absolute difference (of 255) allowed against torchvision's decode
#: and resize: the decoders' IDCTs and the resizes' filters differ a little
#: (PIL 0.0, DALI 0.17 measured on a 448 x 448 image); test_prepare.py
#: allows the agent's preparation the same against PIL.
MEAN_DIFF = 1.5


def _stall_decode():
    """bench/stall_decode.py (the benchmark's folder is no package)."""
    bench = str(REPO / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import stall_decode

    return stall_decode


@pytest.fixture(scope="module")
def jpeg(tmp_path_factory):
    """One 448 x 448 JPEG (the benchmark's size), as bytes."""
    root = tmp_path_factory.mktemp("stall-jpeg")
    make_jpeg(root, 1, classes=1, size=448, seed=0, quality=90)
    (path,) = sorted(root.rglob("*.jpg"))
    return path.read_bytes()


def _decoded(name, body):
    sd = _stall_decode()
    if name == "dali":
        (x,) = sd.dali_decode([body], SIDE)
        return x
    return sd.decoder(name)(body, SIDE)


def _check_against_torchvision(name, body):
    want = _decoded("torchvision", body)
    got = _decoded(name, body)
    assert want.dtype == got.dtype == torch.uint8
    assert want.shape == got.shape == (3 * SIDE * SIDE,)
    diff = (want.float() - got.float()).abs().mean().item()
    assert diff <= MEAN_DIFF, f"{name}: mean difference {diff:.3f} against torchvision"
    # The same image, not another one of the right shape.
    assert abs(want.float().mean().item() - got.float().mean().item()) <= MEAN_DIFF


def test_torchvision_decodes_to_side_by_side_rgb(jpeg):
    x = _decoded("torchvision", jpeg)
    assert x.shape == (3 * SIDE * SIDE,) and x.dtype == torch.uint8
    assert 0 < x.float().std().item(), "not a flat image"
    # A tensor input gives the same as bytes.
    assert torch.equal(x, _decoded("torchvision", torch.frombuffer(bytearray(jpeg), dtype=torch.uint8)))


def test_pil_matches_torchvision(jpeg):
    _check_against_torchvision("pil", jpeg)


@pytest.mark.skipif(DALI is not None, reason=f"SKIPPED: DALI decoder test: {DALI}")
def test_dali_on_cpu_matches_torchvision(jpeg):
    _check_against_torchvision("dali", jpeg)


def test_unknown_decoder_is_refused():
    with pytest.raises(ValueError):
        _stall_decode().decoder("nope")
