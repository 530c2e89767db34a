#!/bin/bash
# The GPU-machine check of granary.cuda: what the machine has, the CUDA
# tests (tests/test_cuda.py, -s for the path used and the GB/s), and
# bench/gpu_step.py twice. Run from the checkout's root with libgranary.so
# and granaryd built (or GRANARY_LIB / GRANARYD set); output also in $OUT.
cd "$(dirname "$0")/.."
set -o pipefail
OUT=${OUT:-/tmp/granary-cuda-check}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import sys,torch;print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
echo "ulimit -l: $(ulimit -l)"; uname -r
export GRANARY_LIB=${GRANARY_LIB:-$PWD/target/release/libgranary.so} GRANARYD=${GRANARYD:-$PWD/target/release/granaryd}
export PYTHONPATH=$PWD/client-c/python PYTHONUNBUFFERED=1 GRANARY_CUDA_REPORT=$OUT/cuda_report.txt
timeout 200 python3 -m pytest -s -v -rs -p no:cacheprovider client-c/python/tests/test_cuda.py 2>&1 | tee "$OUT/pytest.log"
echo "pytest rc=$?"
for i in 1 2; do
    timeout 150 python3 bench/gpu_step.py --root /tmp/gpu_step_data --model resnet50 --batch 128 \
        --samples 2048 --steps 60 --warmup 5 --workers 4 2>&1 | tee -a "$OUT/gpu_step.log"
    echo "gpu_step rc=$?"
done
