#!/usr/bin/env bash
# Every cargo-fuzz target of the project, or the ones named.
#
# usage: scripts/fuzz.sh [TARGET...]
#   TARGET is CRATE/NAME:
#     shm/validate     segment and descriptor validation (shm-protocol/fuzz)
#     shm/handshake    the session handshake codec
#     peer/frame       the peer frame decoder (peer/fuzz)
#     peer/handshake   the peer channel handshake (a listener and a dialer fed strangers' bytes)
#     peer/records     an established peer channel: forged records, frames inside authentic ones
#     agent/config     the agent's configuration parser (agent/fuzz)
#     agent/session    whole loader sessions against the engine
#   (default: all of them)
#
# For each target, in its crate's fuzz directory DIR:
#   1. every input in DIR/regressions/NAME (committed: inputs that once broke
#      the target, or edge cases written by hand) runs once; any failure
#      fails the script;
#   2. the target is fuzzed for FUZZ_SECONDS (default 30) from the committed
#      seeds DIR/seeds/NAME and the working corpus DIR/corpus/NAME (not
#      committed: it grows with every run on this machine).
# A crash leaves its input in DIR/artifacts/NAME: minimize it
# (`cargo +nightly fuzz tmin NAME FILE` in DIR), fix the bug, and commit the
# input under DIR/regressions/NAME.
#
# Environment:
#   FUZZ_SECONDS            seconds per target (default 30)
#   GRANARY_REQUIRE_NIGHTLY 1: fail instead of skipping when no nightly
#                           toolchain or cargo-fuzz can be had
set -euo pipefail
cd "$(dirname "$0")/.."

ALL=(shm/validate shm/handshake peer/frame peer/handshake peer/records agent/config agent/session)

log() { printf '%s\n' "$*" >&2; }

skipped() {
    if [ "${GRANARY_REQUIRE_NIGHTLY:-0}" = 1 ]; then
        log "fuzz: $1 could not be had"
        exit 1
    fi
    log "fuzz: SKIPPED every target: $1 could not be had (set GRANARY_REQUIRE_NIGHTLY=1 to fail)"
    exit 0
}

dir_of() {
    case "$1" in
    shm) echo shm-protocol/fuzz ;;
    peer) echo peer/fuzz ;;
    agent) echo agent/fuzz ;;
    *)
        log "fuzz: unknown crate '$1' (shm, peer, agent)"
        exit 2
        ;;
    esac
}

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    log "fuzz: no nightly toolchain; trying to install it"
    rustup toolchain install nightly --profile minimal >/dev/null 2>&1 || skipped "a nightly toolchain"
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked >/dev/null 2>&1 || skipped "cargo-fuzz"
fi

targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=("${ALL[@]}")
seconds="${FUZZ_SECONDS:-30}"
for target in "${targets[@]}"; do
    crate="${target%%/*}"
    name="${target#*/}"
    dir="$(dir_of "$crate")"
    [ -f "$dir/fuzz_targets/$name.rs" ] || { log "fuzz: no target $target ($dir/fuzz_targets/$name.rs)"; exit 2; }
    t0=$SECONDS
    (
        cd "$dir"
        cargo +nightly fuzz build "$name"
        regressions="regressions/$name"
        n=0
        [ -d "$regressions" ] && n="$(find "$regressions" -type f ! -name '*.md' | wc -l)"
        if [ "$n" -gt 0 ]; then
            log "fuzz: $target: $n regression input(s), each run once"
            # The built target given files (not directories) runs each once.
            host="$(rustc +nightly -vV | sed -n 's/^host: //p')"
            find "$regressions" -type f ! -name '*.md' -print0 |
                xargs -0 "target/$host/release/$name"
        else
            log "fuzz: $target: no regression inputs"
        fi
        mkdir -p "corpus/$name"
        seeds=()
        [ -d "seeds/$name" ] && seeds=("seeds/$name")
        log "fuzz: $target: fuzzing for $seconds s from $(find "seeds/$name" -type f 2>/dev/null | wc -l) seed(s) and $(find "corpus/$name" -type f | wc -l) corpus input(s)"
        cargo +nightly fuzz run "$name" "corpus/$name" "${seeds[@]}" -- -max_total_time="$seconds"
    )
    log "fuzz: $target passed in $((SECONDS - t0)) s"
done
