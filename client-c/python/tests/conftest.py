"""Fixtures: small generated datasets and a private granaryd serving them.

The agent is `granaryd` from the checkout's target/release (or $GRANARYD);
scripts/test.sh builds it before running these tests.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

import granary
from granary.agent import LocalAgent
from granary.make_dataset import make_jpeg, make_synth

REPO = Path(__file__).resolve().parents[3]

# 400 samples: a multiple of 2 ranks x 2 workers, so an epoch has no padding.
SYNTH_FILES = 400
SYNTH_CLASSES = 10
JPEG_FILES = 120
JPEG_CLASSES = 4


def planner_reference():
    """agent/tests/planner_reference.py: the planner's order in Python."""
    path = REPO / "agent" / "tests" / "planner_reference.py"
    spec = importlib.util.spec_from_file_location("planner_reference", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["planner_reference"] = mod
    spec.loader.exec_module(mod)
    return mod


def format_table(name, root, fmt, keys=""):
    """A ``[[dataset]]`` table serving ``root`` as dataset ``name`` in
    ``format = fmt``, then the lines ``keys``."""
    return f'[[dataset]]\nname = "{name}"\nroot = "{root}"\nformat = "{fmt}"\n{keys}'


def read_epoch(sock, name):
    """One epoch of dataset ``name`` (batches of 16, seed 3) from the agent
    at ``sock``: ``{sample id: (bytes, label)}``."""
    seen = {}
    with granary.open_session(name, sock, batch_size=16, seed=3, epochs=1) as s:
        for batch in s:
            for smp in batch:
                seen[smp.id] = (smp.tobytes(), smp.label)
    return seen


@pytest.fixture(scope="session")
def synth_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth")
    make_synth(root, SYNTH_FILES, SYNTH_CLASSES, mean_size=8192, seed=5)
    return root


@pytest.fixture(scope="session")
def jpeg_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("jpeg")
    make_jpeg(root, JPEG_FILES, JPEG_CLASSES, size=32, seed=1)
    return root


@pytest.fixture(scope="session")
def agent(synth_root, jpeg_root):
    with LocalAgent({"synth": synth_root, "jpeg": jpeg_root}) as a:
        yield a
        assert a.running, f"granaryd died during the tests:\n{a.log_tail()}"
        assert any(f.exists() for f in a.warm_files()), "the agent keeps its arena in a file (warm restart)"
    left = [str(f) for f in a.warm_files() if f.exists()]
    assert not left, f"LocalAgent left its warm-restart files behind: {left}"


@pytest.fixture
def own_agent(synth_root):
    """An agent for one test (one the test may stop)."""
    with LocalAgent({"synth": synth_root}) as a:
        yield a
