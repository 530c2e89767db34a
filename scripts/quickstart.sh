#!/usr/bin/env bash
# The quick start: build everything, make a synthetic ImageNet-like dataset
# (20,000 files in 100 class folders, ~110 KB each, in .granary-data/), start
# granaryd on it, run two loaders (two ranks of one job) for 3 epochs through
# libgranary, verify every byte, and print a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
cargo build --release --workspace --bins
exec target/release/granary demo --dir .granary-data --files "${GRANARY_DEMO_FILES:-20000}" --epochs 3
