#!/usr/bin/env bash
# Installs a wheel from scripts/wheel.sh into a fresh virtual environment
# with no cargo on PATH and nothing of the checkout reachable (run from a
# temporary folder, no CARGO_TARGET_DIR, GRANARY_LIB or GRANARYD), then:
#   * `granaryd --version` and `granary --version` print the commit
#     (GRANARY_COMMIT when set);
#   * `granary demo` on a fresh synthetic dataset verifies every byte;
#   * `python -m granary.selftest` (two ranks, every byte, resume from state);
#   * the library, granaryd and the demo's loader are the wheel's own.
#
#   scripts/wheel-check.sh WHEEL [PYTHON]
set -euo pipefail
wheel="$(realpath "$1")"
py="${2:-python3}"
log() { printf '[wheel-check] %s\n' "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"

log "fresh venv with $("$py" --version 2>&1)"
"$py" -m venv venv
venv/bin/python -m pip install -q --disable-pip-version-check --no-index "$wheel"

# Only the venv and the system's own folders: no ~/.cargo/bin.
export PATH="$work/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
unset CARGO_TARGET_DIR GRANARY_LIB GRANARYD GRANARY_SOCKET PYTHONPATH
if command -v cargo >/dev/null 2>&1; then
    fail "cargo is on PATH at $(command -v cargo): the check would not prove the wheel stands alone"
fi

for cmd in granaryd granary; do
    v="$("$cmd" --version)"
    log "$cmd --version: $v"
    case "$v" in
        *"(commit unknown"*) fail "$cmd was built without its commit" ;;
        *"(commit ${GRANARY_COMMIT:-}"*) ;;
        *) fail "$cmd --version does not name commit ${GRANARY_COMMIT:-}" ;;
    esac
done

site="$(venv/bin/python -c 'import granary, os; print(os.path.dirname(granary.__file__))')"
lib="$(venv/bin/python -c 'import granary; print(granary.library_path)')"
case "$lib" in "$site"/*) ;; *) fail "libgranary loaded from $lib, not from the wheel ($site)" ;; esac
found="$(venv/bin/python -c 'from granary.agent import find_granaryd; print(find_granaryd())')"
[ "$found" = "$site/bin/granaryd" ] || fail "granary.agent found $found, not the wheel's granaryd"

log "granary demo"
granary demo --dir "$work/demo" --files "${WHEEL_CHECK_FILES:-3000}" --epochs 2 | tee demo.log
grep -q "^verification: OK, every byte" demo.log || fail "granary demo did not verify every byte"

log "python -m granary.selftest"
venv/bin/python -m granary.selftest
log "passed: $(basename "$wheel") in $("$py" --version 2>&1)"
