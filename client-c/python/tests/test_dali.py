"""examples/dali_pipeline.py: DALI's fn.external_source fed by Granary
batches, run as a CPU pipeline (no GPU is needed). Skipped, loudly, when
nvidia-dali is not installed."""

import importlib.util
import sys

import pytest

from conftest import JPEG_CLASSES, JPEG_FILES, REPO

try:
    import nvidia.dali  # noqa: F401

    DALI = None
except ImportError as e:  # pragma: no cover - depends on the machine
    DALI = f"nvidia-dali is not installed ({e})"


def _example():
    path = REPO / "examples" / "dali_pipeline.py"
    spec = importlib.util.spec_from_file_location("dali_pipeline", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["dali_pipeline"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(DALI is not None, reason=f"SKIPPED: DALI pipeline test: {DALI}")
@pytest.mark.parametrize("no_copy", [True, False], ids=["no_copy", "copy"])
def test_dali_cpu_pipeline_over_granary_batches(agent, no_copy):
    ex = _example()
    source = ex.GranarySource("jpeg", agent.socket, batch_size=32, seed=3)
    pipe = ex.build_pipeline(source, batch_size=32, device="cpu", size=32, num_threads=2, no_copy=no_copy)
    pipe.build()
    for epoch in range(2):
        start = len(source.ids)
        n, labels, shape = ex.run_epoch(pipe)
        ids = source.ids[start:]
        assert n == JPEG_FILES and shape == (3, 32, 32)
        assert sorted(ids) == list(range(JPEG_FILES)), f"epoch {epoch}"
        assert labels == [i * JPEG_CLASSES // JPEG_FILES for i in ids]
    # Two epochs, two orders.
    assert source.ids[:JPEG_FILES] != source.ids[JPEG_FILES:]
    source.close()
