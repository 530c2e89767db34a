#!/usr/bin/env bash
# Checks of the peer core (granary-peer) beyond `cargo test`: short
# cargo-fuzz runs of the frame decoder and the hello/handshake.
#
# usage: scripts/ci-peer.sh [STEP...]      (default: fuzz)
#   fuzz        each cargo-fuzz target for FUZZ_SECONDS (default 20)
#
# Environment:
#   FUZZ_SECONDS            seconds per fuzz target (default 20)
#   GRANARY_REQUIRE_NIGHTLY 1: fail instead of skipping when no nightly
#                           toolchain or cargo-fuzz can be had
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_TARGETS=(frame handshake)

log() { printf '%s\n' "$*" >&2; }

step() {
    local name=$1
    shift
    local t0=$SECONDS
    log "==> ci-peer: $name"
    "$@"
    log "<== ci-peer: $name done in $((SECONDS - t0)) s"
}

# Skips (or fails, with GRANARY_REQUIRE_NIGHTLY=1) a step that needs a tool.
skipped() {
    if [ "${GRANARY_REQUIRE_NIGHTLY:-0}" = 1 ]; then
        log "ci-peer: $1 needs $2 and none could be had"
        return 1
    fi
    log "ci-peer: SKIPPED $1: $2 could not be had (set GRANARY_REQUIRE_NIGHTLY=1 to fail)"
}

fuzz_smoke() {
    if ! rustup run nightly rustc --version >/dev/null 2>&1; then
        log "ci-peer: no nightly toolchain; trying to install it"
        rustup toolchain install nightly --profile minimal >/dev/null 2>&1 ||
            { skipped fuzz "a nightly toolchain"; return; }
    fi
    if ! cargo fuzz --version >/dev/null 2>&1; then
        cargo install cargo-fuzz --locked >/dev/null 2>&1 ||
            { skipped fuzz "cargo-fuzz"; return; }
    fi
    local t
    for t in "${FUZZ_TARGETS[@]}"; do
        log "ci-peer: fuzzing $t for ${FUZZ_SECONDS:-20} s"
        (
            cd peer/fuzz
            cargo +nightly fuzz run "$t" -- -max_total_time="${FUZZ_SECONDS:-20}"
        )
    done
}

main() {
    local steps=("$@")
    [ "${#steps[@]}" -gt 0 ] || steps=(fuzz)
    local s
    for s in "${steps[@]}"; do
        case "$s" in
        fuzz) step fuzz fuzz_smoke ;;
        *)
            log "ci-peer: unknown step '$s' (fuzz)"
            return 2
            ;;
        esac
    done
}

main "$@"
