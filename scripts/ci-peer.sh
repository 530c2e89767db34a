#!/usr/bin/env bash
# Checks of the peer core (granary-peer) beyond `cargo test`: short
# cargo-fuzz runs of the frame decoder, the channel handshake and the
# records of an established channel.
#
# usage: scripts/ci-peer.sh [STEP...]      (default: fuzz)
#   fuzz        each cargo-fuzz target for FUZZ_SECONDS (default 20), after
#               its regression inputs (scripts/fuzz.sh)
#
# Environment:
#   FUZZ_SECONDS            seconds per fuzz target (default 20)
#   GRANARY_REQUIRE_NIGHTLY 1: fail instead of skipping when no nightly
#                           toolchain or cargo-fuzz can be had
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_TARGETS=(frame handshake records)

CI_NAME=ci-peer
# shellcheck source=scripts/ci-steps.sh
. scripts/ci-steps.sh

fuzz_smoke() {
    FUZZ_SECONDS="${FUZZ_SECONDS:-20}" scripts/fuzz.sh "${FUZZ_TARGETS[@]/#/peer/}"
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
