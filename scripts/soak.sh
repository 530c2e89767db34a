#!/usr/bin/env bash
# The long loops of the hardening tests (docs/reliability.md), with the
# counts the reliability promises name. Prints the counts it uses.
#
# usage: scripts/soak.sh [--ci]
#   (default)  1,000 rounds of loaders killed with SIGKILL while an honest
#              loader reads (agent/tests/kill_loop.rs), 300,000 mutated and
#              300,000 random configuration files
#              (agent/src/config/fuzz_tests.rs), 2,000 random loader scripts
#              beside an honest session (agent/src/engine/tests/mod.rs), an
#              honest loader next to each kind of misbehaving loader for
#              60 s (rounds of 10 s, interleaved with 10 s alone), the 0.9x
#              goal asserted (agent/tests/neighbours.rs),
#              and each cargo-fuzz target for FUZZ_SECONDS (default 300)
#   --ci       the same kill loop (it takes ~20 s), 100,000 configuration
#              files of each kind, 200 loader scripts, 3 s next to each kind
#              (>= 0.5x asserted, the 0.9x verdict printed), no cargo-fuzz
#              runs (scripts/test.sh runs them for 20-30 s each in its fuzz step)
#
# Environment (overrides):
#   GRANARY_SOAK_KILL_ROUNDS   kill-loop rounds
#   GRANARY_CONFIG_FUZZ_CASES  configuration files of each kind
#   GRANARY_SESSION_FUZZ_RUNS  random loader scripts
#   GRANARY_NEIGHBOUR_SECONDS  seconds next to each kind of misbehaving loader
#   FUZZ_SECONDS               seconds per cargo-fuzz target
#
# Every cargo command selects the whole workspace and filters with
# nextest's -E, as scripts/test.sh does: `-p granary-agent` alone resolves
# the agent's features without the benchmarks' (`sim`) and would compile
# the agent and its tests a second time.
set -euo pipefail
cd "$(dirname "$0")/.."

ci=0
case "${1:-}" in
    --ci) ci=1 ;;
    "") ;;
    *) echo "usage: scripts/soak.sh [--ci]" >&2; exit 2 ;;
esac

export GRANARY_SOAK_KILL_ROUNDS="${GRANARY_SOAK_KILL_ROUNDS:-1000}"
if [ "$ci" = 1 ]; then
    export GRANARY_CONFIG_FUZZ_CASES="${GRANARY_CONFIG_FUZZ_CASES:-100000}"
    export GRANARY_SESSION_FUZZ_RUNS="${GRANARY_SESSION_FUZZ_RUNS:-200}"
    export GRANARY_NEIGHBOUR_SECONDS="${GRANARY_NEIGHBOUR_SECONDS:-3}"
else
    export GRANARY_CONFIG_FUZZ_CASES="${GRANARY_CONFIG_FUZZ_CASES:-300000}"
    export GRANARY_SESSION_FUZZ_RUNS="${GRANARY_SESSION_FUZZ_RUNS:-2000}"
    export GRANARY_NEIGHBOUR_SECONDS="${GRANARY_NEIGHBOUR_SECONDS:-60}"
    export FUZZ_SECONDS="${FUZZ_SECONDS:-300}"
fi
echo "soak: kill-loop rounds $GRANARY_SOAK_KILL_ROUNDS, configuration files" \
    "$GRANARY_CONFIG_FUZZ_CASES of each kind, loader scripts $GRANARY_SESSION_FUZZ_RUNS," \
    "${GRANARY_NEIGHBOUR_SECONDS} s next to each kind of misbehaving loader, cargo-fuzz" \
    "$([ "$ci" = 1 ] && echo "not run here (scripts/test.sh fuzz step)" || echo "${FUZZ_SECONDS} s per target")"

# agent_tests WHAT FILTER LINES: the agent's tests that FILTER selects, with
# their output lines matching LINES and the verdicts, timed.
agent_tests() {
    local t=$SECONDS
    cargo nextest run --release --workspace -E "package(granary-agent) & $2" --no-capture 2>&1 \
        | grep -E "$3|PASS|FAIL|Summary"
    echo "soak: $1 done in $((SECONDS - t)) s"
}

agent_tests "kill loop" 'binary(kill_loop)' '^kill_loop:'
agent_tests "configuration fuzzing" 'kind(lib) & test(/config::fuzz_tests/)' '^config '
agent_tests "loader scripts" 'kind(lib) & test(/random_loader_scripts/)' '^session fuzz'
agent_tests "neighbours" 'binary(neighbours)' '^neighbours:|panicked'

if [ "$ci" = 0 ]; then
    t=$SECONDS
    scripts/fuzz.sh
    echo "soak: cargo-fuzz targets done in $((SECONDS - t)) s"
fi
