"""A dataset the agent prepares (``[dataset.prepare]``): GranaryDataset
hands out (H, W, 3) uint8 tensors viewing the arena, close to PIL's decode
and resize of the same files, and a file that does not decode is a
``Decode`` failed sample while the others are served."""

import io

import pytest

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")

import granary  # noqa: E402
from granary.agent import LocalAgent  # noqa: E402
from granary.torch import GranaryDataset, SampleFailureWarning  # noqa: E402

H, W = 32, 48
FILES = 24
CORRUPT = 9


def _image(i):
    """A smooth RGB image of a size of its own, as JPEG bytes."""
    w, h = 60 + (i * 17) % 140, 40 + (i * 11) % 100
    img = Image.new("RGB", (w, h))
    img.putdata([((x * 4 + i * 9) % 256, (y * 5) % 256, ((x + y) * 2) % 256) for y in range(h) for x in range(w)])
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=92)
    return buf.getvalue()


def _pil_reference(data):
    """PIL's decode, the centred crop to the output's aspect ratio and an
    antialiased bilinear resize: the same framing as the agent's "crop"."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = img.size
    scale = min(w / W, h / H)
    cw, ch = W * scale, H * scale
    box = ((w - cw) / 2, (h - ch) / 2, (w + cw) / 2, (h + ch) / 2)
    out = img.resize((W, H), Image.BILINEAR, box=box)
    return torch.frombuffer(bytearray(out.tobytes()), dtype=torch.uint8).view(H, W, 3)


@pytest.fixture(scope="module")
def prepared_agent(tmp_path_factory):
    root = tmp_path_factory.mktemp("prep")
    (root / "a").mkdir()
    files = {}
    for i in range(FILES):
        data = _image(i) if i != CORRUPT else _image(i)[:50]
        (root / "a" / f"{i:03}.jpg").write_bytes(data)
        files[i] = data
    # The same files twice: prepared, and as stored bytes.
    datasets = {"prep": root, "raw": root}
    with LocalAgent(datasets, prepare={"prep": f"resize = [{H}, {W}]\nthreads = 2"}) as a:
        yield a, files
        assert a.running, a.log_tail()


def test_the_session_says_the_shape(prepared_agent):
    agent, _ = prepared_agent
    with granary.connect(agent.socket) as client:
        s = client.open_session("prep", batch_size=4)
        assert s.info.prepared_shape == (H, W, 3)
        s.close()
        raw = client.open_session("raw", batch_size=4)
        assert raw.info.prepared_shape is None
        with raw.next_batch() as b:
            assert all(smp.prepared_shape is None for smp in b)
        raw.close()


def test_samples_are_hwc_views_close_to_pil_and_a_corrupt_file_is_a_decode_error(prepared_agent):
    agent, files = prepared_agent
    ds = GranaryDataset("prep", agent.socket, batch_size=4, with_ids=True)
    seen = {}
    with pytest.warns(SampleFailureWarning):
        for x, _y, i in ds:
            assert x.shape == (H, W, 3) and x.dtype == torch.uint8
            seen[int(i)] = x.clone()
    assert ds.failed_samples == {"Decode": 1}
    assert sorted(seen) == [i for i in range(FILES) if i != CORRUPT]
    for i, x in seen.items():
        ref = _pil_reference(files[i])
        diff = (x.int() - ref.int()).abs().float()
        # Two JPEG decoders (zune-jpeg, libjpeg-turbo) and two resizers
        # (fast_image_resize, PIL): close, not equal.
        assert diff.mean() < 1.5, (i, diff.mean())
    # The same bytes every pass: preparation is deterministic and cached.
    again = {int(i): x.clone() for x, _y, i in GranaryDataset("prep", agent.socket, batch_size=4, with_ids=True, on_error="skip")}
    assert all(torch.equal(again[i], seen[i]) for i in seen)
    # Strict mode names the kind.
    with pytest.raises(granary.DecodeError):
        for _ in GranaryDataset("prep", agent.socket, batch_size=4, on_error="raise"):
            pass
