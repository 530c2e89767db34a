"""An agent killed (SIGKILL) and restarted mid-epoch costs the job nothing:
``GranaryDataset`` waits for the agent to come back and resumes after the
batches it had handed out, so the pass sees every sample of every epoch
exactly once, byte for byte; in the main process and in DataLoader
workers."""

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

import granary  # noqa: E402
from granary import synth  # noqa: E402
from granary.agent import LocalAgent  # noqa: E402
from granary.torch import GranaryDataset  # noqa: E402
from granary import _lib  # noqa: E402
from conftest import REPO, SYNTH_FILES  # noqa: E402


@pytest.fixture(scope="module")
def c_consume(tmp_path_factory) -> Path:
    """client-c/examples/consume.c built against the libgranary.so these
    tests load: a C loader in a process of its own."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler (cc) is needed for the C loader of the restart test"
    lib_dir = str(Path(_lib.path).resolve().parent)
    out = tmp_path_factory.mktemp("c") / "consume"
    subprocess.run(
        [cc, "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", str(REPO / "client-c" / "include"),
         str(REPO / "client-c" / "examples" / "consume.c"), "-L", lib_dir, f"-Wl,-rpath,{lib_dir}",
         "-lgranary", "-o", str(out)],
        check=True,
    )
    return out


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


def test_an_agent_restart_costs_three_loaders_nothing(synth_root, c_consume):
    """Three loaders read at once: a C loader in a process of its own
    (``consume.c``, libgranary's own resume, on by default), a plain Python
    session (``granary.open_session``, the same library through ctypes) and
    a ``GranaryDataset`` with two DataLoader workers. The agent is killed
    (SIGKILL) and restarted mid-epoch: each loader sees every sample of both
    epochs once, byte for byte, and both library sessions report one
    resume."""
    epochs = 2
    with LocalAgent({"synth": synth_root}) as agent:
        # -s: every byte checked against the synthetic format; -i: every
        # sample id printed; -p 4: 4 ms per batch, so the kill lands mid-epoch.
        c_loader = subprocess.Popen(
            [str(c_consume), "-s", "-i", "-p", "4", str(agent.socket), "synth", "10", str(epochs), "11"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
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
        c_out, c_err = c_loader.communicate(timeout=60)
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
        # The C loader checked every byte itself (exit status 0: no mismatch,
        # no failed sample); here: every sample once per epoch, one resume.
        assert c_loader.returncode == 0, f"the C loader failed ({c_loader.returncode}):\n{c_err}\n{c_out[-2000:]}"
        lines = c_out.splitlines()
        c_ids = [tuple(int(v) for v in ln.split()[1:]) for ln in lines if ln.startswith("sample ")]
        assert sorted(c_ids) == sorted((e, i) for e in range(epochs) for i in range(SYNTH_FILES)), (
            "the C loader: every sample once per epoch"
        )
        assert "resumes=1" in lines, f"the C loader's resumes: {[ln for ln in lines if ln.startswith('resumes')]}"
