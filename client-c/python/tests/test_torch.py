"""granary.torch: sharding across DataLoader workers and ranks, decode,
lifetimes, and an agent that goes away."""

import collections
import time

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

import granary  # noqa: E402
from granary import synth  # noqa: E402
from granary.torch import GranaryDataset, decode_jpeg, rank_and_world  # noqa: E402
from conftest import JPEG_FILES, SYNTH_FILES, planner_reference  # noqa: E402

WORKERS = 2
RANKS = 2


def _keep_items(items):
    return items


@pytest.mark.parametrize("batches", [False, True], ids=["samples", "batches"])
def test_exactly_once_per_epoch_across_2_workers_x_2_ranks(agent, batches):
    """Every sample exactly once per epoch across 2 ranks x 2 workers, each
    one's bytes verified after the hand-off from the worker processes, and
    each rank's share equal to the planner's for the rank: its workers split
    the rank's batches round robin, so with batch items the DataLoader hands
    them on in the rank's own order."""
    ref = planner_reference()
    seen = collections.Counter()
    for epoch in (0, 1):
        for rank in range(RANKS):
            ds = GranaryDataset(
                "synth", agent.socket, batch_size=16, seed=7, rank=rank, world_size=RANKS,
                with_ids=True, batches=batches, collate=(lambda xs, ys: (xs, ys)) if batches else None,
            )
            ds.set_epoch(epoch)
            if batches:
                loader = DataLoader(ds, batch_size=None, num_workers=WORKERS)
                items = ((x, y, i) for xs, ys, ids in loader for x, y, i in zip(xs, ys, ids.tolist()))
            else:
                # Granary batches of 16 regrouped by 10: DataLoader batches
                # span two Granary batches.
                loader = DataLoader(ds, batch_size=10, num_workers=WORKERS, collate_fn=_keep_items)
                items = (item for group in loader for item in group)
            share = []
            for x, label, sid in items:
                assert x.dtype == torch.uint8 and x.dim() == 1
                fid, cls, length = synth.verify(x.numpy())
                assert (fid, cls, length) == (sid, label, x.numel())
                seen[(epoch, sid)] += 1
                share.append(sid)
            expect = ref.rank_share(7, epoch, SYNTH_FILES, rank, RANKS)
            if batches:
                assert share == expect, "batches not in the rank's order"
            assert sorted(share) == sorted(expect)
    for epoch in (0, 1):
        ids = [sid for (e, sid), n in seen.items() if e == epoch]
        assert sorted(ids) == list(range(SYNTH_FILES)), f"epoch {epoch} missed or added samples"
    dup = {k: n for k, n in seen.items() if n != 1}
    assert not dup, f"samples delivered more than once: {dup}"
    # Different epochs, different orders (set_epoch reached the sessions).
    assert ref.epoch_permutation(7, 0, SYNTH_FILES) != ref.epoch_permutation(7, 1, SYNTH_FILES)


def test_rank_and_world_from_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert rank_and_world() == (3, 4)
    assert rank_and_world(rank=1) == (1, 4)
    assert rank_and_world(0, 1) == (0, 1)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError):
        rank_and_world()
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert rank_and_world() == (0, 1)


def test_default_collate_over_views_sees_intact_bytes(agent):
    """Raw views regrouped by the default collate across Granary batches: a
    batch goes back to the agent only once no tensor views it."""
    ds = GranaryDataset("synth", agent.socket, batch_size=16, transform=lambda t: t[:64], with_ids=True)
    n = 0
    for xs, ys, ids in DataLoader(ds, batch_size=10, num_workers=0):
        for x, y, i in zip(xs, ys.tolist(), ids.tolist()):
            head = bytes(x.numpy())
            assert head[:8] == synth.MAGIC
            assert int.from_bytes(head[8:16], "little") == i
            assert int.from_bytes(head[16:20], "little") == y
            n += 1
    assert n == SYNTH_FILES


def test_jpeg_decode_matches_imagefolder(agent, jpeg_root):
    tv = pytest.importorskip("torchvision")
    folder = tv.datasets.ImageFolder(str(jpeg_root))
    ds = GranaryDataset("jpeg", agent.socket, batch_size=32, decode=decode_jpeg, batches=True, with_ids=True)
    n = 0
    for xs, ys, ids in DataLoader(ds, batch_size=None, num_workers=WORKERS):
        assert xs.shape[1:] == (3, 32, 32) and xs.dtype == torch.uint8
        for x, y, i in zip(xs, ys.tolist(), ids.tolist()):
            path, label = folder.samples[i]
            assert label == y
            expect = tv.io.decode_jpeg(tv.io.read_file(path), mode=tv.io.ImageReadMode.RGB)
            assert torch.equal(x, expect)
            n += 1
    assert n == JPEG_FILES


def test_views_kept_too_long_are_an_error(agent):
    ds = GranaryDataset("synth", agent.socket, batch_size=8, max_held_batches=2)
    kept = []
    with pytest.raises(granary.GranaryError, match="clone"):
        for x, _y in ds:
            kept.append(x)  # views, never copied
    # Copies are fine.
    ds = GranaryDataset("synth", agent.socket, batch_size=8, max_held_batches=2)
    kept = [x.clone() for x, _y in ds]
    assert len(kept) == SYNTH_FILES


def test_agent_stopped_mid_epoch_fails_the_dataloader_within_the_timeout(own_agent):
    # resume_timeout=None: fail at once instead of waiting for the agent
    # to come back (test_resume.py covers the default).
    timeout = 5.0
    ds = GranaryDataset("synth", own_agent.socket, batch_size=8, epochs=5, timeout=timeout, resume_timeout=None)
    loader = DataLoader(ds, batch_size=None, num_workers=WORKERS)
    it = iter(loader)
    for _ in range(4):
        next(it)
    own_agent.kill()
    stopped = time.monotonic()
    with pytest.raises(Exception) as e:
        for _ in it:
            pass
    elapsed = time.monotonic() - stopped
    assert elapsed < timeout + 2.0, f"took {elapsed:.2f} s"
    assert isinstance(e.value, granary.Disconnected), repr(e.value)
    assert "GRANARY_E_DISCONNECTED" in str(e.value)
    del it


def test_failed_samples_are_left_out_and_reported_unless_strict(tmp_path):
    import warnings

    from granary.agent import LocalAgent
    from granary.make_dataset import SYNTH_MARKER, make_synth
    from granary.torch import SampleFailureWarning

    root = tmp_path / "synth"
    make_synth(root, 64, 4, mean_size=2048, seed=9)
    with LocalAgent({"synth": root}) as agent:
        # Catalogued at start-up, gone before anything was read: NotFound.
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != SYNTH_MARKER)
        gone = files[::13]
        for p in gone:
            p.unlink()
        ds = GranaryDataset("synth", agent.socket, batch_size=8, with_ids=True)
        assert ds.on_error == "report"
        with pytest.warns(SampleFailureWarning, match="could not be read") as caught:
            got = [(int(i), synth.verify(bytes(x.numpy()))[0]) for x, _y, i in ds]
        assert ds.failed_samples == {"NotFound": len(gone)}
        assert len(got) == len(files) - len(gone)
        assert len(caught) >= 1
        # The same with whole batches: shorter batches, no empty ones.
        ds = GranaryDataset("synth", agent.socket, batch_size=8, batches=True, on_error="skip")
        with warnings.catch_warnings():
            warnings.simplefilter("error", SampleFailureWarning)
            sizes = [len(ys) for _xs, ys in ds]
        assert sum(sizes) == len(files) - len(gone) and all(sizes)
        assert ds.failed_samples == {"NotFound": len(gone)}
        # Strict mode: the first failure raises.
        ds = GranaryDataset("synth", agent.socket, batch_size=8, on_error="raise")
        with pytest.raises(granary.NotFound):
            for _ in ds:
                pass
        with pytest.raises(ValueError, match="report"):
            GranaryDataset("synth", agent.socket, on_error="ignore")

