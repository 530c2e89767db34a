#!/bin/bash
# `bench/run stall` with a real GPU step, on a machine with a CUDA GPU and no
# Rust toolchain, SeaweedFS or network: the light store serves the samples
# and the shards in the stall process, and each contender's training loop
# runs ResNet-50 forward and backward on every batch.
#
#   bench/gpu_stall.sh [extra stall arguments]
#
# Needs: the stall binary ($STALL_BIN, default target/release/stall) and
# libgranary.so ($GRANARY_LIB, default target/release/libgranary.so) built
# beforehand; python3 with torch and torchvision; the contenders' packages
# (mosaicml-streaming, webdataset, boto3 and what they import) importable,
# e.g. wheels installed with `pip install --no-deps --no-index --target DIR`
# (the wheels and what they import carried beside the checkout) and DIR on
# PYTHONPATH; curl for webdataset. Output also goes to $OUT/gpu_stall.log.
cd "$(dirname "$0")/.."
set -o pipefail
OUT=${OUT:-/tmp/granary-gpu-stall}; mkdir -p "$OUT"
export GRANARY_LIB=${GRANARY_LIB:-$PWD/target/release/libgranary.so}
export GRANARY_BENCH_DATA=${GRANARY_BENCH_DATA:-/tmp/granary-bench-data}
export PYTHONUNBUFFERED=1
STALL_BIN=${STALL_BIN:-$PWD/target/release/stall}
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c "import sys,torch,torchvision;print(sys.version.split()[0], 'torch', torch.__version__, 'torchvision', torchvision.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
    python3 -c "import streaming, webdataset, boto3; print('streaming', streaming.__version__, 'webdataset', webdataset.__version__, 'boto3', boto3.__version__)" 2>&1 | tail -1
    echo "curl: $(command -v curl || echo missing); CPUs: $(nproc); $(uname -r)"
} 2>&1 | tee "$OUT/gpu_stall.log"
timeout "${STALL_TIMEOUT:-420}" "$STALL_BIN" --store light --light-threads 4 --gpu-step resnet50 --rtt 100 \
    --contenders granary,granary_workers,streaming,webdataset --files 12000 --batches 300 \
    --window-s 12 --reps 2 --quiet-wait-s 2 --plot none "$@" 2>&1 | tee -a "$OUT/gpu_stall.log"
echo "stall rc=$?" | tee -a "$OUT/gpu_stall.log"
