#!/usr/bin/env bash
# The GPU run in one script (see bench/README.md, "First GPU run"). Phases, each writing under $OUT:
#   bash bench/gpu_check.sh [--dry-run] install   carried wheels (resolved against the image) + pip check, the
#                                                 project, FlashInfer JIT warm-up   → install.log, warmup.json
#   bash bench/gpu_check.sh [--dry-run] tests     tests/gpu, most valuable first; missing CUDA/flashinfer fails
#                                                                                   → gpu-tests.txt/.xml
#   bash bench/gpu_check.sh [--dry-run] bench [bench/gpu.py bench arguments]        → bench.txt, gpu.json
#   bash bench/gpu_check.sh [--dry-run] all       install → tests → the short bench, in one device command: each
#                                                 phase under its own time limit plus what earlier phases left
#                                                 unused (ALL_LIMIT in all); later phases run even when an
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
SITE="$CACHE/site" # pip install --target here when the image's environment is not writable
# Time limits of `all` (seconds). The device runs one command for at most 600 s (the machine's start is outside
# it): ALL_LIMIT = 560 = 180 + 210 + 170, and a phase at its limit gets SIGINT, then SIGKILL KILL_AFTER s later
# (worst case 575 s). A phase's limit is its own share plus what the earlier phases left unused. Estimates (not
# measured on a GPU): install 120-170 s (pip 20-30 s; FlashInfer's JIT on 16 cores: FA2 ≈ 20 s, the ops ≈ 10 s,
# FA3 ≈ 90 s: one sm_90a FA3 kernel file took nvcc 80 s and 3.5 GB here, FA2's 11 s; the warm-up calls 10 s);
# tests 150-220 s (FlashInfer exactness and FA3 first, ≈ 40 s; split, native ops ≈ 20 s; three torch.compile
# runs ≈ 60-90 s; flex last, ≈ 60 s, cut first when time runs out); bench 110-160 s (the 0.6B model built
# and saved ≈ 20 s, each method's load + warm-up + 3 runs ≈ 8 s, plain HF ≈ 15 s, the compiled method ≈ 45 s).
ALL_LIMIT=${ALL_LIMIT:-560}
INSTALL_LIMIT=${INSTALL_LIMIT:-180}
TESTS_LIMIT=${TESTS_LIMIT:-210}
BENCH_LIMIT=${BENCH_LIMIT:-170}
KILL_AFTER=5
# The short bench: workload a, the goal shape (1,500-token query × 100 items of 40: one 5,601-token pack per
# query), 4 queries; the flashinfer methods of bench/gpu.py (HF layers, native + torch ops, native + FlashInfer
# ops, FA3, then native compiled: last, its compile time is the least sure) beside plain HF pairs. flex, sdpa,
# split and workload b: `bench --methods ...`.
SHORT_BENCH=(--workloads a --queries 4 --methods hf fi-hf-layers fi-native-torch fi-native-fi fa3 fi-native-compile)
# Most valuable first: a phase cut at its limit loses the last module.
GPU_TESTS=(
  tests/gpu/test_flashinfer.py
  tests/gpu/test_flashinfer_split.py
  tests/gpu/test_native_ops.py
  tests/gpu/test_flashinfer_runs.py
  tests/gpu/test_flex_compile.py
)

# The image's python3 holds torch; `python` and FlashInfer's `ninja` are looked up on PATH: python3's bin folder
# (a venv's) goes first when there is no `python`, last when only `ninja` is missing.
PY3_BIN=$(dirname "$(command -v python3 >/dev/null && python3 -c 'import sys; print(sys.executable)' || echo /)")
command -v python >/dev/null || PATH="$PY3_BIN:$PATH"
command -v ninja >/dev/null || PATH="$PATH:$PY3_BIN"
export PATH

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" # the phases run from the checkout even if -e . failed
[ -d "$SITE" ] && export PYTHONPATH="$SITE:$PYTHONPATH" # the --target install of a read-only image
export PYTHONUNBUFFERED=1
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export FLASHINFER_NVCC_THREADS=${FLASHINFER_NVCC_THREADS:-2}
export FLASHINFER_WORKSPACE_BASE="$CACHE" # FlashInfer's JIT cache: $CACHE/.cache/flashinfer
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
  "$@" 2>&1 | tee -i -a "$log" # -i: tee outlives the phase's SIGINT and keeps the last lines
}

cuda_headers() {
  # FlashInfer's JIT sources include <curand_kernel.h> (FA3, through CUTLASS) and <cublasLt.h> (the norm ops):
  # when nvcc cannot find one, point FLASHINFER_EXTRA_CUDAFLAGS at the image's pip-installed CUDA headers
  # (site-packages/nvidia/*/include). Checked, not guessed: nvcc preprocesses an #include of each.
  local header dir flags=""
  for header in curand_kernel.h cublasLt.h; do
    say "echo '#include <$header>' | nvcc -x cu -E - -o /dev/null || look for nvidia/*/include/$header on sys.path"
    [ "$DRY" = 1 ] && continue
    command -v nvcc >/dev/null || return 0
    if ! echo "#include <$header>" | nvcc -x cu -E - -o /dev/null >/dev/null 2>&1; then
      dir=$(python -c 'import glob, os, sys
found = [p for d in sys.path if d for p in glob.glob(os.path.join(d, "nvidia", "*", "include", sys.argv[1]))]
print(os.path.dirname(found[0]) if found else "")' "$header" || true)
      echo "nvcc finds no $header; ${dir:-no copy on sys.path either}"
      [ -n "$dir" ] && flags="$flags -isystem $dir"
    fi
  done
  if [ -n "$flags" ]; then
    export FLASHINFER_EXTRA_CUDAFLAGS="${FLASHINFER_EXTRA_CUDAFLAGS:-}$flags"
    say "export FLASHINFER_EXTRA_CUDAFLAGS='$FLASHINFER_EXTRA_CUDAFLAGS'"
  fi
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
  cuda_headers
}

site_writable() {
  # Whether pip can install into the image's own environment (a read-only image gets --target $SITE instead).
  python -c 'import os, sysconfig
raise SystemExit(0 if os.access(sysconfig.get_paths()["purelib"], os.W_OK) else 1)'
}

install() {
  local log="$OUT/install.log"
  say "mkdir -p $CACHE"
  [ "$DRY" = 1 ] || mkdir -p "$CACHE"
  run "$log" nvidia-smi
  run "$log" bash -c 'command -v python python3 nvcc ninja; nvcc --version | tail -1'
  run "$log" ls -l "$WHEELS" # fails loudly when the wheels were not carried
  run "$log" python bench/install_check.py wheels "$WHEELS"
  say "python -m pip check > $OUT/pip-check-before.tmp"
  [ "$DRY" = 1 ] || python -m pip check >"$OUT/pip-check-before.tmp" 2>&1 || true
  # Everything but flashinfer-python with its dependencies resolved against what the image has: pip keeps
  # an installed version that satisfies a requirement and fails when one is missing from the image and .wheels.
  # Names only: a pin would replace a copy the image already has (tabulate) instead of keeping it.
  local resolved flashinfer target=0
  resolved=$(grep -v -e '^#' -e '^flashinfer-python' bench/gpu_wheels.txt | sed 's/[=<>!~ ].*//' | tr '\n' ' ')
  flashinfer=$(grep '^flashinfer-python' bench/gpu_wheels.txt)
  say "python -c '<is sysconfig purelib writable?>' || install with --target $SITE (PYTHONPATH) instead"
  if [ "$DRY" = 0 ] && ! site_writable; then
    target=1
    echo "the image's site-packages is not writable: installing into $SITE (on PYTHONPATH)" | tee -a "$log"
  fi
  if [ "$target" = 0 ]; then
    # shellcheck disable=SC2086
    run "$log" python -m pip install --no-index --find-links "$WHEELS" $resolved
    # flashinfer-python alone without dependencies: its cuDNN / CuTe-DSL requirements are left out on purpose.
    run "$log" python -m pip install --no-index --no-deps --find-links "$WHEELS" "$flashinfer"
  fi
  if [ "$target" = 1 ] || [ "$DRY" = 1 ]; then
    # --target resolves nothing against the image (it would try to install typing-extensions, …): every carried
    # wheel without dependencies, then pip check (it reads PYTHONPATH too) says what is missing.
    [ "$DRY" = 1 ] && say "# if not writable:"
    say "mkdir -p $SITE && export PYTHONPATH=$SITE:\$PYTHONPATH"
    [ "$DRY" = 1 ] || { mkdir -p "$SITE" && export PYTHONPATH="$SITE:$PYTHONPATH"; }
    # shellcheck disable=SC2086
    run "$log" python -m pip install --no-index --no-deps --upgrade --target "$SITE" --find-links "$WHEELS" \
      $resolved "$flashinfer"
  fi
  say "python -m pip check > $OUT/pip-check-after.tmp"
  [ "$DRY" = 1 ] || python -m pip check >"$OUT/pip-check-after.tmp" 2>&1 || true
  # A new pip check problem fails the phase, but only after the warm-up (else the JIT build lands in `tests`).
  local pip_status=0
  run "$log" python bench/install_check.py pip-check "$OUT/pip-check-before.tmp" "$OUT/pip-check-after.tmp" \
    || pip_status=$?
  [ "$DRY" = 1 ] || {
    cat "$OUT"/pip-check-*.tmp >>"$log"
    rm -f "$OUT"/pip-check-*.tmp
  }
  if [ "$target" = 0 ]; then
    run "$log" python -m pip install --no-index --no-deps --no-build-isolation -e . \
      || { echo "editable install failed (see install.log); running from PYTHONPATH=$PWD" | tee -a "$log"; }
  fi
  run "$log" python -c "import flashinfer, score_batch; print('flashinfer', flashinfer.__version__)"
  arch_list
  [ "$DRY" = 1 ] || echo "FLASHINFER_CUDA_ARCH_LIST=$FLASHINFER_CUDA_ARCH_LIST \
FLASHINFER_EXTRA_CUDAFLAGS=${FLASHINFER_EXTRA_CUDAFLAGS:-}" >>"$log"
  run "$log" python bench/gpu.py warmup --out "$OUT/warmup.json" # JIT build seconds, first calls
  return "$pip_status"
}

installed() {
  # A fresh machine (the previous one was given back) needs the install phase again; within `all` the
  # install phase has just run (a failed one is not retried: the tests then fail on the missing import).
  # A lone phase goes on after an install that ended non-zero (a new pip-check line, say): its own
  # commands say whether the install is usable.
  if [ "${GPU_CHECK_ALL:-0}" = 1 ]; then
    :
  elif [ "$DRY" = 1 ] || ! python -c "import flashinfer" 2>/dev/null; then
    say "python -c 'import flashinfer' failed: install phase first (a non-zero install does not stop this phase)"
    local status=0
    install || status=$?
    [ "$status" = 0 ] || echo "install ended with status $status (see $OUT/install.log); going on" >&2
  fi
  arch_list
}

no_fa3() {
  # FA3 that failed to build in the warm-up is not rebuilt by every FA3 test and the bench (its kernel files take
  # nvcc 80 s each): SCORE_BATCH_NO_FA3 makes tests/gpu skip FA3 and gpu.py refuse its method, with the reason.
  say "python -c '<the FA3 build error in $OUT/warmup.json, if any>' → export SCORE_BATCH_NO_FA3=<it>"
  [ "$DRY" = 0 ] && [ -f "$OUT/warmup.json" ] || return 0
  local why
  why=$(python -c 'import json, sys
print(json.load(open(sys.argv[1])).get("jit", {}).get("fa3", {}).get("error", "")[-300:])' "$OUT/warmup.json" || true)
  if [ -n "$why" ]; then
    export SCORE_BATCH_NO_FA3="FA3 did not build in the warm-up (warmup.json): $why"
    echo "SCORE_BATCH_NO_FA3: FA3 tests skipped, its bench method refused"
  fi
}

tests() {
  installed
  no_fa3
  say "export SCORE_BATCH_REQUIRE_GPU=1"
  export SCORE_BATCH_REQUIRE_GPU=1
  # A failed import in one module must not stop the others (flex needs only CUDA).
  run "$OUT/gpu-tests.txt" python -m pytest -q -rA "${GPU_TESTS[@]}" --junitxml="$OUT/gpu-tests.xml" \
    --continue-on-collection-errors --durations=0 -p no:cacheprovider
}

bench() {
  installed
  no_fa3
  run "$OUT/bench.txt" python bench/gpu.py bench --out "$OUT/gpu.json" "$@"
}

ALL_START=$SECONDS
PLANNED=0 # dry run: the seconds the earlier phases may take at most

# phase NAME LIMIT LATER CMD...: run a phase under its limit plus the time earlier phases left unused (LATER:
# the later phases' own limits, kept for them), record its status, time and limit in summary.txt.
phase() {
  local name=$1 own=$2 later=$3
  shift 3
  local start=$SECONDS status=0 elapsed limit
  elapsed=$((DRY == 1 ? PLANNED : SECONDS - ALL_START))
  limit=$((ALL_LIMIT - elapsed - later))
  [ "$limit" -ge "$own" ] || limit=$own # never below its own share (the device's 600 s still stops all)
  PLANNED=$((PLANNED + limit))
  say "GPU_CHECK_ALL=1 timeout -s INT --kill-after=$KILL_AFTER $limit bash $SELF $*"
  if [ "$DRY" = 1 ]; then
    GPU_CHECK_ALL=1 "$@"
  else
    # A child under `timeout`: the phase's own commands stop at the limit, what they wrote stays.
    # SIGINT, not SIGTERM: pytest then still writes its summary and junit XML.
    GPU_CHECK_ALL=1 timeout -s INT --kill-after=$KILL_AFTER "$limit" bash "$SELF" "$@" || status=$?
  fi
  if [ "$DRY" = 1 ]; then
    echo "$name exit=<status> seconds=<time> limit=$limit  >> $OUT/summary.txt"
  else
    echo "$name exit=$status seconds=$((SECONDS - start)) limit=$limit" | tee -a "$OUT/summary.txt"
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
    phase install "$INSTALL_LIMIT" $((TESTS_LIMIT + BENCH_LIMIT)) install
    phase tests "$TESTS_LIMIT" "$BENCH_LIMIT" tests
    phase bench "$BENCH_LIMIT" 0 bench "${SHORT_BENCH[@]}"
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
