"""Peak RSS of score-batch for 1x and 10x inputs of the same shape (bounded-memory check).

    python bench/memory.py [--rows 2000]

Runs the CLI in fresh processes on the demo model and prints peak RSS from each run's report.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def write_input(path: Path, rows: int) -> None:
    """Long-layout JSONL: 10 items per query, product-search-like text."""
    rng = random.Random(0)
    words = ["red", "blue", "running", "shoes", "mug", "lamp", "jacket", "waterproof", "Acme", "Orbit"]
    with open(path, "w") as out:
        for i in range(rows):
            query = " ".join(rng.choice(words) for _ in range(4))
            item = " ".join(rng.choice(words) for _ in range(12))
            out.write(json.dumps({"query_id": i // 10, "query": query, "item": item}) + "\n")


def peak_rss(rows: int, tmp: Path) -> dict:
    """Run one job and return its report."""
    data, out, report = tmp / f"in-{rows}.jsonl", tmp / f"out-{rows}.parquet", tmp / f"report-{rows}.json"
    write_input(data, rows)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "score_batch.cli.main",
            str(data),
            "-o",
            str(out),
            "--report",
            str(report),
            "--quiet",
        ],
        cwd=REPO,
        check=True,
    )
    return json.loads(report.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        small, large = peak_rss(args.rows, Path(tmp)), peak_rss(args.rows * 10, Path(tmp))
    growth = large["peak_rss_mb"] / small["peak_rss_mb"] - 1
    for name, r in (("1x", small), ("10x", large)):
        print(
            f"{name:>4}: {r['rows_read']:7d} rows  peak RSS {r['peak_rss_mb']:7.1f} MB  {r['items_per_second']:8.1f} items/s"
        )
    print(f"peak RSS growth 1x → 10x: {growth * 100:+.1f}% (limit +25%)")


if __name__ == "__main__":
    main()
