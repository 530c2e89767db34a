"""An agent killed (SIGKILL) and restarted mid-epoch costs the job nothing:
``GranaryDataset`` waits for the agent to come back and resumes after the
batches it had handed out, so the pass sees every sample of every epoch
exactly once, byte for byte; in the main process and in DataLoader
workers."""

import threading
import time

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

import granary  # noqa: E402
from granary import synth  # noqa: E402
from granary.agent import LocalAgent  # noqa: E402
from granary.torch import GranaryDataset  # noqa: E402
from conftest import SYNTH_FILES  # noqa: E402


def _restart_after(agent: LocalAgent, got, at_least: int, pause: float, killed_at: list) -> threading.Thread:
    """Kills `agent` once `got` holds `at_least` batches (noting how many
    in `killed_at`), restarts it after `pause` seconds."""

    def run():
        while len(got) < at_least:
            time.sleep(0.005)
        agent.kill()
        killed_at.append(len(got))
        time.sleep(pause)
        agent.start()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _dataset(agent: LocalAgent, epochs: int) -> GranaryDataset:
    """Batches of 10 samples as (bytes, label, id), waiting up to 30 s for
    a lost agent."""
    return GranaryDataset(
        "synth",
        agent.socket,
        batch_size=10,
        seed=4,
        epochs=epochs,
        with_ids=True,
        batches=True,
        collate=lambda xs, ys: ([bytes(x.numpy()) for x in xs], ys),
        resume_timeout=30,
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_an_agent_killed_mid_epoch_is_resumed_after_the_last_batch_handed_out(synth_root, workers):
    epochs = 2
    with LocalAgent({"synth": synth_root}) as agent:
        ds = _dataset(agent, epochs)
        got = []
        killed_at: list = []
        killer = _restart_after(agent, got, at_least=7, pause=0.3, killed_at=killed_at)
        loader = DataLoader(ds, batch_size=None, num_workers=workers)
        for xs, ys, ids in loader:
            got.append(list(zip(ids.tolist(), ys, xs)))
            time.sleep(0.002)  # a consumer slow enough for the kill to land mid-epoch
        killer.join(10)
        assert not killer.is_alive()
        batches = epochs * SYNTH_FILES // 10
        assert killed_at and killed_at[0] < batches - 4, f"the kill came at {killed_at} of {batches} batches"
        ids = [i for batch in got for i, _, _ in batch]
        for i, y, x in (s for batch in got for s in batch):
            file_id, cls, _ = synth.verify(x)
            assert (file_id, cls) == (i, y)
        assert sorted(ids) == sorted(list(range(SYNTH_FILES)) * epochs), "every sample once per epoch"


def test_the_library_resumes_a_plain_session_beside_a_dataloader(synth_root):
    """A plain session (``granary.open_session``: libgranary's own resume,
    the path C loaders take) and a ``GranaryDataset`` with two DataLoader
    workers read at once; the agent is killed and restarted mid-epoch:
    each loader sees every sample of both epochs once, byte for byte."""
    epochs = 2
    with LocalAgent({"synth": synth_root}) as agent:
        plain: list = []
        errors: list = []

        def read_plain():
            try:
                with granary.open_session(
                    "synth", agent.socket, batch_size=10, seed=9, epochs=epochs, resume_timeout=30
                ) as s:
                    for batch in s:
                        plain.append([(smp.id, smp.label, bytes(smp.data)) for smp in batch])
                        time.sleep(0.002)
                    plain_resumes.append(s.resumes)
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        plain_resumes: list = []
        reader = threading.Thread(target=read_plain, daemon=True)
        reader.start()
        killed_at: list = []
        killer = _restart_after(agent, plain, at_least=7, pause=0.3, killed_at=killed_at)
        ds = _dataset(agent, epochs)
        got = []
        for xs, ys, ids in DataLoader(ds, batch_size=None, num_workers=2):
            got.append(list(zip(ids.tolist(), ys, xs)))
            time.sleep(0.002)
        reader.join(60)
        killer.join(10)
        assert not reader.is_alive() and not killer.is_alive()
        assert not errors, errors
        batches = epochs * SYNTH_FILES // 10
        assert killed_at and killed_at[0] < batches - 4, f"the kill came at {killed_at} of {batches} batches"
        assert plain_resumes == [1], f"the plain session resumed {plain_resumes} times"
        for name, batches_seen in (("plain session", plain), ("dataset", got)):
            ids = [i for batch in batches_seen for i, _, _ in batch]
            for i, y, x in (smp for batch in batches_seen for smp in batch):
                file_id, cls, _ = synth.verify(x)
                assert (file_id, cls) == (i, y), name
            assert sorted(ids) == sorted(list(range(SYNTH_FILES)) * epochs), f"{name}: every sample once per epoch"
