"""Start-up times of the command against the floor any transformers run pays, in fresh processes.

    python bench/startup.py [--runs 5]

Each figure is the median wall time of --runs fresh processes (min and max beside it): `--version`,
`--help`, `score --help` (target: each at most 0.5 s), `models`, a one-row run of the bundled demo model (`-o -`),
and three floors: a Python that only imports torch (the start-up target is measured against it: a one-row run
at most 1.0 s above), one that
imports torch, tokenizers, safetensors and pyarrow (what any scoring run imports), and one that also
imports transformers' model loading and the demo's model class (what a run through transformers'
modeling code imports; the demo's Qwen3 runs on the native layers and imports neither). The one-row
run minus the first floor is what score-batch itself adds (transformers' config and tokenizer classes,
reading, weights loading, the forward, writing).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FLOOR = "import torch, tokenizers, safetensors.torch, pyarrow.parquet"
TORCH = "floor: import torch"
ONE_ROW = "one-row demo run (-o -)"
# Bytecode caches written and read, as for an installed package (pip compiles them): with
# PYTHONDONTWRITEBYTECODE set, every run compiled the checkout's ~100 modules again (~0.1 s, 2 cores).
ENV = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
TRANSFORMERS_FLOOR = (
    "import torch, transformers.modeling_utils, transformers.models.qwen3.modeling_qwen3, tokenizers, pyarrow"
)


def wall(command: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds one fresh process takes, output discarded; fails loudly on a non-zero exit. The
    CPU seconds (user + system, every thread) change little when other processes load the machine."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(
        command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO, env=ENV
    )
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return elapsed, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def figures(command: list[str], runs: int) -> tuple[float, float, float, float]:
    """(median, min, max) wall seconds of runs fresh processes, and their median CPU seconds."""
    times, cpu = zip(*(wall(command) for _ in range(runs)))
    return statistics.median(times), min(times), max(times), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    cli = [sys.executable, "-m", "score_batch.cli.main"]
    with tempfile.TemporaryDirectory() as tmp:
        one_row = Path(tmp) / "one.jsonl"
        one_row.write_text((REPO / "sample_data/products.jsonl").read_text().splitlines()[0] + "\n")
        cases = {
            "--version": cli + ["--version"],
            "--help": cli + ["--help"],
            "score --help": cli + ["score", "--help"],
            "models": cli + ["models"],
            TORCH: [sys.executable, "-c", "import torch"],
            "floor: import torch, tokenizers, pyarrow": [sys.executable, "-c", FLOOR],
            "floor with transformers' modeling code": [sys.executable, "-c", TRANSFORMERS_FLOOR],
            ONE_ROW: cli + [str(one_row), "-o", "-", "--quiet"],
        }
        wall(cases[ONE_ROW])  # bytecode caches written, files in the page cache
        load = os.getloadavg()[0]
        results = {name: figures(command, args.runs) for name, command in cases.items()}
        load, before = os.getloadavg()[0], load
    print(f"load average before: {before:.1f}, after: {load:.1f}")
    for name, (median, low, high, cpu) in results.items():
        print(f"{name:42s} {median:6.2f} s  (min {low:.2f}, max {high:.2f}; CPU {cpu:.2f} s)")
    run, floor, torch_only = (
        results[name] for name in (ONE_ROW, "floor: import torch, tokenizers, pyarrow", TORCH)
    )
    print(
        f"{'score-batch on top of the floor':42s} {run[0] - floor[0]:6.2f} s  (CPU {run[3] - floor[3]:.2f} s)"
    )
    print(
        f"{'one-row run above import torch':42s} {run[0] - torch_only[0]:6.2f} s  (CPU {run[3] - torch_only[3]:.2f} s;"
        " target: at most 1.0 s)"
    )


if __name__ == "__main__":
    main()
