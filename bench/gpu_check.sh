#!/usr/bin/env bash
# The GPU run in one script (see bench/README.md, "First GPU run"). Phases, each writing under $OUT:
#   bash bench/gpu_check.sh [--dry-run] probe     CUDA_HOME from the real nvcc, then a two-line CUDA program linked
#                                                 with FlashInfer's own link flags (-lcudart -lcuda): seconds, one
#                                                 line on failure; the install phase runs it before anything else
#   bash bench/gpu_check.sh [--dry-run] install   the probe, carried wheels (resolved against the image) + pip
#                                                 check, the project, carried JIT modules unpacked, FlashInfer's
#                                                 JIT warm-up through its own module getters (FA2 and the ops at
#                                                 once; FA3 started after them in the background on Hopper), one
#                                                 call with torch ops and one with FlashInfer's
#                                                                                   → install.log, warmup.json
#   bash bench/gpu_check.sh [--dry-run] tests [MODULE...]  tests/gpu (or the modules named), most valuable first;
#                                                 missing CUDA/flashinfer fails
#                                                                                   → gpu-tests.txt/.xml
#   bash bench/gpu_check.sh [--dry-run] bench [bench/gpu.py bench arguments]        → bench.txt, gpu.json
#   bash bench/gpu_check.sh [--dry-run] host [bench/host_path.py arguments]  the host path alone on this machine's
#                                                 cores (no GPU: read → tokenize → plan → Parquet against the
#                                                 tokenizer's own batch rate; HOST_BENCH by default)   → host.txt
#   bash bench/gpu_check.sh [--dry-run] profile [bench/gpu_profile.py arguments]  install (no FA3 build beside
#                                                 it) → where one forward's milliseconds go at the goal shape, at
#                                                 most PROFILE_LIMIT s, each step's file written as it ends (FA3
#                                                 only where JIT_MODULES carries its module) → collect
#                                         → summary.txt, install.log, warmup.json, profile.json, profile.txt,
#                                           profile.log, trace-4.json.gz, jit-modules.tar.gz
#   bash bench/gpu_check.sh [--dry-run] all       install → tests → the short bench (FA3 last, once its background
#                                                 build finished) → collect, in one device command: each phase
#                                                 under its own limit plus what earlier phases left unused; later
#                                                 phases run even when an earlier one failed
#                                                                         → the 7 files above + jit-modules.tar.gz
# all's exit status: 0 every phase ended well; 1 data came back but a phase failed or was cut at its limit
# (summary.txt names the phase and the step it cut); 3 nothing to report (neither test results nor gpu.json).
# --dry-run prints every command instead of running it, with each phase's estimate beside its limit. $OUT gets at
# most 8 files (the device's limit): summary.txt, install.log, warmup.json, gpu-tests.txt, gpu-tests.xml,
# bench.txt, gpu.json, jit-modules.tar.gz (the built modules' .so files: carried into a later call as
# JIT_MODULES, they load from FlashInfer's AOT folder without compiling).
# FA3 runs only once its build and first call succeeded (warmup-fa3.json, kept with the caches): until then
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
# later; collect has COLLECT_LIMIT: worst case ALL_LIMIT + COLLECT_LIMIT + 4 * KILL_AFTER = 585 s. Each phase's
# estimate (the upper end, line by line in bench/README.md, "Phase budgets") is at most 70% of its limit
# (tests/test_gpu_install.py checks it), from the H200 runs (install 46-73 s with the JIT, tests 67-83 s, bench
# 62-74 s) and estimates of what they did not run. install: probe, pip and checks, FA2 + ops built at once on 16
# cores, warm-up calls → 160 of 235. tests (ALL_TESTS: FA2's exactness, bf16 numerics against plain HF bf16, the
# goal-shape isolation, split, native ops; waiting for FA3's build) → 85 of 125. bench: model 20, fp32 reference
# 10, plain HF 15, three FA2 methods 25, the CLI pipeline 30-40, the XLM-R encoder 20-30 (beside FA3's build),
# FA3 5-10 once built → measured 62-74 without the encoder, ≤ 120 of 175 (waiting for FA3's build is bounded by
# the phase's deadline).
ALL_LIMIT=${ALL_LIMIT:-535}
INSTALL_LIMIT=${INSTALL_LIMIT:-235}
TESTS_LIMIT=${TESTS_LIMIT:-125}
BENCH_LIMIT=${BENCH_LIMIT:-175}
COLLECT_LIMIT=${COLLECT_LIMIT:-30}
# The profile call: install, then bench/gpu_profile.py under its own limit (at most 5 minutes after the install),
# then collect: 235 + 300 + 30 + 3 * KILL_AFTER = 580 s. Its steps' estimates (gpu_profile.py ESTIMATES): model
# build and load 25, profile 20, attention 5, GEMMs 5, sweep 25, graph 10, CLI 40 → 130, rounded up to 150.
PROFILE_LIMIT=${PROFILE_LIMIT:-300}
PROFILE_ESTIMATE=150
INSTALL_ESTIMATE=160
TESTS_ESTIMATE=85
BENCH_ESTIMATE=120
COLLECT_ESTIMATE=10
# FA3's build: 10 objects at once on 16 cores, the slowest (231 s here) ×1.1-1.3 + link → 255-300 s at nice 19,
# started as soon as FA2's modules are built, beside the tests and the bench (which use the GPU, not the cores).
FA3_BUILD_ESTIMATE=300
FA3_RESERVE=25 # seconds the bench keeps for its FA3 row after waiting for the build
KILL_AFTER=5
# The short bench: workload a, the goal shape (1,500-token query × 100 items of 40: one 5,601-token pack per
# query), 4 queries; the FA2 methods of bench/gpu.py (HF layers, native + torch ops, native + FlashInfer ops),
# the whole CLI on 64 queries of that shape beside its forward alone, plain HF pairs, the XLM-R-large-shaped
# encoder on 30 + 300-token pairs (while FA3 builds), then FA3 (last: it waits for its build). The compiled method, flex, sdpa, split and workload b: `bench --methods ...` in a later call.
SHORT_BENCH=(--workloads a --queries 4 --methods hf fi-hf-layers fi-native-torch fi-native-fi pipeline xlmr fa3)
# The host path on the GPU machine's cores (bench/host_path.py; about 2-3 minutes on 16 cores): both shapes, 100k items.
HOST_BENCH=(--items 100000 --shapes 1000x27 1500x40 --repeats 2 --modes dry zero pooled ceiling jsonl cli)
# Most valuable first: a phase cut at its limit loses the last module. `all` runs ALL_TESTS (what fits its tests
# phase with margin); a lone `tests` call runs them all.
ALL_TESTS=(
  tests/gpu/test_flashinfer.py
  tests/gpu/test_bf16_numerics.py
  tests/gpu/test_isolation.py
  tests/gpu/test_flashinfer_split.py
  tests/gpu/test_native_ops.py
)
GPU_TESTS=(
  "${ALL_TESTS[@]}"
  tests/gpu/test_flashinfer_runs.py
  tests/gpu/test_flex_compile.py
  tests/gpu/test_two_phase.py
  tests/gpu/test_fp8.py
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

# run LOG CMD...: print the command; unless dry, run it with its output also appended to LOG. The command is kept in
# $CACHE/step, so a phase cut at its limit says which step it cut.
run() {
  local log=$1
  shift
  say "$(printf '%q ' "$@")"
  [ "$DRY" = 1 ] && return 0
  printf '%q ' "$@" >"$CACHE/step" 2>/dev/null || true
  "$@" 2>&1 | tee -i -a "$log" # -i: tee outlives the phase's SIGINT and keeps the last lines
}

# --- the link probe: FlashInfer's link step proven in seconds, before minutes of compiling ---------------------
# FlashInfer 0.6.6 takes CUDA_HOME (else the folder above `which nvcc`), compiles with $CUDA_HOME/bin/nvcc and
# links every module with `-shared -L$CUDA_HOME/lib64 -L$CUDA_HOME/lib64/stubs -lcudart -lcuda
# $FLASHINFER_EXTRA_LDFLAGS` (jit/cpp_ext.py). A wrapper script or a link named nvcc in /usr/local/bin gives the
# wrong folder, and the pip cuda-toolkit has no lib64/: the link then fails after every object compiled.

cuda_home() {
  # CUDA_HOME as given, else the real nvcc's: nvcc --dryrun names its own folder (_HERE_, through any wrapper),
  # readlink -f resolves the links to it.
  if [ -n "${CUDA_HOME:-}" ]; then
    say "CUDA_HOME=$CUDA_HOME (given)"
    return 0
  fi
  say "export CUDA_HOME=\$(dirname \$(dirname \$(readlink -f <nvcc --dryrun's _HERE_>/nvcc)))"
  [ "$DRY" = 1 ] && return 0
  local here real
  here=$(nvcc --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=//p' | head -1) || true
  real=$(readlink -f "${here:-$(dirname "$(command -v nvcc)")}/nvcc")
  CUDA_HOME=$(dirname "$(dirname "$real")")
  export CUDA_HOME
  echo "CUDA_HOME=$CUDA_HOME (from $real)"
}

link_once() {
  # FlashInfer's link rule for one object, its flags in its order; the linker's output in $1.
  # shellcheck disable=SC2086
  ${CXX:-c++} "$PROBE/probe.o" -shared -L"$CUDA_HOME/lib64" -L"$CUDA_HOME/lib64/stubs" -lcudart -lcuda \
    ${FLASHINFER_EXTRA_LDFLAGS:-} -o "$PROBE/probe.so" >"$1" 2>&1
}

find_lib() {
  # A lib$1.so the linker can be pointed at: under CUDA_HOME (lib64, lib, targets/*/lib, their stubs/), in the pip
  # CUDA packages on sys.path (nvidia/*/lib), or the driver's (ldconfig); the first path found, versioned or not.
  local name=$1 f
  for f in "$CUDA_HOME"/{lib64,lib,targets/*/lib}{,/stubs}/lib"$name".so{,.*}; do
    [ -e "$f" ] && { echo "$f"; return 0; }
  done
  f=$(python3 -c 'import glob, os, sys
found = [p for d in sys.path if d for p in sorted(glob.glob(os.path.join(d, "nvidia", "*", "lib", "lib%s.so*" % sys.argv[1])))]
print(found[0] if found else "")' "$name" 2>/dev/null || true)
  [ -n "$f" ] || f=$(ldconfig -p 2>/dev/null | awk -v n="lib$name.so" 'index($1, n) == 1 { print $NF; exit }')
  echo "$f"
}

probe() {
  # Compile a two-line CUDA program with FlashInfer's nvcc, link it as FlashInfer links; where a library is not
  # found, point FLASHINFER_EXTRA_LDFLAGS at a copy (a versioned one through a lib$name.so link in $CACHE/ld).
  # Seconds; one line and status 1 when it cannot link. CUDA_HOME and the flags go to $CACHE/cuda.env.
  cuda_home
  local nvcc=${FLASHINFER_NVCC:-${CUDA_HOME:-\$CUDA_HOME}/bin/nvcc}
  say "$nvcc -c -Xcompiler -fPIC probe.cu && ${CXX:-c++} probe.o -shared -L\$CUDA_HOME/lib64 \
-L\$CUDA_HOME/lib64/stubs -lcudart -lcuda \$FLASHINFER_EXTRA_LDFLAGS -o probe.so (missing: -L<a copy found>)"
  [ "$DRY" = 1 ] && return 0
  local start=$SECONDS name lib dir out
  PROBE="$CACHE/link-probe"
  mkdir -p "$PROBE"
  printf '#include <cuda.h>\n#include <cuda_runtime.h>\nint probe() { return cuInit(0) + cudaFree(0); }\n' \
    >"$PROBE/probe.cu"
  if ! "$nvcc" -c -Xcompiler -fPIC "$PROBE/probe.cu" -o "$PROBE/probe.o" >"$PROBE/nvcc.txt" 2>&1; then
    echo "link probe FAILED: $nvcc (FlashInfer's compiler under CUDA_HOME=$CUDA_HOME) cannot compile: \
$(grep -m1 -i -e error -e 'not found' "$PROBE/nvcc.txt" || tail -1 "$PROBE/nvcc.txt")" >&2
    return 1
  fi
  for name in cudart cuda; do
    link_once "$PROBE/link.txt" && break
    grep -q -- "-l$name\b" "$PROBE/link.txt" || continue
    lib=$(find_lib "$name")
    [ -n "$lib" ] || continue
    dir=$(dirname "$lib")
    if [ "$(basename "$lib")" != "lib$name.so" ]; then # versioned only: a link the linker finds
      dir="$CACHE/ld"
      mkdir -p "$dir"
      ln -sf "$lib" "$dir/lib$name.so"
    fi
    FLASHINFER_EXTRA_LDFLAGS="${FLASHINFER_EXTRA_LDFLAGS:+$FLASHINFER_EXTRA_LDFLAGS }-L$dir"
    export FLASHINFER_EXTRA_LDFLAGS
    echo "lib$name.so is not where FlashInfer links from: using $lib (FLASHINFER_EXTRA_LDFLAGS=$FLASHINFER_EXTRA_LDFLAGS)"
  done
  if ! link_once "$PROBE/link.txt"; then
    out=$(grep -m1 -e "cannot find" -e "error" "$PROBE/link.txt" || tail -1 "$PROBE/link.txt")
    echo "link probe FAILED in $((SECONDS - start)) s: ${out#*: } with CUDA_HOME=$CUDA_HOME \
FLASHINFER_EXTRA_LDFLAGS='${FLASHINFER_EXTRA_LDFLAGS:-}' (no copy under CUDA_HOME, in sys.path's nvidia/*/lib \
or ldconfig): set CUDA_HOME or FLASHINFER_EXTRA_LDFLAGS=-L<folder>; nothing compiled" >&2
    return 1
  fi
  printf 'export CUDA_HOME=%q FLASHINFER_EXTRA_LDFLAGS=%q\n' "$CUDA_HOME" "${FLASHINFER_EXTRA_LDFLAGS:-}" \
    >"$CACHE/cuda.env"
  echo "link probe passed in $((SECONDS - start)) s: CUDA_HOME=$CUDA_HOME \
FLASHINFER_EXTRA_LDFLAGS='${FLASHINFER_EXTRA_LDFLAGS:-}'"
}

cuda_env() {
  # A later phase (its own process) takes the probe's CUDA_HOME and link flags.
  say "source $CACHE/cuda.env  # CUDA_HOME and FLASHINFER_EXTRA_LDFLAGS the probe found"
  # shellcheck disable=SC1091
  [ "$DRY" = 1 ] || [ ! -f "$CACHE/cuda.env" ] || source "$CACHE/cuda.env"
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
  # The link first: seconds, and no JIT build starts where its link would fail after minutes of compiling.
  local probe_status=0
  if [ "$DRY" = 1 ]; then
    probe
  else
    probe 2>&1 | tee -a "$log" || probe_status=$? # a subshell: its CUDA_HOME comes back through cuda.env
    [ "$probe_status" != 0 ] || cuda_env >/dev/null
  fi
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
  if [ "$probe_status" != 0 ]; then
    echo "no JIT warm-up: the link probe failed (above)" | tee -a "$log" >&2
    return 3
  fi
  carried_modules
  # JIT build seconds and dirty steps after it per module, first calls; kept with the caches for later calls.
  # FA3's build starts (in the background, at low priority) as soon as FA2's modules are built.
  # GPU_CHECK_FA3_BUILD=0 (the profile call): no FA3 build beside the phases (its compiles would share the cores
  # with the host work the profile measures); FA3 then runs only where its module was carried in.
  local warm_status=0 after=(--after-build "bash $SELF fa3-start")
  [ "${GPU_CHECK_FA3_BUILD:-1}" = 1 ] || after=()
  run "$log" python bench/gpu.py warmup --out "$CACHE/warmup.json" "${after[@]}" || warm_status=$?
  [ "$DRY" = 0 ] || [ "${#after[@]}" = 0 ] || fa3_start # what --after-build starts
  keep_warmup
  [ "$pip_status" = 0 ] || return "$pip_status"
  return "$warm_status"
}

carried_modules() {
  # JIT modules a former call returned (jit-modules.tar.gz, carried as JIT_MODULES): into FlashInfer's AOT folder,
  # which FlashInfer loads from before building anything (a module there compiles nothing).
  say "[ -f \$JIT_MODULES ] && tar -xzf \$JIT_MODULES -C <flashinfer.jit.env.FLASHINFER_AOT_DIR>"
  [ "$DRY" = 0 ] && [ -f "${JIT_MODULES:-}" ] || return 0
  local aot
  aot=$(python -c 'import flashinfer.jit.env as e; print(e.FLASHINFER_AOT_DIR)') || return 0
  [ -n "$aot" ] || return 0
  mkdir -p "$aot" && tar -xzf "$JIT_MODULES" -C "$aot" && echo "carried modules in $aot: $(ls "$aot" | tr '\n' ' ')"
}
keep_warmup() {
  # warmup.json in $OUT: the install's record with FA3's (warmup-fa3.json, written by the background build) merged in.
  say "python bench/install_check.py merge $OUT/warmup.json $CACHE/warmup.json $CACHE/warmup-fa3.json"
  [ "$DRY" = 1 ] || python bench/install_check.py merge "$OUT/warmup.json" "$CACHE/warmup.json" \
    "$CACHE/warmup-fa3.json" || true
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
  cuda_env
  arch_list
}

no_fa3() {
  # FA3 runs only where warmup-fa3.json holds its build time and a successful call: else SCORE_BATCH_NO_FA3 (the
  # reason) makes tests/gpu skip FA3 and gpu.py refuse its method, instead of building it inside a phase.
  say "python bench/install_check.py fa3 $CACHE/warmup-fa3.json → export SCORE_BATCH_NO_FA3=<why FA3 is not proven>"
  unset SCORE_BATCH_NO_FA3
  [ "$DRY" = 0 ] || return 0
  local why
  why=$(python bench/install_check.py fa3 "$CACHE/warmup-fa3.json" || echo "bench/install_check.py fa3 failed")
  if [ -n "$why" ]; then
    export SCORE_BATCH_NO_FA3="$why"
    echo "SCORE_BATCH_NO_FA3: FA3 tests skipped, its bench method refused ($why)"
  fi
}

fa3_building() { [ -f "$CACHE/fa3-build.pid" ] && [ ! -f "$CACHE/fa3-build.status" ]; }

wait_fa3() {
  # While FA3's background build runs, wait for it up to what the phase's limit leaves beyond its estimate, so
  # its tests run instead of skipping (the first H200 run: FA3 done 40 s after the tests phase began).
  local spare=$((${PHASE_LIMIT:-$TESTS_LIMIT} - TESTS_ESTIMATE - 10))
  say "wait for FA3's background build (at most $spare s) while it runs"
  [ "$DRY" = 0 ] && [ "$spare" -gt 0 ] || return 0
  local until=$(($(date +%s) + spare))
  while fa3_building && [ "$(date +%s)" -lt "$until" ]; do sleep 2; done
}

tests() {
  installed
  wait_fa3
  no_fa3
  say "export SCORE_BATCH_REQUIRE_GPU=1"
  export SCORE_BATCH_REQUIRE_GPU=1
  local modules=("${GPU_TESTS[@]}")
  [ "${GPU_CHECK_ALL:-0}" = 0 ] || modules=("${ALL_TESTS[@]}")
  [ $# = 0 ] || modules=("$@") # tests MODULE...: those alone
  # A failed import in one module must not stop the others (flex needs only CUDA).
  run "$OUT/gpu-tests.txt" python -m pytest -q -rA "${modules[@]}" --junitxml="$OUT/gpu-tests.xml" \
    --continue-on-collection-errors --durations=0 -p no:cacheprovider
}

bench() {
  installed
  local status_file="$CACHE/fa3-build.status"
  fa3_building || no_fa3 # a build under way has no record yet: the bench waits for it below
  if [ "$DRY" = 1 ] || fa3_building; then
    # FA3's build is still running: gpu.py waits for it when it reaches the fa3 method, until FA3_RESERVE s
    # before this phase's limit, then benches FA3 if it built and its first call succeeded (warmup-fa3.json).
    local deadline=$(($(date +%s) + ${PHASE_LIMIT:-$BENCH_LIMIT} - FA3_RESERVE))
    say "export GPU_CHECK_FA3_STATUS=$status_file GPU_CHECK_FA3_RECORD=$CACHE/warmup-fa3.json \
GPU_CHECK_FA3_DEADLINE=<this phase's limit - $FA3_RESERVE s>  # while FA3's build runs"
    export GPU_CHECK_FA3_STATUS="$status_file" GPU_CHECK_FA3_RECORD="$CACHE/warmup-fa3.json"
    export GPU_CHECK_FA3_DEADLINE=$deadline
    unset SCORE_BATCH_NO_FA3
  fi
  run "$OUT/bench.txt" python bench/gpu.py bench --out "$OUT/gpu.json" "$@"
}

carried_fa3() {
  # Whether the carried JIT modules (JIT_MODULES) hold FA3's prefill (its module's name ends in _sm90).
  [ -f "${JIT_MODULES:-}" ] && tar -tzf "$JIT_MODULES" 2>/dev/null | grep -q '_sm90/'
}

profile_run() {
  # bench/gpu_profile.py: where one forward's milliseconds go at the goal shape, each step written under $OUT as
  # soon as it ends (profile.json, profile.txt, trace-4.json.gz); FA3 only where its module was carried in.
  installed
  local fa3=()
  say "tar -tzf \$JIT_MODULES | grep -q _sm90/ && FA3 too (--fa3)"
  if [ "$DRY" = 0 ] && carried_fa3; then fa3=(--fa3); fi
  run "$OUT/profile.log" python bench/gpu_profile.py --out-dir "$OUT" "${fa3[@]}" "$@"
}

host() {
  installed
  local args=("${HOST_BENCH[@]}")
  [ $# = 0 ] || args=("$@")
  run "$OUT/host.txt" python bench/host_path.py "${args[@]}"
}

fa3_start() {
  # FA3's build (and first call) in the background at nice 19, started by the warm-up as soon as FA2's modules are
  # built: its 10 objects use the cores while the tests and the bench use the GPU. setsid: neither a phase's limit
  # nor the call's end stops it; it records into warmup-fa3.json, then writes its status.
  local status_file="$CACHE/fa3-build.status" log="$CACHE/fa3-build.log"
  say "rm -f $status_file; setsid nice -n 19 bash -c 'python bench/gpu.py warmup --fa3 --out $CACHE/warmup-fa3.json; \
echo \$? > $status_file' > $log 2>&1 < /dev/null & echo \$! > $CACHE/fa3-build.pid  # estimate ${FA3_BUILD_ESTIMATE} s"
  [ "$DRY" = 0 ] || return 0
  cuda_env >/dev/null
  mkdir -p "$CACHE"
  rm -f "$status_file"
  # shellcheck disable=SC2016
  env -u SCORE_BATCH_NO_FA3 setsid nice -n 19 bash -c 'python bench/gpu.py warmup --fa3 --out "$1"; echo $? > "$2"' \
    fa3-build "$CACHE/warmup-fa3.json" "$status_file" >"$log" 2>&1 </dev/null &
  echo $! >"$CACHE/fa3-build.pid"
  echo "FA3's build started in the background (pid $!, log $log)"
}

collect() {
  # What a later call can use: warmup.json with FA3's record, the built modules' .so files in one archive (≤ 16 MiB,
  # the device's limit per file; FA3's left out when too big), the end of FA3's build log in install.log.
  keep_warmup
  local archive="$OUT/jit-modules.tar.gz" log="$CACHE/fa3-build.log" ops
  say "tar -czf $archive -C <the JIT cache's cached_ops> <module>/<module>.so ...  # at most 16 MiB"
  say "tail -n 40 $log >> $OUT/install.log"
  [ "$DRY" = 0 ] || return 0
  if [ -f "$log" ]; then
    { echo "--- FA3's build ($([ -f "$CACHE/fa3-build.status" ] && echo "status $(cat "$CACHE/fa3-build.status")" \
        || echo "still running at the end of the call")), the end of $log:"; tail -n 40 "$log"; } >>"$OUT/install.log"
  fi
  ops=$(find "$CACHE/.cache/flashinfer" -type d -name cached_ops 2>/dev/null | head -1) || true
  [ -n "$ops" ] || return 0
  local names=() so name
  for so in "$ops"/*/*.so; do
    [ -f "$so" ] || continue
    name=$(basename "$(dirname "$so")")
    if [ "$(basename "$so")" = "$name.so" ]; then names+=("$name/$name.so"); fi
  done
  [ "${#names[@]}" -gt 0 ] || return 0
  tar -czf "$archive" -C "$ops" "${names[@]}"
  if [ "$(stat -c %s "$archive")" -gt $((16 * 1024 * 1024)) ]; then
    echo "jit-modules.tar.gz is over 16 MiB with FA3: FA2 and the ops only" >&2
    local kept=()
    for name in "${names[@]}"; do [[ $name == *sm90* ]] || kept+=("$name"); done
    tar -czf "$archive" -C "$ops" "${kept[@]}"
  fi
  echo "jit-modules.tar.gz: $(tar -tzf "$archive" | tr '\n' ' ')($(($(stat -c %s "$archive") / 1024)) KiB)"
}

ALL_START=$SECONDS
PLANNED=0 # dry run: the seconds the earlier phases may take at most

# phase NAME LIMIT ESTIMATE LATER CMD...: run a phase under its limit plus the time earlier phases left unused
# (LATER: the later phases' own limits, kept for them; TOTAL: the call's), record its status, time, limit and
# estimate in summary.txt, and the step it was running when its limit cut it.
phase() {
  local name=$1 own=$2 estimate=$3 later=$4
  shift 4
  local start=$SECONDS status=0 elapsed limit cut=""
  elapsed=$((DRY == 1 ? PLANNED : SECONDS - ALL_START))
  limit=$((TOTAL - elapsed - later))
  [ "$limit" -ge "$own" ] || limit=$own # never below its own share (the device's 600 s still stops all)
  PLANNED=$((PLANNED + limit))
  say "phase $name: estimate $estimate s, limit $limit s (own share $own)"
  say "GPU_CHECK_ALL=$IN_ALL PHASE_LIMIT=$limit timeout -s INT --kill-after=$KILL_AFTER $limit bash $SELF $*"
  if [ "$DRY" = 1 ]; then
    local run_phase=${1//-/_} # the phase's function
    shift
    GPU_CHECK_ALL=$IN_ALL PHASE_LIMIT=$limit "$run_phase" "$@"
    echo "$name exit=<status> seconds=<time> limit=$limit estimate=$estimate  >> $OUT/summary.txt"
    return 0
  fi
  rm -f "$CACHE/step"
  # A child under `timeout`: the phase's own commands stop at the limit, what they wrote stays.
  # SIGINT, not SIGTERM: pytest then still writes its summary and junit XML.
  GPU_CHECK_ALL=$IN_ALL PHASE_LIMIT=$limit timeout -s INT --kill-after=$KILL_AFTER "$limit" bash "$SELF" "$@" \
    || status=$?
  if [ "$status" = 124 ] || [ "$status" = 137 ]; then
    cut=" cut at its limit in: $(cat "$CACHE/step" 2>/dev/null || echo "<no step recorded>")"
  fi
  echo "$name exit=$status seconds=$((SECONDS - start)) limit=$limit estimate=$estimate$cut" | tee -a "$OUT/summary.txt"
  return 0
}

summary_status() {
  # 0: every phase ended well; 1: data came back, but a phase failed or was cut; 3: nothing to report (none of
  # the files named, by default all's test results and gpu.json).
  [ "$DRY" = 0 ] || return 0
  grep -qv "exit=0 " "$OUT/summary.txt" || return 0
  local name reported=0
  for name in "${@:-gpu.json gpu-tests.xml}"; do
    for name in $name; do [ ! -s "$OUT/$name" ] || reported=1; done
  done
  if [ "$reported" = 0 ]; then
    echo "nothing to report: none of ${*:-gpu.json gpu-tests.xml} (see $OUT/summary.txt and install.log)" >&2
    exit 3
  fi
  echo "data came back, but a phase failed or was cut: see $OUT/summary.txt" >&2
  exit 1
}

[ "$DRY" = 1 ] || mkdir -p "$OUT" "$CACHE"
case "${1:-}" in
  probe | install | fa3-start | collect)
    "${1//-/_}"
    ;;
  tests)
    shift
    tests "$@"
    ;;
  bench)
    shift
    bench "$@"
    ;;
  host)
    shift
    host "$@"
    ;;
  profile-run)
    shift
    profile_run "$@"
    ;;
  profile)
    # install → profile (at most PROFILE_LIMIT s, never more: TOTAL=0 gives each phase its own share alone) →
    # collect (the built modules for the next call's JIT_MODULES); no FA3 build beside them.
    shift
    say ": > $OUT/summary.txt"
    [ "$DRY" = 1 ] || : >"$OUT/summary.txt"
    export GPU_CHECK_FA3_BUILD=0
    TOTAL=0 IN_ALL=1
    phase install "$INSTALL_LIMIT" "$INSTALL_ESTIMATE" 0 install
    phase profile "$PROFILE_LIMIT" "$PROFILE_ESTIMATE" 0 profile-run "$@"
    phase collect "$COLLECT_LIMIT" "$COLLECT_ESTIMATE" 0 collect
    summary_status profile.json
    ;;
  all)
    say ": > $OUT/summary.txt"
    [ "$DRY" = 1 ] || : >"$OUT/summary.txt"
    TOTAL=$ALL_LIMIT IN_ALL=1
    phase install "$INSTALL_LIMIT" "$INSTALL_ESTIMATE" $((TESTS_LIMIT + BENCH_LIMIT)) install
    phase tests "$TESTS_LIMIT" "$TESTS_ESTIMATE" "$BENCH_LIMIT" tests
    phase bench "$BENCH_LIMIT" "$BENCH_ESTIMATE" 0 bench "${SHORT_BENCH[@]}"
    TOTAL=$((ALL_LIMIT + COLLECT_LIMIT))
    phase collect "$COLLECT_LIMIT" "$COLLECT_ESTIMATE" 0 collect
    summary_status
    ;;
  *)
    echo "usage: bash bench/gpu_check.sh [--dry-run] probe|install|tests|bench|host|profile|all [the bench's arguments]" >&2
    exit 2
    ;;
esac
