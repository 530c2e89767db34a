"""Build step of the `granary` package: bundles libgranary.so.

`pip install ./client-c/python` (from the repository root) runs this. The
package is pure Python over libgranary's C ABI (ctypes); what it needs at
run time is libgranary.so, which this step puts inside the package:

* `GRANARY_LIB=/path/to/libgranary.so` at install time: that file is bundled;
* otherwise, from a Granary checkout with cargo on PATH:
  `cargo build --release -p granary-client` is run in the checkout (a no-op
  when the library is up to date) and target/release/libgranary.so is bundled;
* otherwise (no checkout, no cargo, or `GRANARY_NO_CARGO=1`) nothing is
  bundled and the package looks for the library at run time (GRANARY_LIB,
  the checkout's target/release, the linker's path).

`GRANARY_WHEEL=1` (set by scripts/wheel.sh) builds the self-contained wheel:
GRANARY_LIB and GRANARY_BIN_DIR are required, `granaryd`, `granary` and the
C example loader `consume` (which `granary demo` runs) are copied from
GRANARY_BIN_DIR into granary/bin, and nothing of the checkout is recorded.

The wheel is tagged py3-none-<platform>: the package reaches libgranary
through ctypes, so one wheel serves every CPython (and PyPy) from 3.9 on.

The checkout's location is recorded in granary/_build.py, so `granary.agent`
finds the checkout's granaryd too.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def _log(msg):
    print(f"granary setup: {msg}", file=sys.stderr)


def target_dir():
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    return target if target.is_absolute() else REPO / target


WHEEL = os.environ.get("GRANARY_WHEEL") == "1"
# What a self-contained wheel carries in granary/bin.
BUNDLED_BINARIES = ("granaryd", "granary", "consume")


def find_or_build_library():
    env = os.environ.get("GRANARY_LIB")
    if WHEEL and not env:
        raise SystemExit("granary setup: GRANARY_WHEEL=1 needs GRANARY_LIB")
    if env:
        if not Path(env).is_file():
            raise SystemExit(f"granary setup: GRANARY_LIB={env} is not a file")
        return Path(env)
    if not (REPO / "Cargo.toml").is_file() or not (REPO / "client-c").is_dir():
        _log("not inside a Granary checkout; libgranary.so is not bundled")
        return None
    lib = target_dir() / "release" / "libgranary.so"
    cargo = shutil.which("cargo")
    if os.environ.get("GRANARY_NO_CARGO") or cargo is None:
        if lib.is_file():
            return lib
        _log("cargo not found (or GRANARY_NO_CARGO set) and no built library; not bundled")
        return None
    _log(f"cargo build --release -p granary-client (in {REPO})")
    subprocess.run([cargo, "build", "--release", "-p", "granary-client"], cwd=REPO, check=True)
    return lib


class BuildPy(build_py):
    def run(self):
        super().run()
        out = Path(self.build_lib) / "granary"
        out.mkdir(parents=True, exist_ok=True)
        lib = find_or_build_library()
        if lib is not None:
            shutil.copy2(lib, out / "libgranary.so")
            _log(f"bundled {lib}")
        if WHEEL:
            bundle_binaries(out / "bin")
        checkout = (REPO / "Cargo.toml").is_file() and not WHEEL
        (out / "_build.py").write_text(
            '"""Written by setup.py at install time."""\n'
            f"REPO_ROOT = {str(REPO) if checkout else ''!r}\n"
            f"TARGET_DIR = {str(target_dir()) if checkout else ''!r}\n"
            f"BUNDLED_FROM = {str(lib) if lib else ''!r}\n"
        )


def bundle_binaries(dest):
    src = os.environ.get("GRANARY_BIN_DIR")
    if not src:
        raise SystemExit("granary setup: GRANARY_WHEEL=1 needs GRANARY_BIN_DIR")
    dest.mkdir(parents=True, exist_ok=True)
    for name in BUNDLED_BINARIES:
        path = Path(src) / name
        if not path.is_file():
            raise SystemExit(f"granary setup: {path} is missing (scripts/wheel.sh builds it)")
        shutil.copy2(path, dest / name)
        os.chmod(dest / name, 0o755)
        _log(f"bundled {path}")


class BdistWheel(bdist_wheel):
    """One wheel for every Python 3: the native parts are loaded with ctypes
    or run as programs, never imported as extension modules."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


class BinaryDistribution(Distribution):
    """The wheel carries a native library: tag it for this platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPy, "bdist_wheel": BdistWheel}, distclass=BinaryDistribution)
