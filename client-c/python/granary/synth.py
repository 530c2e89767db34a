"""The synthetic dataset format of ``tools/src/synth.rs``, in Python.

Every sample can be checked from its own bytes: a 32-byte header (magic
``GRNSYNTH``, file id, class, total length, header checksum), a stream key,
then SplitMix64 outputs seeded from the key and the header checksum. See the
module documentation of ``tools/src/synth.rs`` for the table.

:func:`verify` checks a sample and returns ``(file_id, class, length)``;
:func:`generate` writes the same tree as the Rust generator
(``class_CCC/img_IIIIIIII.bin``; file ``i`` has sample id ``i`` and label
``class_of(i)`` in the agent's catalog).
"""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path
from typing import Union

MAGIC = b"GRNSYNTH"
HEADER_LEN = 32
MIN_FILE_SIZE = 1024
MAX_FILE_SIZE = 2 << 20
M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
HEADER_HASH_INIT = 0x47524E53594E5448
SIZE_SALT = 0x53495A4553495A45


def mix(z: int) -> int:
    """The SplitMix64 finaliser."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def header_checksum(header: bytes) -> int:
    h = HEADER_HASH_INIT
    for (w,) in struct.iter_unpack("<Q", header[:24]):
        h = mix(h ^ w)
    return h


def stream(state: int, nbytes: int) -> bytes:
    """``nbytes`` of SplitMix64 output from ``state`` (little-endian words,
    the last one cut)."""
    words = (nbytes + 7) // 8
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a test dependency
        out = bytearray()
        s = state
        for _ in range(words):
            s = (s + GAMMA) & M64
            out += struct.pack("<Q", mix(s))
        return bytes(out[:nbytes])
    with np.errstate(over="ignore"):
        k = np.arange(1, words + 1, dtype=np.uint64)
        z = np.uint64(state) + k * np.uint64(GAMMA)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z.astype("<u8").tobytes()[:nbytes]


class VerifyError(ValueError):
    pass


def verify(data) -> tuple[int, int, int]:
    """Checks every byte of one synthetic sample; returns ``(file_id, class, length)``.

    ``data`` is anything with the buffer protocol (bytes, memoryview, a
    numpy array, a :class:`granary.Sample`'s ``data``). Raises
    :class:`VerifyError` naming what is wrong.
    """
    b = memoryview(data).cast("B") if not isinstance(data, (bytes, bytearray)) else memoryview(data)
    if len(b) < HEADER_LEN + 8:
        raise VerifyError(f"sample too short: {len(b)} bytes")
    if bytes(b[:8]) != MAGIC:
        raise VerifyError("bad magic: not a synthetic Granary sample")
    file_id, cls, length, stored = struct.unpack_from("<QIIQ", b, 8)
    expected = header_checksum(bytes(b[:24]))
    if expected != stored:
        raise VerifyError(f"header checksum mismatch: computed {expected:#018x}, stored {stored:#018x}")
    if length != len(b):
        raise VerifyError(f"length mismatch: header says {length} bytes, sample has {len(b)}")
    (key,) = struct.unpack_from("<Q", b, HEADER_LEN)
    body = b[HEADER_LEN + 8 :]
    want = stream(mix(key ^ stored), len(body))
    if body != want:
        at = next(i for i in range(len(body)) if body[i] != want[i])
        raise VerifyError(f"content mismatch at byte {HEADER_LEN + 8 + at}")
    return file_id, cls, length


class Spec:
    """What to generate; the same fields and defaults as ``SynthSpec``."""

    def __init__(self, root: Union[str, Path], num_files: int = 20_000, num_classes: int = 100,
                 mean_size: int = 110_000, sigma: float = 0.5, seed: int = 0):
        self.root = Path(root)
        self.num_files = num_files
        self.num_classes = num_classes
        self.mean_size = mean_size
        self.sigma = sigma
        self.seed = seed
        if num_files < 1 or not 1 <= num_classes <= num_files:
            raise ValueError("need 1 <= num_classes <= num_files")
        if not MIN_FILE_SIZE <= mean_size <= MAX_FILE_SIZE:
            raise ValueError(f"mean_size must be in {MIN_FILE_SIZE}..={MAX_FILE_SIZE}")

    def class_of(self, i: int) -> int:
        return i * self.num_classes // self.num_files

    def size_of(self, i: int) -> int:
        s = mix(self.seed ^ SIZE_SALT) ^ mix((i + GAMMA) & M64)
        s = (s + GAMMA) & M64
        a = mix(s)
        s = (s + GAMMA) & M64
        c = mix(s)
        u1 = ((a >> 11) + 1) / float(1 << 53)
        u2 = (c >> 11) / float(1 << 53)
        z = math.sqrt(-2.0 * math.log(u1)) * math.cos(math.tau * u2)
        mu = math.log(max(self.mean_size, 1)) - self.sigma * self.sigma / 2.0
        x = math.floor(math.exp(mu + self.sigma * z) + 0.5)
        return min(max(int(x), MIN_FILE_SIZE), MAX_FILE_SIZE)

    def relative_path(self, i: int) -> str:
        cw = max(len(str(max(self.num_classes - 1, 0))), 3)
        fw = max(len(str(max(self.num_files - 1, 0))), 8)
        return f"class_{self.class_of(i):0{cw}d}/img_{i:0{fw}d}.bin"

    def render(self, i: int) -> bytes:
        length = self.size_of(i)
        key = mix(self.seed ^ mix((i + GAMMA) & M64))
        head = MAGIC + struct.pack("<QII", i, self.class_of(i), length)
        h = header_checksum(head)
        head += struct.pack("<QQ", h, key)
        return head + stream(mix(key ^ h), length - len(head))


def generate(spec: Spec) -> int:
    """Writes the dataset (each file under a temporary name, then renamed);
    returns the total number of bytes."""
    total = 0
    for i in range(spec.num_files):
        path = spec.root / spec.relative_path(i)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = spec.render(i)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        total += len(data)
    return total
