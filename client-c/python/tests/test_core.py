"""The core API: sessions, batches, samples, errors, zero copy, lifetimes."""

import gc
import sys
import time

import numpy as np
import pytest

import granary
from granary import synth
from conftest import SYNTH_CLASSES, SYNTH_FILES, planner_reference


def test_one_session_two_epochs_in_planner_order_every_byte_verified(agent):
    ref = planner_reference()
    with granary.connect(agent.socket) as client:
        with client.open_session("synth", batch_size=32, seed=11, epochs=2) as s:
            assert s.info.samples_per_epoch == SYNTH_FILES
            assert s.info.batches_per_epoch == (SYNTH_FILES + 31) // 32
            got = {0: [], 1: []}
            for batch in s:
                assert batch.status == 0 and batch.error is None
                ids = []
                for smp in batch:
                    fid, cls, length = synth.verify(smp.data)
                    assert (fid, cls, length) == (smp.id, smp.label, len(smp))
                    ids.append(smp.id)
                got[batch.epoch].append(ids)
                assert batch.end_of_epoch == (batch.index == s.info.batches_per_epoch - 1)
                assert batch.end_of_stream == (batch.end_of_epoch and batch.epoch == 1)
            for epoch in (0, 1):
                assert got[epoch] == ref.plan_batches(11, epoch, SYNTH_FILES, 0, 1, 32)
            with pytest.raises(granary.EndOfStream):
                s.next_batch()


def test_zero_copy_sample_bytes_lie_inside_the_arena_mapping(agent):
    torch = pytest.importorskip("torch")
    from granary.torch import as_tensor

    with granary.open_session("synth", agent.socket, batch_size=16) as s:
        base, size = s.arena
        assert base != 0 and size == s.info.arena_size
        with s.next_batch() as batch:
            for smp in batch:
                addr = smp.address
                assert base <= addr and addr + len(smp) <= base + size
                arr = smp.numpy()
                assert arr.__array_interface__["data"][0] == addr
                assert not arr.flags.writeable
                t = as_tensor(smp)
                assert t.data_ptr() == addr and t.dtype == torch.uint8 and t.numel() == len(smp)
                # The memoryview exposes the same bytes, in place.
                assert np.frombuffer(smp.data, np.uint8).__array_interface__["data"][0] == addr
                del arr, t


def test_touching_a_released_sample_raises(agent):
    with granary.open_session("synth", agent.socket, batch_size=8) as s:
        batch = s.next_batch()
        sample = batch[0]
        view = sample.data
        first = view[0]
        batch.release()
        assert batch.released
        for touch in (
            lambda: sample.data,
            lambda: sample.id,
            lambda: sample.label,
            lambda: sample.numpy(),
            lambda: sample.tobytes(),
            lambda: len(sample),
            lambda: sample.buffer(),
            lambda: batch[0],
            lambda: len(batch),
            lambda: batch.epoch,
        ):
            with pytest.raises(granary.ReleasedError) as e:
                touch()
            assert "released" in str(e.value)
        # The memoryview handed out before the release is released too.
        with pytest.raises(ValueError, match="released"):
            view[0]
        assert first == ord("G")
        batch.release()  # idempotent

        # Iterating releases each batch when the loop moves on.
        kept = []
        for b in s:
            kept.append((b, b[0]))
            if len(kept) == 3:
                break
        for b, smp in kept:
            assert b.released
            with pytest.raises(granary.ReleasedError):
                smp.data
    with pytest.raises(granary.ReleasedError):
        s.next_batch()


def test_an_array_kept_past_close_stays_readable(agent):
    """Arrays made from samples keep the arena mapped: no crash after close."""
    s = granary.open_session("synth", agent.socket, batch_size=8)
    batch = s.next_batch()
    arr = batch[0].numpy()
    expect = bytes(arr[:8])
    s.close()
    assert batch.released and s.closed
    gc.collect()
    assert bytes(arr[:8]) == expect == synth.MAGIC
    del arr
    gc.collect()


def test_errors_carry_the_c_error_text(agent, tmp_path):
    with pytest.raises(granary.NotFound) as e:
        granary.open_session("no-such-dataset", agent.socket)
    assert e.value.code == -8 and e.value.name == "GRANARY_E_NOT_FOUND"
    assert "no-such-dataset" in str(e.value)  # the agent's own words
    assert isinstance(e.value, granary.GranaryError) and isinstance(e.value, LookupError)

    with pytest.raises(granary.Disconnected) as e:
        granary.connect(str(tmp_path / "nothing.sock"))
    assert "nothing.sock" in str(e.value)

    with pytest.raises(granary.InvalidArgument):
        granary.open_session("synth", agent.socket, batch_size=0)
    with pytest.raises(granary.InvalidArgument):
        granary.open_session("synth", agent.socket, rank=2, world_size=2)


def test_try_next_batch_and_the_context_managers(agent):
    with granary.connect(agent.socket) as c:
        with c.open_session("synth", batch_size=SYNTH_FILES) as s:
            b = None
            deadline = time.monotonic() + 10
            while b is None and time.monotonic() < deadline:
                b = s.try_next_batch()
            assert b is not None and len(b) == SYNTH_FILES
            with b:
                labels = b.labels
            assert sorted(labels) == sorted(i * SYNTH_CLASSES // SYNTH_FILES for i in range(SYNTH_FILES))
            assert b.released
    assert s.closed


@pytest.mark.parametrize("how", ["kill", "terminate"])
def test_agent_stopped_mid_epoch_raises_within_the_timeout(own_agent, how):
    timeout = 5.0
    s = granary.open_session(
        "synth", own_agent.socket, batch_size=8, epochs=3, timeout=timeout, resume_timeout=None
    )
    it = iter(s)
    for _ in range(3):
        batch = next(it)
        synth.verify(batch[0].data)
    stopped = time.monotonic()
    own_agent.kill() if how == "kill" else own_agent.stop()
    delivered = 0
    with pytest.raises(granary.Disconnected) as e:
        for batch in it:
            delivered += 1  # batches already published stay readable
            synth.verify(batch[0].data)
    elapsed = time.monotonic() - stopped
    assert elapsed < timeout, f"took {elapsed:.2f} s"
    assert delivered < 3 * SYNTH_FILES // 8
    assert "agent" in str(e.value).lower() or "disconnected" in str(e.value).lower()
    s.close()


EXIT_CHILD = r"""
import sys
from granary.agent import LocalAgent
from granary.torch import GranaryDataset
root, stop = sys.argv[1], sys.argv[2] == "stop"
agent = LocalAgent({"synth": root}).start()
it = iter(GranaryDataset("synth", agent.socket, batch_size=8, batches=True, epochs=2))
for _ in range(3):
    next(it)
if stop:
    agent.stop()
print("leaving", flush=True)
# The interpreter exits with the generator suspended on a lent batch: the
# session's finalizer runs first, then the generator's release.
"""


@pytest.mark.parametrize("stop", ["stop", "keep"])
def test_interpreter_exit_with_a_suspended_iterator(synth_root, stop):
    """Exiting with a GranaryDataset iterator suspended mid-epoch (agent
    stopped or not) returns at once with status 0: the batch release that
    runs after the session's finalizer is refused in Python, never sent to
    the freed C session (which spun in the library, or crashed)."""
    import subprocess

    t = time.monotonic()
    p = subprocess.run([sys.executable, "-c", EXIT_CHILD, str(synth_root), stop],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "leaving" in p.stdout
    assert time.monotonic() - t < 30


def test_job_position_says_where_a_rank_stopped_and_a_replacement_opens_there(agent):
    """Without peers the agent answers from its own sessions: a rank that
    took 3 batches and went away is at step 3; its replacement opens at
    ``first_batch`` and reads the rest of the epoch, every sample once."""
    opts = dict(seed=23, batch_size=16, world_size=2, rank=1)
    with granary.connect(agent.socket) as client:
        with pytest.raises(granary.NotFound):
            client.job_position("synth", **opts)
        first = []
        with client.open_session("synth", **opts) as s:
            for _ in range(3):
                with s.next_batch() as b:
                    first += [smp.id for smp in b]
        pos = client.job_position("synth", **opts)
        assert (pos.epoch, pos.step, pos.ranks_known, pos.nodes) == (0, 3, 1, 1), pos
        assert pos.rank_position == (0, 3) and pos.first_batch == 3, pos
        rest = []
        with client.open_session("synth", first_batch=pos.first_batch, **opts) as s:
            for b in s:
                rest += [smp.id for smp in b]
                b.release()
        whole = []
        with client.open_session("synth", **opts) as s:
            for b in s:
                whole += [smp.id for smp in b]
                b.release()
        assert first + rest == whole
        # A locality plan is asked as well (no longer refused): its global
        # steps are the exact plan's, so its positions are kept under the
        # same plan.
        loc = client.job_position("synth", locality=b"\x01" * 32, **opts)
        assert loc == client.job_position("synth", **opts), loc
        assert (loc.epoch, loc.step) == (1, 0), loc
