"""A [[mixture]] opened by name from Python: a files dataset and a
WebDataset shard set with weights 0.75/0.25; every batch of 16 takes 12 and
4 of them, each sample's bytes are its dataset's."""

import granary
from granary.agent import LocalAgent

from test_fields import write_shards


def batches(sock, name, epochs=1):
    with granary.open_session(name, sock, batch_size=16, seed=5, epochs=epochs) as s:
        return [[(smp.id, smp.tobytes()) for smp in batch] for batch in s]


def test_a_mixture_opens_by_name_with_exact_batches(synth_root, tmp_path):
    shards = tmp_path / "wds"
    n = write_shards(synth_root, shards)
    extra = (
        f'[[dataset]]\nname = "wds"\nroot = "{shards}"\nformat = "webdataset"\n'
        '[[mixture]]\nname = "mix"\nepoch_samples = 160\n'
        '[[mixture.source]]\ndataset = "synth"\nweight = 0.75\n'
        '[[mixture.source]]\ndataset = "wds"\nweight = 0.25\n'
    )
    with LocalAgent({"synth": synth_root}, extra_config=extra) as a:
        files = dict(x for b in batches(a.socket, "synth") for x in b)
        wds = dict(x for b in batches(a.socket, "wds") for x in b)
        assert len(files) == n == len(wds)
        mix = batches(a.socket, "mix", epochs=2)
        assert mix == batches(a.socket, "mix", epochs=2)
    assert len(mix) == 20
    for batch in mix:
        own = [(i, b) for i, b in batch if i < n]
        other = [(i - n, b) for i, b in batch if i >= n]
        assert (len(own), len(other)) == (12, 4)
        assert all(files[i] == b for i, b in own)
        assert all(wds[i] == b for i, b in other)
