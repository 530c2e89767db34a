#!/usr/bin/env bash
# The quick start: build the agent, the CLI and libgranary, make a synthetic ImageNet-like dataset
# (20,000 files in 100 class folders, ~110 KB each, in .granary-data/), start
# granaryd on it, run two C loaders (client-c/examples/consume.c, two ranks of
# one job) for 3 epochs, verify every byte, and print a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
# The commit `granaryd --version` and `granary --version` print.
export GRANARY_COMMIT="${GRANARY_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || true)}"
scripts/setup.sh build
# Only what the demo runs: granaryd, the granary CLI and libgranary (the
# benchmarks and the test kit are built by scripts/test.sh).
cargo build --release -p granary-agent -p granary-tools -p granary-client --bins --lib
# The loaders are the C example, linked statically against libgranary.
cc -O2 -std=c11 -Wall -Wextra -Werror -Iclient-c/include -o target/release/consume \
    client-c/examples/consume.c target/release/libgranary.a -lpthread -ldl -lm
exec target/release/granary demo --dir .granary-data --files "${GRANARY_DEMO_FILES:-20000}" --epochs 3
