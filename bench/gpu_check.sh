#!/usr/bin/env bash
# The GPU run in one script (see bench/README.md, "First GPU run"). Phases, each writing under $OUT:
#   bash bench/gpu_check.sh [--dry-run] install   carried wheels (resolved against the image) + pip check, the
#                                                 project, FlashInfer's JIT warm-up (FA2 and the ops, built at
#                                                 once, then one call with torch ops and one with FlashInfer's)
#                                                                                   → install.log, warmup.json
#   bash bench/gpu_check.sh [--dry-run] tests     tests/gpu, most valuable first; missing CUDA/flashinfer fails
#                                                                                   → gpu-tests.txt/.xml
#   bash bench/gpu_check.sh [--dry-run] bench [bench/gpu.py bench arguments]        → bench.txt, gpu.json
#   bash bench/gpu_check.sh [--dry-run] all       install → tests → the short bench, FA3 left out, in one device
#                                                 command: each phase under its own time limit plus what earlier
#                                                 phases left unused (ALL_LIMIT in all); later phases run even
#                                                 when an earlier one failed, and the exit status says if any did
#   bash bench/gpu_check.sh [--dry-run] fa3       a later call: FA3's build in the background (it survives the
#                                                 phase's limit, its objects stay in the JIT cache: a call cut
#                                                 short is resumed by the next), then FA3's tests and its bench
#                                                 once warmup.json proves it; FA3_LIMIT in all
#                                 → fa3-build.log, warmup.json, gpu-tests-fa3.txt/.xml, bench-fa3.txt, gpu-fa3.json
# --dry-run prints every command instead of running it. $OUT gets at most 8 files (the device's limit): all
# writes summary.txt, install.log, warmup.json, gpu-tests.txt, gpu-tests.xml, bench.txt, gpu.json; fa3 the
# seven above with summary.txt (and install.log on a fresh machine).
# FA3 is used only where warmup.json (kept with the caches) holds its build time and a successful call: until then
# SCORE_BATCH_NO_FA3 says why, tests/gpu skip FA3 and gpu.py refuses its method (bench/install_check.py fa3).
# Caches (FlashInfer JIT, inductor, Triton, warmup.json) live in the git-ignored .cache/gpu/ of the checkout, so a
# later call on the same machine reuses them. The wheels come from scripts/download_gpu_wheels.sh (carry .wheels).
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
CACHE=${GPU_CHECK_CACHE:-$PWD/.cache/gpu} # tests point it elsewhere
SITE="$CACHE/site" # pip install --target here when the image's environment is not writable
# Time limits (seconds): the device runs one command for at most 600 s (the machine's start is outside it). A
# phase gets its own share plus what the earlier phases left unused, SIGINT at its limit, SIGKILL KILL_AFTER s
# later: worst case ALL_LIMIT + 3 * KILL_AFTER = 575 s. Budgets line by line, from the JIT builds measured on a
# 2-core machine (per object: silu_and_mul 18 s, norm 59 + 21 s, rope 78 + 43 s, FA2 19-40 s, FA3 91-231 s at
# 3.6 GB) and estimates of the rest: bench/README.md, "Phase budgets".
# all = install 200 (pip and checks 35-55; FA2 + ops, 15 objects at once on 16 cores, rope.cu the longest:
# 95-125; warm-up calls 15-20) + tests 200 (FA2 exactness 30, split 10, native ops 15, torch.compile runs
# 60-90, flex 60; FA3 skipped) + bench 160 (0.6B model 20, fp32 reference 10, plain HF 15, three FA2 methods
# 25, the CLI pipeline 30-40, the compiled method 45).
ALL_LIMIT=${ALL_LIMIT:-560}
INSTALL_LIMIT=${INSTALL_LIMIT:-200}
TESTS_LIMIT=${TESTS_LIMIT:-200}
BENCH_LIMIT=${BENCH_LIMIT:-160}
# fa3 = build 330 (10 objects at once on 16 cores: the 231 s one ×1.1-1.3 for sharing the cores, + link) + tests
# 110 (FA3's cases of tests/gpu/test_flashinfer.py, 30-60) + bench 120 (model 20, fp32 reference 10, plain HF 15,
# FA2 and FA3 with FlashInfer's ops 25).
FA3_LIMIT=${FA3_LIMIT:-560}
FA3_BUILD_LIMIT=${FA3_BUILD_LIMIT:-330}
FA3_TESTS_LIMIT=${FA3_TESTS_LIMIT:-110}
FA3_BENCH_LIMIT=${FA3_BENCH_LIMIT:-120}
KILL_AFTER=5
# The short bench: workload a, the goal shape (1,500-token query × 100 items of 40: one 5,601-token pack per
# query), 4 queries; the FA2 methods of bench/gpu.py (HF layers, native + torch ops, native + FlashInfer ops),
# the whole CLI on 64 queries of that shape beside its forward alone, then native compiled (last: its compile
# time is the least sure), beside plain HF pairs. FA3: the fa3 call (FA3_BENCH); flex, sdpa, split and
# workload b: `bench --methods ...`.
SHORT_BENCH=(--workloads a --queries 4 --methods hf fi-hf-layers fi-native-torch fi-native-fi pipeline fi-native-compile)
FA3_BENCH=(--workloads a --queries 4 --methods hf fi-native-fi fa3)
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
  # JIT build seconds and dirty steps after it per module, first calls; kept with the caches for later calls.
  local warm_status=0
  run "$log" python bench/gpu.py warmup --out "$CACHE/warmup.json" || warm_status=$?
  keep_warmup
  [ "$pip_status" = 0 ] || return "$pip_status"
  return "$warm_status"
}

keep_warmup() {
  say "cp $CACHE/warmup.json $OUT/warmup.json"
  [ "$DRY" = 1 ] || [ ! -f "$CACHE/warmup.json" ] || cp "$CACHE/warmup.json" "$OUT/warmup.json"
}

installed() {
  # A fresh machine (the previous one was given back) needs the install phase again; within `all` the
  # install phase has just run (a failed one is not retried: the tests then fail on the missing import).
  # A lone phase goes on after an install that ended non-zero (a new pip-check line, say): its own
  # commands say whether the install is usable.
  if [ "${GPU_CHECK_ALL:-0}" = 1 ]; then
    :
  elif [ "$DRY" = 1 ] && [ -n "${DRY_INSTALLED:-}" ]; then
    : # a dry run lists the install once
  elif [ "$DRY" = 1 ] || ! python -c "import flashinfer" 2>/dev/null; then
    DRY_INSTALLED=1
    say "python -c 'import flashinfer' || the install phase first (a non-zero install does not stop this phase)"
    local status=0
    install || status=$?
    [ "$status" = 0 ] || echo "install ended with status $status (see $OUT/install.log); going on" >&2
  fi
  arch_list
}

no_fa3() {
  # FA3 runs only where warmup.json holds its build time and a successful call: else SCORE_BATCH_NO_FA3 (the reason)
  # makes tests/gpu skip FA3 and gpu.py refuse its method, instead of building it inside a phase that cannot fit it.
  say "python bench/install_check.py fa3 $CACHE/warmup.json → export SCORE_BATCH_NO_FA3=<why FA3 is not proven>"
  unset SCORE_BATCH_NO_FA3
  [ "$DRY" = 0 ] || return 0
  local why
  why=$(python bench/install_check.py fa3 "$CACHE/warmup.json" || echo "bench/install_check.py fa3 failed")
  if [ -n "$why" ]; then
    export SCORE_BATCH_NO_FA3="$why"
    echo "SCORE_BATCH_NO_FA3: FA3 tests skipped, its bench method refused ($why)"
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

fa3_build() {
  # FA3's build runs in the background (setsid: the phase's limit and the call's end do not stop it), so its objects
  # land in the JIT cache even when this call ends first; the next fa3 call waits for a build still running or
  # resumes it (ninja keeps every finished object). This phase waits for it until its own limit is near.
  installed
  [ "$DRY" = 1 ] || mkdir -p "$CACHE"
  local pid_file="$CACHE/fa3-build.pid" status_file="$CACHE/fa3-build.status" log="$CACHE/fa3-build.log" pid=""
  [ "$DRY" = 1 ] || [ ! -f "$pid_file" ] || pid=$(cat "$pid_file")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    echo "an earlier call's FA3 build (pid $pid) is still running: waiting for it"
  else
    say "rm -f $status_file; setsid bash -c 'python bench/gpu.py warmup --fa3 --out $CACHE/warmup.json; \
echo \$? > $status_file' > $log 2>&1 < /dev/null & echo \$! > $pid_file"
    if [ "$DRY" = 0 ]; then
      rm -f "$status_file"
      # shellcheck disable=SC2016
      env -u SCORE_BATCH_NO_FA3 setsid bash -c 'python bench/gpu.py warmup --fa3 --out "$1"; echo $? > "$2"' \
        fa3-build "$CACHE/warmup.json" "$status_file" >"$log" 2>&1 </dev/null &
      echo $! >"$pid_file"
    fi
  fi
  local deadline=$((${PHASE_LIMIT:-$FA3_BUILD_LIMIT} - 15)) # SECONDS counts from this phase's start
  say "sleep 2 until $status_file exists or this phase's limit is 15 s away"
  if [ "$DRY" = 0 ]; then
    while [ ! -f "$status_file" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 2; done
    cp "$log" "$OUT/fa3-build.log" 2>/dev/null || true
  fi
  keep_warmup
  no_fa3
  if [ "$DRY" = 0 ] && [ -n "${SCORE_BATCH_NO_FA3:-}" ]; then
    [ -f "$status_file" ] || echo "the FA3 build goes on in the background: call fa3 again (it resumes from $CACHE)"
    return 1
  fi
}

fa3_unproven() {
  # The FA3 tests and bench only once warmup.json proves FA3 (a lone phase checks for itself).
  no_fa3
  if [ "$DRY" = 0 ] && [ -n "${SCORE_BATCH_NO_FA3:-}" ]; then
    echo "not run: $SCORE_BATCH_NO_FA3"
    return 0
  fi
  return 1
}

fa3_tests() {
  installed
  fa3_unproven && return 1
  say "export SCORE_BATCH_REQUIRE_GPU=1"
  export SCORE_BATCH_REQUIRE_GPU=1
  run "$OUT/gpu-tests-fa3.txt" python -m pytest -q -rA -k fa3 tests/gpu/test_flashinfer.py \
    --junitxml="$OUT/gpu-tests-fa3.xml" --durations=0 -p no:cacheprovider
}

fa3_bench() {
  installed
  fa3_unproven && return 1
  run "$OUT/bench-fa3.txt" python bench/gpu.py bench --out "$OUT/gpu-fa3.json" "${FA3_BENCH[@]}"
}

ALL_START=$SECONDS
PLANNED=0 # dry run: the seconds the earlier phases may take at most

# phase NAME LIMIT LATER CMD...: run a phase under its limit plus the time earlier phases left unused (LATER:
# the later phases' own limits, kept for them; TOTAL: the call's), record its status, time and limit in summary.txt.
phase() {
  local name=$1 own=$2 later=$3
  shift 3
  local start=$SECONDS status=0 elapsed limit
  elapsed=$((DRY == 1 ? PLANNED : SECONDS - ALL_START))
  limit=$((TOTAL - elapsed - later))
  [ "$limit" -ge "$own" ] || limit=$own # never below its own share (the device's 600 s still stops all)
  PLANNED=$((PLANNED + limit))
  say "GPU_CHECK_ALL=$IN_ALL PHASE_LIMIT=$limit timeout -s INT --kill-after=$KILL_AFTER $limit bash $SELF $*"
  if [ "$DRY" = 1 ]; then
    local run_phase=${1//-/_} # the phase's function
    shift
    GPU_CHECK_ALL=$IN_ALL PHASE_LIMIT=$limit "$run_phase" "$@"
  else
    # A child under `timeout`: the phase's own commands stop at the limit, what they wrote stays.
    # SIGINT, not SIGTERM: pytest then still writes its summary and junit XML.
    GPU_CHECK_ALL=$IN_ALL PHASE_LIMIT=$limit timeout -s INT --kill-after=$KILL_AFTER "$limit" bash "$SELF" "$@" \
      || status=$?
  fi
  if [ "$DRY" = 1 ]; then
    echo "$name exit=<status> seconds=<time> limit=$limit  >> $OUT/summary.txt"
  else
    echo "$name exit=$status seconds=$((SECONDS - start)) limit=$limit" | tee -a "$OUT/summary.txt"
  fi
  return 0
}

summary_status() {
  if [ "$DRY" = 0 ] && grep -qv "exit=0 " "$OUT/summary.txt"; then
    echo "some phase failed: see $OUT/summary.txt" >&2
    exit 1
  fi
}

[ "$DRY" = 1 ] || mkdir -p "$OUT"
case "${1:-}" in
  install | tests | fa3-build | fa3-tests | fa3-bench)
    "${1//-/_}"
    ;;
  bench)
    shift
    bench "$@"
    ;;
  all)
    say ": > $OUT/summary.txt"
    [ "$DRY" = 1 ] || : >"$OUT/summary.txt"
    TOTAL=$ALL_LIMIT IN_ALL=1
    phase install "$INSTALL_LIMIT" $((TESTS_LIMIT + BENCH_LIMIT)) install
    phase tests "$TESTS_LIMIT" "$BENCH_LIMIT" tests
    phase bench "$BENCH_LIMIT" 0 bench "${SHORT_BENCH[@]}"
    summary_status
    ;;
  fa3)
    say ": > $OUT/summary.txt"
    [ "$DRY" = 1 ] || : >"$OUT/summary.txt"
    TOTAL=$FA3_LIMIT IN_ALL=0
    phase fa3-build "$FA3_BUILD_LIMIT" $((FA3_TESTS_LIMIT + FA3_BENCH_LIMIT)) fa3-build
    phase fa3-tests "$FA3_TESTS_LIMIT" "$FA3_BENCH_LIMIT" fa3-tests
    phase fa3-bench "$FA3_BENCH_LIMIT" 0 fa3-bench
    summary_status
    ;;
  *)
    echo "usage: bash bench/gpu_check.sh [--dry-run] install|tests|bench|all|fa3 [bench/gpu.py bench arguments]" >&2
    exit 2
    ;;
esac
