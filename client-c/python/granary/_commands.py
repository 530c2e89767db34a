"""The ``granaryd`` and ``granary`` console commands of the package.

A wheel built by ``scripts/wheel.sh`` carries the two binaries (and the C
example loader ``consume`` that ``granary demo`` runs) in ``granary/bin``;
the console commands replace themselves with them (``execv``), so signals,
exit codes and standard streams are the binary's own. Installed from a
checkout instead, they run the checkout's built binaries.
"""

import os
import sys
from pathlib import Path
from typing import List, NoReturn

from . import _lib


def bundled_dir() -> Path:
    """``granary/bin`` inside the installed package."""
    return Path(__file__).resolve().parent / "bin"


def candidates(name: str) -> List[Path]:
    """Where the binary ``name`` is looked for, in order: the package's own
    ``bin``, then the release folders of the checkout it was installed from."""
    return [bundled_dir() / name] + [d / name for d in _lib.release_dirs()]


def find(name: str) -> str:
    """The path of the binary ``name``; raises ``FileNotFoundError``."""
    tried = candidates(name)
    for c in tried:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    raise FileNotFoundError(
        f"{name} is not bundled with this granary package and no built one was found "
        f"(looked in {', '.join(str(c) for c in tried)}); install the wheel from "
        "scripts/wheel.sh or build the checkout (`cargo build --release --workspace --bins`)"
    )


def _exec(name: str) -> NoReturn:
    try:
        path = find(name)
    except FileNotFoundError as e:
        print(f"{name}: {e}", file=sys.stderr)
        sys.exit(127)
    os.execv(path, [path] + sys.argv[1:])


def granaryd() -> NoReturn:
    """The ``granaryd`` console command."""
    _exec("granaryd")


def granary() -> NoReturn:
    """The ``granary`` console command."""
    _exec("granary")
