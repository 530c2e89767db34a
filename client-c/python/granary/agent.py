"""Running a private ``granaryd`` for tests, examples and notebooks.

A node's agent normally runs as a systemd service (docs/operations.md).
:class:`LocalAgent` starts one as a child process instead: it writes a
configuration serving the given datasets on a private socket, starts
``granaryd run --config FILE``, waits for the socket, and stops the agent
(SIGTERM, then SIGKILL) when the ``with`` block ends, removing the files
that keep its arena for a warm restart (``stop()``/``start()`` inside the
block restart it warm)::

    from granary.agent import LocalAgent
    with LocalAgent({"train": "/data/train"}) as agent:
        ds = GranaryDataset("train", socket=agent.socket)

``granaryd`` is looked for in ``$GRANARYD``, in ``bin/`` beside the libgranary
that was loaded (where a wheel bundles it), next to that libgranary, in the checkout's Cargo target directory (``target/release``, or
the ``CARGO_TARGET_DIR`` in force at install or run time), then on ``PATH``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Mapping, Optional, Union

from . import _lib

MiB = 1 << 20


def find_granaryd() -> str:
    env = os.environ.get("GRANARYD")
    if env:
        return env
    candidates = [Path(_lib.path).resolve().parent / "bin" / "granaryd"]
    candidates += [Path(_lib.path).resolve().parent / "granaryd"]
    candidates += [d / "granaryd" for d in _lib.release_dirs()]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which("granaryd")
    if found:
        return found
    raise FileNotFoundError(
        "granaryd not found: build it (`cargo build --release -p granary-agent`) "
        "or set GRANARYD to its path; looked in "
        + ", ".join(str(c) for c in candidates)
        + " and PATH"
    )


def _dir_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            try:
                total += os.stat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def arena_size_for(*roots: Union[str, Path]) -> int:
    """An arena size (bytes) that holds every file under ``roots`` with room
    to spare: at least 64 MiB, a multiple of 2 MiB."""
    total = sum(_dir_bytes(Path(r)) for r in roots)
    size = total * 3 // 2 + 48 * MiB
    size = max(size, 64 * MiB)
    return (size + 2 * MiB - 1) // (2 * MiB) * (2 * MiB)


class LocalAgent:
    """A ``granaryd`` child process serving ``datasets`` (name -> root folder);
    ``prepare`` maps a dataset name to the body of its ``[dataset.prepare]``
    table (e.g. ``"resize = [224, 224]"``)."""

    def __init__(
        self,
        datasets: Mapping[str, Union[str, Path]],
        *,
        workdir: Optional[Union[str, Path]] = None,
        arena_size: Optional[int] = None,
        max_inflight_reads: int = 32,
        extra_config: str = "",
        prepare: Optional[Mapping[str, str]] = None,
        granaryd: Optional[str] = None,
        log: Optional[Union[str, Path]] = None,
        start_timeout: float = 60.0,
    ):
        if not datasets:
            raise ValueError("LocalAgent needs at least one dataset")
        self.datasets = {k: Path(v).resolve() for k, v in datasets.items()}
        self._tmp = None
        if workdir is None:
            # Short path: a socket path has at most 107 bytes.
            self._tmp = tempfile.TemporaryDirectory(prefix="granary-")
            workdir = self._tmp.name
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.socket = str(self.workdir / "granary.sock")
        self.config_path = self.workdir / "granaryd.toml"
        self.log_path = Path(log) if log else self.workdir / "granaryd.log"
        size = arena_size or arena_size_for(*self.datasets.values())
        size = max(size, max_inflight_reads * MiB, 64 * MiB)
        size = (size + 2 * MiB - 1) // (2 * MiB) * (2 * MiB)
        self.arena_size = size
        text = (
            f'[arena]\nsize = {size}\nhugepages = "off"\n\n'
            f'[socket]\npath = "{self.socket}"\n\n'
            f"[prefetch]\nmax_inflight_reads = {max_inflight_reads}\n\n"
            f'[metrics]\naddress = ""\n\n'
        )
        text += extra_config
        for name, root in self.datasets.items():
            text += f'\n[[dataset]]\nname = "{name}"\nroot = "{root}"\n'
            if prepare and name in prepare:
                text += f"[dataset.prepare]\n{prepare[name]}\n"
        self.config_path.write_text(text)
        self.granaryd = granaryd or find_granaryd()
        self.start_timeout = start_timeout
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "LocalAgent":
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.granaryd, "run", "--config", str(self.config_path)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + self.start_timeout
        while not self._accepting():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"granaryd exited with {self.proc.returncode} before opening its socket; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"granaryd did not open {self.socket} within {self.start_timeout} s")
            time.sleep(0.02)
        return self

    def _accepting(self) -> bool:
        # The socket file appears at bind(), a moment before listen().
        if not os.path.exists(self.socket):
            return False
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            probe.connect(self.socket)
            return True
        except OSError:
            return False
        finally:
            probe.close()

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """Stops the agent abruptly (SIGKILL), as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """Stops the agent (SIGTERM, then SIGKILL after ``timeout``)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None

    def warm_files(self) -> list:
        """The files that keep this agent's arena across its restarts
        (docs/reliability.md, "Warm restart"): the arena, its index and
        journal under ``/dev/shm`` (and an arena in a hugetlbfs mount)."""
        import hashlib

        key = hashlib.sha256(os.path.abspath(self.socket).encode()).hexdigest()[:16]
        stem = f"granary-{os.geteuid()}-{key}"
        dirs = ["/dev/shm"]
        try:
            with open("/proc/mounts") as mounts:
                dirs += [line.split()[1] for line in mounts if len(line.split()) > 2 and line.split()[2] == "hugetlbfs"]
        except OSError:
            pass
        files = [Path("/dev/shm") / f"{stem}.index", Path("/dev/shm") / f"{stem}.journal"]
        return files + [Path(d) / f"{stem}.arena" for d in dirs]

    def remove_warm_files(self) -> None:
        """Removes :meth:`warm_files` (the agent must be stopped): the next
        start is cold, and the memory they hold is freed."""
        for f in self.warm_files():
            try:
                f.unlink()
            except OSError:
                pass

    def __enter__(self) -> "LocalAgent":
        return self.start()

    def __exit__(self, *exc) -> None:
        # stop() alone keeps the arena for a warm restart; leaving the
        # block frees it.
        self.stop()
        self.remove_warm_files()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
