"""Start-up times of the command against the floor any transformers run pays, in fresh processes.

    python bench/startup.py [--runs 5]

Each figure is the median wall time of --runs fresh processes (min and max beside it): `--version`,
`--help`, `models`, a one-row run of the bundled demo model (`-o -`), and two floors: a Python that only
imports torch, tokenizers, safetensors and pyarrow (what any scoring run imports), and one that also
imports transformers' model loading and the demo's model class (what a run through transformers'
modeling code imports; the demo's Qwen3 runs on the native layers and imports neither). The one-row
run minus the first floor is what score-batch itself adds (transformers' config and tokenizer classes,
reading, weights loading, the forward, writing).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FLOOR = "import torch, tokenizers, safetensors.torch, pyarrow.parquet"
TRANSFORMERS_FLOOR = (
    "import torch, transformers.modeling_utils, transformers.models.qwen3.modeling_qwen3, tokenizers, pyarrow"
)


def wall(command: list[str]) -> float:
    """Seconds one fresh process takes, output discarded; fails loudly on a non-zero exit."""
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    return time.perf_counter() - started


def figures(command: list[str], runs: int) -> tuple[float, float, float]:
    """(median, min, max) of runs fresh processes."""
    times = [wall(command) for _ in range(runs)]
    return statistics.median(times), min(times), max(times)


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
            "models": cli + ["models"],
            "floor: import torch, tokenizers, pyarrow": [sys.executable, "-c", FLOOR],
            "floor with transformers' modeling code": [sys.executable, "-c", TRANSFORMERS_FLOOR],
            "one-row demo run (-o -)": cli + [str(one_row), "-o", "-", "--quiet"],
        }
        wall(cases["one-row demo run (-o -)"])  # bytecode caches written, files in the page cache
        results = {name: figures(command, args.runs) for name, command in cases.items()}
    for name, (median, low, high) in results.items():
        print(f"{name:42s} {median:6.2f} s  (min {low:.2f}, max {high:.2f})")
    added = results["one-row demo run (-o -)"][0] - results["floor: import torch, tokenizers, pyarrow"][0]
    print(f"{'score-batch on top of the floor':42s} {added:6.2f} s")


if __name__ == "__main__":
    main()
