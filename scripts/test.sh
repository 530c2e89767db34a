#!/usr/bin/env bash
# Runs every test of the project on a fresh machine (CI runs exactly this).
# Installs what it needs first (scripts/setup.sh test). Steps:
#   1. workspace tests (unit, integration, cross-process, C example), release profile
#   2. loom models of the ring and header publication
#   3. Miri over the ring / validation / lease logic with heap-backed memory
#   4. fuzz smoke runs of the validation and handshake targets
#   5. Python package: pip install torch & co. and ./client-c/python, pytest
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
step() { printf '\n==== %s [%s]\n' "$1" "$(date +%T)"; }

step "setup"
scripts/setup.sh test

step "workspace tests"
cargo build --release --workspace --all-targets
cargo nextest run --release --workspace --no-fail-fast
cargo test --release --workspace --doc

step "loom"
scripts/ci-shm.sh loom

step "miri"
scripts/ci-shm.sh miri

step "fuzz smoke"
scripts/ci-shm.sh fuzz

step "python"
client-c/python/ci.sh

step "done"
