#!/usr/bin/env bash
# Checks of the shared-memory contract (granary-shm) beyond `cargo test`:
# loom models, Miri, and short cargo-fuzz smoke runs. docs/testing.md says
# what each proves and how long each takes.
#
# usage: scripts/ci-shm.sh [STEP...]      (default: loom miri fuzz)
#   loom        loom models of the ring and of header publication
#   miri        Miri over the ring, validation, lease and segment unit tests
#   miri-full   Miri over every unit test of the crate (before a release)
#   fuzz        each cargo-fuzz target for FUZZ_SECONDS (default 30), after
#               its regression inputs (scripts/fuzz.sh)
#
# Environment:
#   LOOM_MAX_PREEMPTIONS    loom's preemption bound (default 4 here)
#   FUZZ_SECONDS            seconds per fuzz target (default 30)
#   GRANARY_REQUIRE_NIGHTLY 1: fail instead of skipping when no nightly
#                           toolchain (Miri, cargo-fuzz) can be had
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_TARGETS=(validate handshake)
# Unit-test name filters for the CI Miri run: the modules whose logic runs
# on heap memory (tests needing memfd, mmap, futex or sockets are gated off
# under Miri in their modules).
MIRI_FILTERS=(ring:: validate:: lease:: segment:: region:: layout:: error::)

CI_NAME=ci-shm
# shellcheck source=scripts/ci-steps.sh
. scripts/ci-steps.sh

# True when a nightly toolchain is usable; tries to add the components named.
have_nightly() {
    if ! rustup run nightly rustc --version >/dev/null 2>&1; then
        log "ci-shm: no nightly toolchain; trying to install it"
        rustup toolchain install nightly --profile minimal >/dev/null 2>&1 || return 1
    fi
    if [ "$#" -gt 0 ]; then
        rustup component add --toolchain nightly "$@" >/dev/null 2>&1 || return 1
    fi
    return 0
}

# Skips (or fails, with GRANARY_REQUIRE_NIGHTLY=1) a step needing nightly.
no_nightly() {
    if [ "${GRANARY_REQUIRE_NIGHTLY:-0}" = 1 ]; then
        log "ci-shm: $1 needs a nightly toolchain and none could be had"
        return 1
    fi
    log "ci-shm: SKIPPED $1: no nightly toolchain could be had (set GRANARY_REQUIRE_NIGHTLY=1 to fail)"
}

loom_models() {
    LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-4}" \
        cargo test --release -p granary-shm --features loom --test loom
}

miri_tests() {
    have_nightly miri rust-src || { no_nightly miri; return; }
    cargo +nightly miri setup
    cargo +nightly miri test -p granary-shm --lib -- "${MIRI_FILTERS[@]}"
}

miri_full() {
    have_nightly miri rust-src || { no_nightly miri-full; return; }
    cargo +nightly miri setup
    # proptest's failure persistence asks for the working directory.
    MIRIFLAGS="${MIRIFLAGS:-} -Zmiri-disable-isolation" \
        cargo +nightly miri test -p granary-shm --lib
}

fuzz_smoke() {
    have_nightly || { no_nightly fuzz; return; }
    FUZZ_SECONDS="${FUZZ_SECONDS:-30}" scripts/fuzz.sh "${FUZZ_TARGETS[@]/#/shm/}"
}

main() {
    local steps=("$@")
    [ "${#steps[@]}" -gt 0 ] || steps=(loom miri fuzz)
    local s
    for s in "${steps[@]}"; do
        case "$s" in
        loom) step loom loom_models ;;
        miri) step miri miri_tests ;;
        miri-full) step miri-full miri_full ;;
        fuzz) step fuzz fuzz_smoke ;;
        *)
            log "ci-shm: unknown step '$s' (loom, miri, miri-full, fuzz)"
            return 2
            ;;
        esac
    done
}

main "$@"
