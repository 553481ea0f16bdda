#!/usr/bin/env bash
# First-GPU-run check in three phases, each under 10 minutes, idempotent, everything written under $OUT:
#   bash bench/gpu_check.sh install   wheels from .wheels/ (no network), the project, versions, FlashInfer JIT warm-up
#   bash bench/gpu_check.sh tests     tests/gpu with missing CUDA/flashinfer counted as failures
#   bash bench/gpu_check.sh bench [bench/gpu.py bench arguments]   bench/results/gpu.json (copied to $OUT)
# The wheels come from scripts/download_gpu_wheels.sh on a machine with network. See bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/gpu_check}
WHEELS=${WHEELS:-.wheels}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the phases run from the repo even if -e . failed
export MAX_JOBS=${MAX_JOBS:-$(nproc)}

install() {
  ls "$WHEELS"/*.whl >/dev/null  # fails loudly when the wheels were not carried
  python -m pip install --no-index --no-deps "$WHEELS"/*.whl 2>&1 | tee "$OUT/install.log"
  python -m pip install --no-deps --no-build-isolation -e . 2>&1 | tee -a "$OUT/install.log" \
    || echo "editable install failed (see install.log); running from PYTHONPATH=$PWD" | tee -a "$OUT/install.log"
  nvidia-smi | tee "$OUT/nvidia-smi.txt"
  python bench/gpu.py versions --out "$OUT/versions.json"
  arch_list
  python bench/gpu.py warmup --out "$OUT/warmup.json"  # first_call_s: the JIT compile of the kernels
}

arch_list() {
  # Build FlashInfer's JIT kernels for this GPU only (9.0a on H100/H200): a fraction of the compile time.
  if [ -z "${FLASHINFER_CUDA_ARCH_LIST:-}" ]; then
    FLASHINFER_CUDA_ARCH_LIST=$(python -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
    [ "$FLASHINFER_CUDA_ARCH_LIST" = "9.0" ] && FLASHINFER_CUDA_ARCH_LIST=9.0a
    export FLASHINFER_CUDA_ARCH_LIST
  fi
  echo "FLASHINFER_CUDA_ARCH_LIST=$FLASHINFER_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS"
}

installed() {
  # A fresh machine (the previous one was given back) needs the install phase again.
  python -c "import flashinfer" 2>/dev/null || install
  arch_list
}

case "${1:-}" in
  install)
    install
    ;;
  tests)
    installed
    SCORE_BATCH_REQUIRE_GPU=1 python -m pytest -q -rA tests/gpu --junitxml="$OUT/gpu-tests.xml" 2>&1 \
      | tee "$OUT/gpu-tests.txt"
    ;;
  bench)
    installed
    shift
    python bench/gpu.py bench --out bench/results/gpu.json "$@" 2>&1 | tee "$OUT/bench.txt"
    cp bench/results/gpu.json "$OUT/gpu.json"
    ;;
  *)
    echo "usage: bash bench/gpu_check.sh install|tests|bench [bench/gpu.py bench arguments]" >&2
    exit 2
    ;;
esac
