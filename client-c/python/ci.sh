#!/usr/bin/env bash
# The Python step of scripts/test.sh: installs torch (CPU use of the default
# PyPI wheel), torchvision, torchdata, lightning, numpy, Pillow, pytest and, if it
# installs, DALI;
# builds libgranary and granaryd; installs the `granary` package from this
# checkout; runs its tests; builds the wheel (scripts/wheel.sh) and checks it
# in fresh venvs (scripts/wheel-check.sh). Prints how long each part took.
set -euo pipefail
cd "$(dirname "$0")/../.."
py="${PYTHON:-python3}"
t_start=$SECONDS
lap() { printf '[python] %-34s %4d s\n' "$1" "$(( SECONDS - $2 ))"; }

t=$SECONDS
"$py" -m pip install -q --disable-pip-version-check torch torchvision torchdata lightning numpy Pillow pytest pyarrow datasets wids==0.1.11
lap "pip install torch torchvision ..." "$t"

t=$SECONDS
dali="yes"
if ! "$py" -m pip install -q --disable-pip-version-check nvidia-dali-cuda130; then
    dali="no"
fi
if [ "$dali" = yes ] && ! "$py" -c "import nvidia.dali" 2>/dev/null; then
    dali="no"
fi
lap "pip install nvidia-dali-cuda130" "$t"
if [ "$dali" = no ]; then
    echo "[python] ******** DALI: SKIPPED: nvidia-dali-cuda130 could not be installed or imported here;"
    echo "[python] ******** the DALI pipeline test (tests/test_dali.py) will be reported as skipped."
fi

t=$SECONDS
# The whole workspace, as scripts/test.sh builds it (a no-op there): a
# subset of the packages would resolve other features and compile again.
cargo build --release --workspace --all-targets >/dev/null
lap "cargo build (libgranary, granaryd)" "$t"

t=$SECONDS
# GRANARY_NO_CARGO: bundle the library the workspace build just made; the
# package's own `cargo build -p granary-client` would make the next
# workspace build (the wheel's) compile crates again.
GRANARY_NO_CARGO=1 "$py" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps ./client-c/python
lap "pip install ./client-c/python" "$t"

t=$SECONDS
set +e
# From the repository root, so the tests import the installed package.
"$py" -m pytest client-c/python/tests -v -rs
rc=$?
set -e
lap "pytest" "$t"
if [ "$rc" -eq 5 ]; then
    echo "[python] error: pytest collected no tests" >&2
    exit 1
fi

# The self-contained wheel (issue: install with pip): built, then installed
# into fresh venvs with no cargo on PATH, under CPython 3.11 and under PyPy
# 3.9 (Debian's pypy3, the only Python 3.9 installable here); the package's
# sources are also checked to need no Python newer than 3.9 (vermin).
t=$SECONDS
"$py" -m pip install -q --disable-pip-version-check vermin
vermin -q -t=3.9- --no-tips --violations --eval-annotations client-c/python/granary
wheel="$(GRANARY_WHEEL_CARGO_ARGS="--workspace --all-targets" \
    scripts/wheel.sh "${CARGO_TARGET_DIR:-target}/wheel" | tail -n 1)"
scripts/wheel-check.sh "$wheel" "$py"
if command -v pypy3 >/dev/null 2>&1; then
    scripts/wheel-check.sh "$wheel" pypy3
else
    echo "[python] ******** the wheel under PyPy 3.9: SKIPPED: pypy3 is not installed"
fi
lap "wheel: build and check" "$t"
lap "python step in all" "$t_start"
exit "$rc"
