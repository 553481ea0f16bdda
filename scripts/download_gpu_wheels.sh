#!/usr/bin/env bash
# Download the wheels of bench/gpu_wheels.txt for the GPU image (CPython 3.12, manylinux x86_64) into
# DIR (default .wheels/, git-ignored), on a machine with network; bench/gpu_check.sh install uses them.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.wheels}
mkdir -p "$dir"
python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$dir" -r bench/gpu_wheels.txt
ls -l "$dir"/*.whl
total=$(du -cb "$dir"/*.whl | tail -1 | cut -f1)
echo "total: $((total / 1024 / 1024)) MiB in $(ls "$dir"/*.whl | wc -l) wheels (a device call carries at most 64 MiB)"
if [ "$total" -gt $((64 * 1024 * 1024)) ]; then
  echo "too large to carry" >&2
  exit 1
fi
