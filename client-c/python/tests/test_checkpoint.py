"""Checkpoints: a training process killed with SIGKILL right after saving
its ``StatefulDataLoader`` state, at a random step of epoch 0 or 1, and
resumed in a new process, sees every sample of every epoch exactly once,
with 2 workers resumed with 2, with 2 resumed with 3, and two ranks resumed
together; the first batch after the resume comes in under 1 s. A state
whose dataset changed since is refused before the first batch, naming the
object; another world size with the same global batch goes on at the
committed global step, in locality mode too (two ranks on two agents
relaunched as one, or as the same job), and for a mixture. The C/Python session state
(``Session.state()``, ``open_session(state=...)``) likewise."""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchdata.stateful_dataloader")

import granary  # noqa: E402
from granary import resume_plan, synth  # noqa: E402
from granary.agent import LocalAgent  # noqa: E402
from granary.make_dataset import make_synth  # noqa: E402
from conftest import SYNTH_FILES  # noqa: E402

BATCH = 10
EPOCHS = 2

# One training process: reads the pass with a StatefulDataLoader, verifies
# and records every sample id it receives, and, at step `kill_at`, saves the
# loader's state (atomically, as a checkpoint would) and kills itself with
# SIGKILL. With a state file present it loads it first (into the loader, or
# into the dataset when `whole` asks for another worker count or world size)
# and measures the time to its first batch.
CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, time
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader
    from granary import synth
    from granary.torch import GranaryDataset

    a = json.loads(sys.argv[1])
    ds = GranaryDataset(a.get("dataset", "synth"), a["socket"], batch_size=a["batch"], seed=3, epochs=a["epochs"],
                        rank=a["rank"], world_size=a["world"], with_ids=True, batches=True,
                        collate=lambda xs, ys: ([bytes(x.numpy()) for x in xs], ys))
    state = None
    if a.get("load") and os.path.exists(a["load"]):
        state = torch.load(a["load"], weights_only=False)
        if a["whole"]:
            ds.load_state_dict(state)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=a["workers"])
    if state is not None and not a["whole"]:
        loader.load_state_dict(state)
    out = open(a["out"], "a")
    t0 = time.monotonic()
    for step, (xs, ys, ids) in enumerate(loader):
        if step == 0:
            out.write(json.dumps({"first_batch_s": time.monotonic() - t0}) + "\\n")
        for x, y, i in zip(xs, ys, ids.tolist()):
            fid, cls, _ = synth.verify(x)
            assert (fid, cls) == (i % a.get("ids_mod", 1 << 62), y), (fid, cls, i, y)
        out.write(json.dumps({"ids": ids.tolist()}) + "\\n")
        out.flush()
        if step + 1 == a.get("kill_at", -1):
            tmp = a["save"] + ".tmp"
            torch.save(loader.state_dict(), tmp)
            os.replace(tmp, a["save"])
            os.kill(os.getpid(), signal.SIGKILL)
    out.write(json.dumps({"done": True}) + "\\n")
    """
)


def _run(agent, tmp: Path, name: str, **a) -> subprocess.CompletedProcess:
    args = dict(socket=str(agent.socket), batch=BATCH, epochs=EPOCHS, rank=0, world=1, whole=False,
                out=str(tmp / f"{name}.jsonl"), save=str(tmp / f"{name}.state"))
    args.update(a)
    err = tmp / f"{name}.stderr"
    argv = [sys.executable, "-c", CHILD, json.dumps(args)]
    rc = _run_in_group(argv, err, timeout=180)
    return subprocess.CompletedProcess(argv, rc, "", err.read_text())


def _run_in_group(argv: list, log: Path, timeout: float) -> int:
    """Runs ``argv`` to its end (at most ``timeout`` seconds), its output in
    ``log``; returns its exit status.

    In a process group of its own, its output in a file: a process killed
    with SIGKILL leaves its DataLoader workers behind (blocked on a queue
    nobody reads), and they would hold a pipe open. They go with the group."""
    with open(log, "w") as f:
        p = subprocess.Popen(argv, stdout=f, stderr=f, start_new_session=True)
        try:
            return p.wait(timeout=timeout)
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _records(path: Path) -> tuple[list, list]:
    ids, firsts = [], []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        ids += r.get("ids", [])
        if "first_batch_s" in r:
            firsts.append(r["first_batch_s"])
    return ids, firsts


def _killed_then_resumed(agent, tmp, name, workers, workers_after, kill_at, rank=0, world=1, batch=BATCH):
    """A process killed right after saving at step `kill_at`, then one
    resuming from that state; returns (ids before, ids after, first-batch
    times of the resumed process)."""
    first = _run(agent, tmp, name, workers=workers, kill_at=kill_at, rank=rank, world=world, batch=batch)
    assert first.returncode == -9, f"the first process should die by SIGKILL: {first.returncode}\n{first.stderr}"
    before, _ = _records(tmp / f"{name}.jsonl")
    assert len(before) == kill_at * batch
    second = _run(agent, tmp, name + "-r", workers=workers_after, load=str(tmp / f"{name}.state"),
                  whole=workers_after != workers, rank=rank, world=world, batch=batch)
    assert second.returncode == 0, second.stderr
    after, firsts = _records(tmp / f"{name}-r.jsonl")
    return before, after, firsts


@pytest.mark.parametrize("workers,workers_after", [(2, 2), (2, 3), (0, 2)], ids=["2to2", "2to3", "0to2"])
def test_killed_after_saving_at_random_steps_resumes_every_sample_once(synth_root, tmp_path, workers, workers_after):
    rng = random.Random(f"{workers}-{workers_after}")
    steps = EPOCHS * SYNTH_FILES // BATCH
    # One kill in epoch 0 and one in epoch 1, each at a random step.
    kills = [rng.randrange(1, steps // 2), rng.randrange(steps // 2, steps - 1)]
    with LocalAgent({"synth": synth_root}) as agent:
        for n, kill_at in enumerate(kills):
            before, after, firsts = _killed_then_resumed(agent, tmp_path, f"k{n}", workers, workers_after, kill_at)
            print(f"[checkpoint] workers {workers}->{workers_after}: killed after step {kill_at} of {steps}, "
                  f"{len(after)} samples after the resume, first batch in {firsts[0] * 1000:.0f} ms")
            assert sorted(before + after) == sorted(list(range(SYNTH_FILES)) * EPOCHS), \
                "every sample of both epochs exactly once across the kill"
            assert firsts and firsts[0] < 1.0, f"first batch after the resume took {firsts[0]:.2f} s"


def test_two_ranks_resumed_together(synth_root, tmp_path):
    rng = random.Random(7)
    steps = EPOCHS * SYNTH_FILES // (2 * BATCH)
    with LocalAgent({"synth": synth_root}) as agent:
        ids = []
        for rank in (0, 1):
            before, after, firsts = _killed_then_resumed(
                agent, tmp_path, f"r{rank}", 2, 2, rng.randrange(1, steps - 1), rank=rank, world=2)
            assert firsts[0] < 1.0
            ids += before + after
        assert sorted(ids) == sorted(list(range(SYNTH_FILES)) * EPOCHS)


def test_another_world_size_goes_on_at_the_committed_global_step(synth_root, tmp_path):
    """World size 2 (batches of 10) saved at global step 7 of epoch 0;
    relaunched with world size 1 (batches of 20, the same global batch):
    the new rank starts at global step 7, and the two halves together are
    every sample of both epochs once."""
    with LocalAgent({"synth": synth_root}) as agent:
        ids = []
        for rank in (0, 1):
            r = _run(agent, tmp_path, f"w{rank}", workers=2, kill_at=7, rank=rank, world=2)
            assert r.returncode == -9, r.stderr
            ids += _records(tmp_path / f"w{rank}.jsonl")[0]
        r = _run(agent, tmp_path, "w-new", workers=3, load=str(tmp_path / "w0.state"), whole=True, rank=0,
                 world=1, batch=2 * BATCH)
        assert r.returncode == 0, r.stderr
        after, firsts = _records(tmp_path / "w-new.jsonl")
        assert len(after) == EPOCHS * SYNTH_FILES - 7 * 2 * BATCH
        assert sorted(ids + after) == sorted(list(range(SYNTH_FILES)) * EPOCHS)
        assert firsts[0] < 1.0


def test_a_mixture_goes_on_at_the_committed_global_step_with_another_world_size(synth_root, tmp_path):
    """A [[mixture]] (the synthetic files twice, as two datasets, weights
    0.75/0.25, upsampled to 600 samples an epoch) read by two ranks of two
    workers each (batches of 10), both killed right after saving at global
    step 7 of epoch 0, then relaunched as one rank of three workers
    (batches of 20, the same global batch) from rank 0's state: it goes on
    at global step 7 and delivers exactly the remaining global steps of an
    uninterrupted one-rank run, every sample's bytes its source's."""
    n = SYNTH_FILES
    extra = (
        f'[[dataset]]\nname = "again"\nroot = "{synth_root}"\n'
        '[[mixture]]\nname = "mix"\nepoch_samples = 600\n'
        '[[mixture.source]]\ndataset = "synth"\nweight = 0.75\n'
        '[[mixture.source]]\ndataset = "again"\nweight = 0.25\n'
    )
    mix = dict(dataset="mix", ids_mod=n)
    with LocalAgent({"synth": synth_root}, extra_config=extra) as agent:
        r = _run(agent, tmp_path, "straight", workers=0, world=1, batch=2 * BATCH, **mix)
        assert r.returncode == 0, r.stderr
        straight, _ = _records(tmp_path / "straight.jsonl")
        assert len(straight) == EPOCHS * 600
        assert any(i >= n for i in straight) and any(i < n for i in straight)
        before = []
        for rank in (0, 1):
            r = _run(agent, tmp_path, f"m{rank}", workers=2, kill_at=7, rank=rank, world=2, **mix)
            assert r.returncode == -9, r.stderr
            before += _records(tmp_path / f"m{rank}.jsonl")[0]
        r = _run(agent, tmp_path, "m-new", workers=3, load=str(tmp_path / "m0.state"), whole=True, rank=0,
                 world=1, batch=2 * BATCH, **mix)
        assert r.returncode == 0, r.stderr
        after, firsts = _records(tmp_path / "m-new.jsonl")
    done = 7 * 2 * BATCH

    def steps(ids):
        return Counter(tuple(sorted(ids[i:i + 2 * BATCH])) for i in range(0, len(ids), 2 * BATCH))

    # Each batch after the relaunch is one of the plan's remaining global
    # steps, each of them once (the DataLoader takes its three workers'
    # batches round robin, so their order is the plan's only up to that).
    assert steps(after) == steps(straight[done:]), "the rest of the one-rank plan, step by step"
    assert sorted(before) == sorted(straight[:done]), "the two ranks' first 7 global steps"
    assert firsts[0] < 1.0


def test_a_replaced_object_refuses_the_resume_naming_it(tmp_path):
    root = tmp_path / "data"
    make_synth(root, 120, 4, mean_size=4096, seed=2)
    from granary.torch import GranaryDataset
    from torchdata.stateful_dataloader import StatefulDataLoader

    def dataset(**kw):
        return GranaryDataset("synth", agent.socket, batch_size=8, seed=1, with_ids=True, batches=True, **kw)

    with LocalAgent({"synth": root}) as agent:
        loader = StatefulDataLoader(dataset(), batch_size=None, num_workers=2)
        it = iter(loader)
        for _ in range(3):
            next(it)
        state = loader.state_dict()
        del it, loader
        victim = sorted(p for p in root.rglob("*") if p.is_file())[5]
        data = bytearray(victim.read_bytes())
        data[-1] ^= 0xFF
        time.sleep(0.01)
        victim.write_bytes(bytes(data))  # same size, new mtime
        agent.stop()
        agent.start()  # a restarted agent catalogs the dataset again
        loader = StatefulDataLoader(dataset(), batch_size=None, num_workers=2)
        loader.load_state_dict(state)
        with pytest.raises(Exception) as e:
            next(iter(loader))
        msg = str(e.value)
        print(f"[checkpoint] refused: {msg[:300]}")
        assert "changed since the session state was saved" in msg, msg
        assert victim.name in msg, msg
        # Accepted explicitly, it goes on.
        loader = StatefulDataLoader(dataset(accept_changed_dataset=True), batch_size=None, num_workers=2)
        loader.load_state_dict(state)
        n = sum(len(ids) for _xs, _ys, ids in loader)
        assert n == 120 - 3 * 8


def test_session_state_bytes_reopen_at_the_next_batch(agent):
    """The C API's state through Python: taken after 5 batches, opened in a
    fresh session, the rest of the plan follows."""
    with granary.open_session("synth", agent.socket, batch_size=16, seed=5, epochs=2) as s:
        plan = [[smp.id for smp in b] for b in s]
    with granary.open_session("synth", agent.socket, batch_size=16, seed=5, epochs=2) as s:
        for _ in range(5):
            s.next_batch().release()
        state = s.state()
    assert len(state) < granary._lib.STATE_MAX
    with granary.open_session(None, agent.socket, state=state) as s:
        rest = [[smp.id for smp in b] for b in s]
    assert rest == plan[5:]
    with pytest.raises(granary.InvalidArgument, match="checksum"):
        bad = bytearray(state)
        bad[20] ^= 1
        granary.open_session(None, agent.socket, state=bytes(bad))


def test_remaining_and_share_cover_the_pass_exactly():
    """The resume arithmetic on its own: any positions of W workers,
    merged and shared among W2, cover the rest of the pass exactly once."""
    rng = random.Random(1)
    for _ in range(300):
        nb, epochs, w = rng.randrange(1, 30), rng.randrange(1, 4), rng.randrange(1, 5)
        total = nb * epochs
        states, done = [], set()
        for wid in range(w):
            per = resume_plan.per_worker(nb, wid, w)
            taken = rng.randrange(0, per * epochs + 1)
            skip = rng.randrange(0, 3) if taken < per * epochs else 0
            done |= {resume_plan.rank_index(nb, wid, w, j) for j in range(taken)}
            states.append({"nb": nb, "runs": [dict(worker=wid, workers=w, first=0, limit=None, taken=taken,
                                                     skip=skip)]})
        left, tail = resume_plan.remaining(states, total)
        w2 = rng.randrange(1, 5)
        covered = []
        for wid in range(w2):
            for r in resume_plan.share(left, tail, total, nb, wid, w2):
                per = resume_plan.per_worker(nb, r["worker"], r["workers"])
                count = r["limit"] if r["limit"] is not None else per * epochs - r["first"]
                covered += [resume_plan.rank_index(nb, r["worker"], r["workers"], r["first"] + i)
                            for i in range(count)]
        assert sorted(covered) == sorted(set(range(total)) - done), (nb, epochs, w, w2)


LIGHTNING_CHILD = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import lightning as L
    from torchdata.stateful_dataloader import StatefulDataLoader
    from granary.torch import GranaryDataset

    sock, out, ckpt, stop_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(1, 1)

        def training_step(self, batch, i):
            _xs, _ys, ids = batch
            with open(out, "a") as f:
                f.write(json.dumps(ids.tolist()) + "\\n")
            if stop_at and self.global_step + 1 == stop_at:
                self.trainer.save_checkpoint(ckpt)
                os._exit(9)
            return self.lin(torch.ones(1, 1)).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            ds = GranaryDataset("synth", sock, batch_size=10, seed=2, with_ids=True, batches=True,
                                collate=lambda xs, ys: (torch.zeros(len(xs)), torch.tensor(ys)))
            return StatefulDataLoader(ds, batch_size=None, num_workers=2)

    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu")
    trainer.fit(Model(), ckpt_path=None if stop_at else ckpt)
    """
)


def test_lightning_checkpoint_mid_epoch_resumes_every_sample_once(synth_root, tmp_path):
    """PyTorch Lightning's fit loop saves the StatefulDataLoader's state in
    its checkpoint: a process that saves one mid-epoch and dies, then a new
    Trainer fitting from it, see every sample of the epoch once."""
    pytest.importorskip("lightning")
    out, ckpt = tmp_path / "ids.jsonl", tmp_path / "mid.ckpt"
    with LocalAgent({"synth": synth_root}) as agent:
        for stop_at in (13, 0):
            rc = _run_in_group([sys.executable, "-c", LIGHTNING_CHILD, str(agent.socket), str(out), str(ckpt),
                                str(stop_at)], tmp_path / "lightning.stderr", timeout=300)
            assert rc == (9 if stop_at else 0), (tmp_path / "lightning.stderr").read_text()[-2000:]
    ids = [i for line in out.read_text().splitlines() for i in json.loads(line)]
    assert sorted(ids) == list(range(SYNTH_FILES)), "every sample of the epoch once across the checkpoint"


def test_a_state_saved_after_the_pass_lets_the_next_epoch_start_afresh(agent):
    """A checkpoint taken once a pass ended, loaded after set_epoch(1):
    the whole of epoch 1 comes (the ended pass does not carry over)."""
    from granary.torch import GranaryDataset
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make(epoch):
        ds = GranaryDataset("synth", agent.socket, batch_size=20, seed=8, with_ids=True, batches=True,
                            collate=lambda xs, ys: (len(xs), ys))
        ds.set_epoch(epoch)
        return StatefulDataLoader(ds, batch_size=None, num_workers=2)

    loader = make(0)
    assert sum(len(ids) for _n, _ys, ids in loader) == SYNTH_FILES
    state = loader.state_dict()
    again = make(1)
    again.load_state_dict(state)
    ids = [i for _n, _ys, batch in again for i in batch.tolist()]
    assert sorted(ids) == list(range(SYNTH_FILES))


def _as_bytes(xs, ys):
    return [bytes(x.numpy()) for x in xs], ys


def _locality_rank(rank: int, world: int, sockets: list, rdv: str, out: str, phase: dict) -> None:
    """One rank of a locality-mode job (its own agent, a gloo process
    group): gathers the view, agrees on the assignment, reads with a
    StatefulDataLoader of ``phase["workers"]`` workers; in the first phase
    it saves the loader's state after ``phase["stop_at"]`` steps and stops,
    in the second it loads rank 0's saved state (the whole loader's) and
    reads the rest of the pass."""
    import torch.distributed as dist
    from torchdata.stateful_dataloader import StatefulDataLoader

    from granary.torch import GranaryDataset, gather_view

    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=world)
    try:
        view = gather_view(sockets[rank], job_id="elastic", epoch=phase["view_epoch"])
        ds = GranaryDataset("synth", sockets[rank], batch_size=phase["batch"], seed=4, epochs=EPOCHS, rank=rank,
                            world_size=world, with_ids=True, batches=True, view=view, assignment="locality",
                            collate=_as_bytes)
        saved = torch.load(phase["load"].format(rank=rank), weights_only=False) if phase.get("load") else None
        if saved is not None and not phase.get("own"):
            ds.load_state_dict(saved)
        mode = ds.prepare(num_workers=phase["workers"])
        loader = StatefulDataLoader(ds, batch_size=None, num_workers=phase["workers"])
        if saved is not None and phase.get("own"):
            loader.load_state_dict(saved)
        ids = []
        for step, (xs, ys, batch_ids) in enumerate(loader):
            for x, y, i in zip(xs, ys, batch_ids.tolist()):
                assert synth.verify(x)[:2] == (i, y)
            assert len(xs) == phase["batch"]
            ids += batch_ids.tolist()
            if step + 1 == phase.get("stop_at"):
                torch.save(loader.state_dict(), f"{out}.state.{rank}")
                break
        with open(f"{out}.{rank}", "w") as f:
            json.dump({"mode": mode, "ids": ids}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("relaunch", ["1rank", "same"])
def test_locality_mode_goes_on_with_another_world_size_and_worker_count(synth_root, tmp_path, relaunch):
    """Locality mode, two ranks on two agents with 2 DataLoader workers
    each (batches of 10), saved after training step 8 of epoch 0;
    relaunched as one rank on one agent (a view without the other node),
    batches of 20, no workers (``1rank``), or as the same job, each rank's
    loader loading its own state (``same``): it goes on at the committed
    global step, in locality mode, and the two together are every sample
    of both epochs once."""
    import torch.multiprocessing as mp

    from test_peers import _session_agents

    with _session_agents(synth_root) as agents:
        sockets = [str(a.socket) for a in agents]
        out = str(tmp_path / "old")
        mp.spawn(_locality_rank, args=(2, sockets, str(tmp_path / "rdv1"), out,
                                       dict(view_epoch=1, batch=BATCH, workers=2, stop_at=8)), nprocs=2)
        old = [json.loads((tmp_path / f"old.{r}").read_text()) for r in range(2)]
        assert [o["mode"] for o in old] == ["locality"] * 2
        assert [len(o["ids"]) for o in old] == [8 * BATCH] * 2
        new = str(tmp_path / "new")
        if relaunch == "1rank":
            world, phase = 1, dict(view_epoch=2, batch=2 * BATCH, workers=0, load=f"{out}.state.0")
        else:
            world, phase = 2, dict(view_epoch=2, batch=BATCH, workers=2, load=out + ".state.{rank}", own=True)
        mp.spawn(_locality_rank, args=(world, sockets, str(tmp_path / "rdv2"), new, phase), nprocs=world)
        after = [json.loads((tmp_path / f"new.{r}").read_text()) for r in range(world)]
        assert [a["mode"] for a in after] == ["locality"] * world
        rest = [i for a in after for i in a["ids"]]
        assert len(rest) == EPOCHS * SYNTH_FILES - 8 * 2 * BATCH
        assert sorted(old[0]["ids"] + old[1]["ids"] + rest) == sorted(list(range(SYNTH_FILES)) * EPOCHS)


def test_the_exact_twin_of_a_locality_state_is_the_state_without_its_digest(agent):
    """``resume_plan.exact_twin`` (the provenance check of a locality-mode
    state): a state made here with a digest inserted, its twin is the
    agent-made state byte for byte (so its CRC-32C is the library's too),
    and it opens."""
    with granary.open_session("synth", agent.socket, batch_size=16, seed=5) as s:
        s.next_batch().release()
        state = s.state()
    assert resume_plan.exact_twin(state) == state
    at = 10 + int.from_bytes(state[8:10], "little") + 37
    assert state[at] == 0
    body = state[:at] + b"\1" + bytes(range(32)) + state[at + 1 : -4]
    with_digest = body + resume_plan._crc32c(body).to_bytes(4, "little")
    assert resume_plan.exact_twin(with_digest) == state
    with granary.open_session(None, agent.socket, state=resume_plan.exact_twin(with_digest)) as s:
        assert s.next_batch().index == 1
    with pytest.raises(ValueError):
        resume_plan.exact_twin(b"GRNYSTv0" + state[8:])
