"""A `wids` shard index (`widsindex create`) beside WebDataset shards: the
dataset's sample i is `wids.ShardListDataset`'s item i, byte for byte,
even where the index's order is not the listing's; a stale index fails the
dataset with the shard named (docs/formats.md, "wids shard indexes")."""

import json
import subprocess
import sys

import pytest

import granary
from granary.agent import LocalAgent
from test_fields import write_shards

wids = pytest.importorskip("wids", reason="the wids package is installed by client-c/python/ci.sh")


def widsindex(shards):
    """Runs the real `widsindex create` over the shards, in their folder."""
    names = sorted(p.name for p in shards.glob("*.tar"))
    code = "import sys; from wids.wids_index import main; sys.argv[0] = 'widsindex'; main()"
    subprocess.run(
        [sys.executable, "-c", code, "create", "--name", "t", "--output", "shardindex.json", *names],
        cwd=shards,
        check=True,
        capture_output=True,
    )
    return json.loads((shards / "shardindex.json").read_text())


def by_id(sock, name):
    out = {}
    with granary.open_session(name, sock, batch_size=16, seed=7, epochs=1) as s:
        for batch in s:
            for smp in batch:
                f = smp.fields()
                out[smp.id] = (f["bin"].tobytes(), f["cls"].tobytes())
    return out


def test_sample_i_is_the_item_i_of_wids(synth_root, tmp_path):
    shards = tmp_path / "wds"
    n = write_shards(synth_root, shards, per_shard=50)
    index = widsindex(shards)
    assert sum(s["nsamples"] for s in index["shardlist"]) == n
    # Not the listing's order, and one shard left out: the index decides.
    index["shardlist"].reverse()
    dropped = index["shardlist"].pop()
    (shards / "shardindex.json").write_text(json.dumps(index))
    ds = wids.ShardListDataset(str(shards / "shardindex.json"), cache_dir=str(tmp_path / "cache"), transformations=[])
    assert len(ds) == n - dropped["nsamples"]

    extra = f'[[dataset]]\nname = "wds"\nroot = "{shards}"\nformat = "webdataset"\n'
    with LocalAgent({"synth": synth_root}, extra_config=extra) as a:
        got = by_id(a.socket, "wds")
    assert sorted(got) == list(range(len(ds)))
    for i in range(len(ds)):
        item = ds[i]
        assert got[i] == (item[".bin"].getvalue(), item[".cls"].getvalue()), f"sample {i}"


def test_a_stale_index_fails_the_dataset_naming_the_shard(synth_root, tmp_path):
    shards = tmp_path / "wds"
    write_shards(synth_root, shards, per_shard=50)
    index = widsindex(shards)
    index["shardlist"][1]["nsamples"] += 1
    (shards / "shardindex.json").write_text(json.dumps(index))
    extra = f'[[dataset]]\nname = "wds"\nroot = "{shards}"\nformat = "webdataset"\n'
    with pytest.raises(RuntimeError) as e:
        with LocalAgent({"synth": synth_root}, extra_config=extra):
            pass
    shard = index["shardlist"][1]["url"]
    assert shard in str(e.value) and "the index is stale" in str(e.value), str(e.value)
