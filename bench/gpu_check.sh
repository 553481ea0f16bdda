#!/usr/bin/env bash
# The GPU run in one script (see bench/README.md, "First GPU run"). Phases, each writing under $OUT:
#   bash bench/gpu_check.sh [--dry-run] install   carried wheels (resolved against the image) + pip check, the
#                                                 project, FlashInfer JIT warm-up   → install.log, warmup.json
#   bash bench/gpu_check.sh [--dry-run] tests     tests/gpu; missing CUDA/flashinfer fails → gpu-tests.txt/.xml
#   bash bench/gpu_check.sh [--dry-run] bench [bench/gpu.py bench arguments]        → bench.txt, gpu.json
#   bash bench/gpu_check.sh [--dry-run] all       install → tests → a short bench, each phase under its own
#                                                 time limit (9 minutes in all); later phases run even when an
#                                                 earlier one failed, and the exit status says if any did
# --dry-run prints every command instead of running it. $OUT gets at most 8 files (the device's limit):
# summary.txt, install.log, warmup.json, gpu-tests.txt, gpu-tests.xml, bench.txt, gpu.json.
# Caches (FlashInfer JIT, inductor, Triton) live in the git-ignored .cache/gpu/ of the checkout, so a second
# call on the same machine reuses them. The wheels come from scripts/download_gpu_wheels.sh (carry .wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
SELF="$PWD/bench/gpu_check.sh"

DRY=0
if [ "${1:-}" = "--dry-run" ]; then
  DRY=1
  shift
fi
OUT=${OUT:-bench/results/gpu_check}
WHEELS=${WHEELS:-.wheels}
CACHE="$PWD/.cache/gpu"
# Per-phase limits of `all` (seconds); 180 + 270 + 90 = 540 s, 9 minutes. Estimates (not yet measured): install
# 100-200 s (pip, the FlashInfer JIT build), tests 200-330 s (6-8 torch.compile / flex compiles), the short bench
# 60-100 s. A phase at its limit gets SIGINT: pytest and gpu.py still write what they have.
INSTALL_LIMIT=${INSTALL_LIMIT:-180}
TESTS_LIMIT=${TESTS_LIMIT:-270}
BENCH_LIMIT=${BENCH_LIMIT:-90}
SHORT_BENCH=(--workloads b --queries 8 --methods hf flashinfer)  # flex, sdpa, split: `bench --methods ...`

# The image's python3 holds torch; `python` and FlashInfer's `ninja` are looked up on PATH: python3's bin folder
# (a venv's) goes first when there is no `python`, last when only `ninja` is missing.
PY3_BIN=$(dirname "$(command -v python3 >/dev/null && python3 -c 'import sys; print(sys.executable)' || echo /)")
command -v python >/dev/null || PATH="$PY3_BIN:$PATH"
command -v ninja >/dev/null || PATH="$PATH:$PY3_BIN"
export PATH

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the phases run from the checkout even if -e . failed
export PYTHONUNBUFFERED=1
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export FLASHINFER_NVCC_THREADS=${FLASHINFER_NVCC_THREADS:-2}
export FLASHINFER_WORKSPACE_BASE="$CACHE"  # FlashInfer's JIT cache: $CACHE/.cache/flashinfer
export TORCHINDUCTOR_CACHE_DIR="$CACHE/inductor"
export TRITON_CACHE_DIR="$CACHE/triton"

say() { echo "+ $*"; }

say "export FLASHINFER_WORKSPACE_BASE=$FLASHINFER_WORKSPACE_BASE TORCHINDUCTOR_CACHE_DIR=$TORCHINDUCTOR_CACHE_DIR \
TRITON_CACHE_DIR=$TRITON_CACHE_DIR MAX_JOBS=$MAX_JOBS FLASHINFER_NVCC_THREADS=$FLASHINFER_NVCC_THREADS"

# run LOG CMD...: print the command; unless dry, run it with its output also appended to LOG.
run() {
  local log=$1
  shift
  say "$(printf '%q ' "$@")"
  [ "$DRY" = 1 ] && return 0
  "$@" 2>&1 | tee -i -a "$log"  # -i: tee outlives the phase's SIGINT and keeps the last lines
}

arch_list() {
  # Build FlashInfer's JIT kernels for this GPU only (9.0a on H100/H200): a fraction of the compile time.
  if [ -z "${FLASHINFER_CUDA_ARCH_LIST:-}" ]; then
    if [ "$DRY" = 1 ]; then
      FLASHINFER_CUDA_ARCH_LIST="<major.minor of the device>"
    else
      FLASHINFER_CUDA_ARCH_LIST=$(python -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
      [ "$FLASHINFER_CUDA_ARCH_LIST" = "9.0" ] && FLASHINFER_CUDA_ARCH_LIST=9.0a
    fi
    export FLASHINFER_CUDA_ARCH_LIST
  fi
  say "export FLASHINFER_CUDA_ARCH_LIST=$FLASHINFER_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS"
}

install() {
  local log="$OUT/install.log"
  say "mkdir -p $CACHE"
  [ "$DRY" = 1 ] || mkdir -p "$CACHE"
  run "$log" nvidia-smi
  run "$log" bash -c 'command -v python python3 nvcc ninja; nvcc --version | tail -1'
  run "$log" ls -l "$WHEELS"  # fails loudly when the wheels were not carried
  run "$log" python bench/install_check.py wheels "$WHEELS"
  say "python -m pip check > $OUT/pip-check-before.tmp"
  [ "$DRY" = 1 ] || python -m pip check >"$OUT/pip-check-before.tmp" 2>&1 || true
  # Everything but flashinfer-python with its dependencies resolved against what the image has: pip keeps
  # an installed version that satisfies a requirement and fails when one is missing from the image and .wheels.
  # Names only: a pin would replace a copy the image already has (tabulate) instead of keeping it.
  local resolved
  resolved=$(grep -v -e '^#' -e '^flashinfer-python' bench/gpu_wheels.txt | sed 's/[=<>!~ ].*//' | tr '\n' ' ')
  # shellcheck disable=SC2086
  run "$log" python -m pip install --no-index --find-links "$WHEELS" $resolved
  # flashinfer-python alone without dependencies: its cuDNN / CuTe-DSL requirements are left out on purpose.
  run "$log" python -m pip install --no-index --no-deps --find-links "$WHEELS" \
    "$(grep '^flashinfer-python' bench/gpu_wheels.txt)"
  say "python -m pip check > $OUT/pip-check-after.tmp"
  [ "$DRY" = 1 ] || python -m pip check >"$OUT/pip-check-after.tmp" 2>&1 || true
  # A new pip check problem fails the phase, but only after the warm-up (else the JIT build lands in `tests`).
  local pip_status=0
  run "$log" python bench/install_check.py pip-check "$OUT/pip-check-before.tmp" "$OUT/pip-check-after.tmp" \
    || pip_status=$?
  [ "$DRY" = 1 ] || { cat "$OUT"/pip-check-*.tmp >>"$log"; rm -f "$OUT"/pip-check-*.tmp; }
  run "$log" python -m pip install --no-index --no-deps --no-build-isolation -e . \
    || { echo "editable install failed (see install.log); running from PYTHONPATH=$PWD" | tee -a "$log"; }
  run "$log" python -c "import flashinfer, score_batch; print('flashinfer', flashinfer.__version__)"
  arch_list
  run "$log" python bench/gpu.py warmup --out "$OUT/warmup.json"  # first_call_s: the JIT compile
  return "$pip_status"
}

installed() {
  # A fresh machine (the previous one was given back) needs the install phase again; within `all` the
  # install phase has just run (a failed one is not retried: the tests then fail on the missing import).
  if [ "${GPU_CHECK_ALL:-0}" = 1 ]; then
    :
  elif [ "$DRY" = 1 ] || ! python -c "import flashinfer" 2>/dev/null; then
    say "python -c 'import flashinfer' failed: install phase first"
    install
  fi
  arch_list
}

tests() {
  installed
  say "export SCORE_BATCH_REQUIRE_GPU=1"
  export SCORE_BATCH_REQUIRE_GPU=1
  # A failed import in one module must not stop the others (flex needs only CUDA).
  run "$OUT/gpu-tests.txt" python -m pytest -q -rA tests/gpu --junitxml="$OUT/gpu-tests.xml" \
    --continue-on-collection-errors --durations=0
}

bench() {
  installed
  run "$OUT/bench.txt" python bench/gpu.py bench --out "$OUT/gpu.json" "$@"
}

# phase NAME LIMIT CMD...: run a phase under a time limit, record its status and time in summary.txt.
phase() {
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS status=0
  say "GPU_CHECK_ALL=1 timeout -s INT --kill-after=10 $limit bash $SELF $*"
  if [ "$DRY" = 1 ]; then
    GPU_CHECK_ALL=1 "$@"
  else
    # A child under `timeout`: the phase's own commands stop at the limit, what they wrote stays.
    # SIGINT, not SIGTERM: pytest then still writes its summary and junit XML.
    GPU_CHECK_ALL=1 timeout -s INT --kill-after=10 "$limit" bash "$SELF" "$@" || status=$?
  fi
  if [ "$DRY" = 1 ]; then
    echo "$name exit=<status> seconds=<time>  >> $OUT/summary.txt"
  else
    echo "$name exit=$status seconds=$((SECONDS - start))" | tee -a "$OUT/summary.txt"
  fi
  return 0
}

[ "$DRY" = 1 ] || mkdir -p "$OUT"
case "${1:-}" in
  install | tests)
    "$1"
    ;;
  bench)
    shift
    bench "$@"
    ;;
  all)
    say ": > $OUT/summary.txt"
    [ "$DRY" = 1 ] || : >"$OUT/summary.txt"
    phase install "$INSTALL_LIMIT" install
    phase tests "$TESTS_LIMIT" tests
    phase bench "$BENCH_LIMIT" bench "${SHORT_BENCH[@]}"
    if [ "$DRY" = 0 ] && grep -qv "exit=0 " "$OUT/summary.txt"; then
      echo "some phase failed: see $OUT/summary.txt" >&2
      exit 1
    fi
    ;;
  *)
    echo "usage: bash bench/gpu_check.sh [--dry-run] install|tests|bench|all [bench/gpu.py bench arguments]" >&2
    exit 2
    ;;
esac
