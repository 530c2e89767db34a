"""Membership views from the job: two agents on 127.0.0.2 and 127.0.0.3 with
``peers.membership = "session"``, two ranks in a ``torch.distributed`` (gloo)
process group, each on its own agent. ``gather_view`` all-gathers the agents'
identities, hands the view to both agents and waits at a barrier; the
ranks then read an epoch through ``GranaryDataset(view=...)``."""

import contextlib
import socket as pysocket
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import granary  # noqa: E402
from granary.agent import LocalAgent  # noqa: E402
from granary.torch import GranaryDataset, gather_view  # noqa: E402
from conftest import SYNTH_FILES  # noqa: E402

RANKS = 2


def _free_port(ip: str) -> int:
    with pysocket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _session_agents(synth_root):
    """Two agents on 127.0.0.2 and .3 taking the view their loaders hand in;
    stopped on leaving the block."""
    agents = []
    try:
        for n, ip in enumerate(["127.0.0.2", "127.0.0.3"]):
            port = _free_port(ip)
            agents.append(
                LocalAgent(
                    {"synth": synth_root},
                    extra_config=(
                        '[peers]\nmembership = "session"\n'
                        f'node_id = "node{n}"\nlisten = "{ip}:{port}"\nsecret = "c5c64913cdf6c5268fb4da6deb8e09a0d04bcf1ff53244dbd5dd0c9bddaead23"\n\n'
                    ),
                ).start()
            )
        yield agents
    finally:
        for a in agents:
            a.stop()


@contextlib.contextmanager
def _process_group(rank: int, rdv: str):
    """Rank ``rank`` of the job's gloo process group (rendezvous at the
    file ``rdv``); on leaving, a barrier, then the group's teardown."""
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=RANKS)
    try:
        yield
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _rank(rank: int, sockets: list, rdv: str, out: str) -> None:
    with _process_group(rank, rdv):
        view = gather_view(sockets[rank], job_id="pyjob", epoch=7)
        assert view is not None
        ds = GranaryDataset(
            "synth",
            sockets[rank],
            batch_size=16,
            seed=3,
            rank=rank,
            world_size=RANKS,
            with_ids=True,
            batches=True,
            view=view,
        )
        ids = []
        for _, _, batch_ids in DataLoader(ds, batch_size=None, num_workers=0):
            ids.extend(int(i) for i in batch_ids)
        with open(f"{out}.{rank}", "w") as f:
            f.write(" ".join(map(str, ids)))


def test_ranks_gather_a_view_and_read_through_their_peers(synth_root, tmp_path):
    with _session_agents(synth_root) as agents:
        sockets = [a.socket for a in agents]
        with granary.connect(sockets[0]) as c:
            before = c.peer_identity()
        assert before.membership == "session"
        assert before.node_id == "node0"
        assert before.addr.startswith("127.0.0.2:")
        assert (before.job_id, before.members) == ("", 0)

        mp.spawn(_rank, args=(sockets, str(tmp_path / "rdv"), str(tmp_path / "ids")), nprocs=RANKS)

        ids = []
        for r in range(RANKS):
            ids += [int(x) for x in (tmp_path / f"ids.{r}").read_text().split()]
        assert sorted(ids) == list(range(SYNTH_FILES)), "every sample exactly once across the job"
        for n, a in enumerate(agents):
            with granary.connect(a.socket) as c:
                held = c.peer_identity()
            assert (held.job_id, held.view_epoch, held.members) == ("pyjob", 7, RANKS)
            assert "membership view installed" in a.log_tail(100_000), a.log_tail()
        # The agents found each other: a connection came up on both sides.
        deadline = time.monotonic() + 10
        while not all("peer connection up" in a.log_tail(1_000_000) for a in agents):
            assert time.monotonic() < deadline, [a.log_tail() for a in agents]
            time.sleep(0.1)

        # A view encoded here names the same bytes the ranks built.
        with granary.connect(sockets[0]) as c:
            same = granary.encode_view("pyjob", 7, [c.peer_identity()])
        assert isinstance(same, bytes) and len(same) > 16


def test_a_stale_view_is_refused_and_the_session_still_opens(synth_root):
    port = _free_port("127.0.0.2")
    with LocalAgent(
        {"synth": synth_root},
        extra_config=(
            '[peers]\nmembership = "session"\n'
            f'node_id = "solo"\nlisten = "127.0.0.2:{port}"\nsecret = "c5c64913cdf6c5268fb4da6deb8e09a0d04bcf1ff53244dbd5dd0c9bddaead23"\n\n'
        ),
    ) as a:
        with granary.connect(a.socket) as c:
            me = c.peer_identity()
            new = granary.encode_view("job", 5, [me])
            old = granary.encode_view("job", 4, [me])
            assert c.join_view(new) == 5
            with c.open_session("synth", view=old) as s:
                assert s.view_epoch is None
                assert isinstance(s.view_error, granary.InvalidArgument)
                assert "stale" in str(s.view_error)
                assert len(s.next_batch()) > 0
            with pytest.raises(granary.InvalidArgument, match="stale"):
                c.open_session("synth", view=old, view_required=True)
            with c.open_session("synth", view=new) as s:
                assert s.view_epoch == 5 and s.view_error is None


def test_gather_view_is_none_without_a_process_group_or_session_membership(agent):
    assert not dist.is_initialized()
    assert gather_view(agent.socket) is None
    with granary.connect(agent.socket) as c:
        assert c.peer_identity().membership == "off"
        with pytest.raises(granary.InvalidArgument, match="peers are off"):
            c.join_view(granary.encode_view("job", 1, [("n", "h:1", 1)]))


def _locality_rank(rank: int, sockets: list, rdv: str, out: str) -> None:
    import json
    import logging

    seen: list = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logging.getLogger("granary").addHandler(Keep())
    with _process_group(rank, rdv):
        view = gather_view(sockets[rank], job_id="locjob", epoch=9)

        def dataset(**kw):
            args = dict(batch_size=16, seed=3, rank=rank, world_size=RANKS, with_ids=True, batches=True, view=view)
            args.update(kw)
            return GranaryDataset("synth", sockets[rank], **args)

        def steps(ds):
            return [[int(i) for i in ids] for _, _, ids in DataLoader(ds, batch_size=None, num_workers=0)]

        loc = dataset(assignment="locality")
        mode = loc.prepare(num_workers=0)
        loc_steps = steps(loc)
        loc.set_epoch(1)
        mode1 = "locality" if loc._locality is not None else "distributed_sampler"
        exact_steps = steps(dataset())
        odd = dataset(assignment="locality", seed=3 if rank == 0 else 4)
        odd_mode = odd.prepare(num_workers=0)
        with open(f"{out}.{rank}", "w") as f:
            json.dump(
                {"mode": mode, "mode1": mode1, "loc": loc_steps, "exact": exact_steps, "odd": odd_mode, "log": seen},
                f,
            )


def test_locality_mode_keeps_each_global_batch_and_a_differing_rank_means_exact(synth_root, tmp_path):
    import json

    with _session_agents(synth_root) as agents:
        sockets = [a.socket for a in agents]
        mp.spawn(_locality_rank, args=(sockets, str(tmp_path / "rdv"), str(tmp_path / "out")), nprocs=RANKS)
        res = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(RANKS)]
        assert [r["mode"] for r in res] == ["locality"] * RANKS, res[0]["log"]
        assert [r["mode1"] for r in res] == ["locality"] * RANKS
        steps = len(res[0]["exact"])
        assert steps > 3 and all(len(r["loc"]) == steps for r in res)
        moved = 0
        for k in range(steps):
            loc = sorted(i for r in res for i in r["loc"][k])
            exact = sorted(i for r in res for i in r["exact"][k])
            assert loc == exact, f"step {k}: the global batch differs between modes"
            assert len({len(r["loc"][k]) for r in res}) == 1, "every rank gets the same batch size"
            moved += sum(a != b for a, b in zip(res[0]["loc"][k], res[0]["exact"][k]))
        assert moved > 0, "locality mode changed nothing: it cannot have used the directory"
        assert sorted(i for r in res for s in r["loc"] for i in s) == list(range(SYNTH_FILES))
        assert [r["odd"] for r in res] == ["distributed_sampler"] * RANKS
        for r in res:
            assert any("rank 1's inputs" in m and "exact" in m for m in r["log"]), r["log"]
