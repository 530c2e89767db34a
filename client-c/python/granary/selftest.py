"""``python -m granary.selftest``: checks an installed ``granary`` end to end.

Needs nothing but the package (no numpy, no torch, no cargo): it writes a
small synthetic dataset into a temporary folder, starts a private
``granaryd`` on it (the bundled one for a wheel), and reads it through the
C ABI:

* one epoch of two ranks, every byte of every sample verified, each sample
  exactly once across the ranks;
* a session stopped after a few batches and opened again from its
  :meth:`~granary.Session.state`, which continues at the next batch;
* the versions: the library's ABI and ``granaryd --version``.

Prints one line per check and exits with 0 only if all of them passed.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from . import ABI_VERSION, library_path, open_session, synth
from .agent import LocalAgent, find_granaryd
from .make_dataset import make_synth


class SelfTestError(AssertionError):
    pass


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise SelfTestError(what)


def run(files: int = 300, batch_size: int = 16, quiet: bool = False) -> dict:
    """Runs every check; returns figures, raises :class:`SelfTestError`."""
    say = (lambda *a: None) if quiet else (lambda *a: print("selftest:", *a, flush=True))
    granaryd = find_granaryd()
    version = subprocess.run([granaryd, "--version"], capture_output=True, text=True, check=True)
    say(f"{version.stdout.strip()} at {granaryd}; libgranary ABI {ABI_VERSION} at {library_path}")
    with tempfile.TemporaryDirectory(prefix="granary-selftest-") as tmp:
        root = Path(tmp) / "synth"
        make_synth(root, files, classes=5, mean_size=8192, seed=11)
        with LocalAgent({"synth": root}, workdir=Path(tmp) / "agent") as agent:
            seen = {}
            for rank in range(2):
                with open_session("synth", agent.socket, batch_size=batch_size, seed=3,
                                  epochs=1, rank=rank, world_size=2) as s:
                    for batch in s:
                        for sample in batch:
                            file_id, cls, _ = synth.verify(sample.data)
                            _check(sample.label == cls, f"sample {file_id}: label {sample.label}, header {cls}")
                            _check(file_id not in seen, f"sample {file_id} delivered twice")
                            seen[file_id] = rank
            _check(len(seen) == files, f"{len(seen)} of {files} samples delivered")
            say(f"epoch of 2 ranks: {files} samples, every byte verified, each exactly once")

            with open_session("synth", agent.socket, batch_size=batch_size, seed=4, epochs=1) as s:
                first = [[x.id for x in s.next_batch()] for _ in range(3)]
                state = s.state()
                expected = [x.id for x in s.next_batch()]
            with open_session(None, agent.socket, state=state) as s:
                resumed = [x.id for x in s.next_batch()]
            _check(resumed == expected, f"resumed at {resumed[:4]}..., expected {expected[:4]}...")
            _check(all(i not in expected for b in first for i in b), "resume overlaps earlier batches")
            say(f"state after 3 batches ({len(state)} bytes) resumes at batch 4")
    return {"samples": len(seen), "granaryd": version.stdout.strip()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m granary.selftest", description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=300, help="samples in the dataset (default 300)")
    args = p.parse_args(argv)
    try:
        run(files=args.files)
    except SelfTestError as e:
        print(f"selftest: FAILED: {e}", file=sys.stderr)
        return 1
    print("selftest: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
