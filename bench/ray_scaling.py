"""What Ray adds: a local run against `--ray --num-workers 1` on the same inputs of two sizes, through the CLI.

    python bench/ray_scaling.py [--items 10000 50000] [--query-tokens 1000] [--item-tokens 27] [--cpus-per-worker 1]

The short-item shape (100 items of ~27 tokens per ~1,000-token query) with a 1-layer Qwen3 classifier. Each run's
wall time is timed as a whole process (Ray's start included); the items/s *added* between the two sizes
((large - small) / (t_large - t_small)) is the rate at which each runner scores once started, and its fixed
start is what the small run costs beyond that rate. Target: Ray's added rate ≥ 0.8 of the local run's.
--cpus-per-worker is the actor's (its torch threads); the local run's torch takes every core.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import machine  # noqa: E402
from bench.host_path import one_layer_classifier, write_input  # noqa: E402


def timed(*args) -> float:
    """Seconds one CLI process takes (it must succeed)."""
    start = time.perf_counter()
    ran = subprocess.run([sys.executable, "-m", "score_batch.cli.main", *map(str, args)], capture_output=True)
    if ran.returncode != 0:
        raise SystemExit(ran.stderr.decode()[-2000:])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, nargs=2, default=[10_000, 50_000])
    parser.add_argument("--query-tokens", type=int, default=1000)
    parser.add_argument("--item-tokens", type=int, default=27)
    parser.add_argument("--cpus-per-worker", type=float, default=1.0)
    args = parser.parse_args()
    print(machine(), f"(Ray: 1 worker, --cpus-per-worker {args.cpus_per_worker:g})")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokenizer, model = one_layer_classifier(tmp / "model")
        seconds: dict[tuple[str, int], float] = {}
        for items in args.items:
            data = tmp / f"in-{items}.parquet"
            write_input(data, tokenizer, items, 100, args.query_tokens, args.item_tokens)
            common = [data, "--model", model, "-q", "--overwrite"]
            seconds["local", items] = timed(*common, "-o", tmp / "local.parquet")
            seconds["ray", items] = timed(
                *common,
                "-o",
                tmp / "ray_out",
                "--ray",
                "--num-workers",
                "1",
                "--cpus-per-worker",
                args.cpus_per_worker,
            )
        small_n, large_n = args.items
        added = {}
        for runner in ("local", "ray"):
            t_small, t_large = seconds[runner, small_n], seconds[runner, large_n]
            added[runner] = (large_n - small_n) / (t_large - t_small)
            fixed = t_small - small_n / added[runner]
            print(
                f"{runner:<6} {small_n:,} items {t_small:6.1f} s, {large_n:,} items {t_large:6.1f} s → "
                f"{added[runner]:,.0f} items/s added, fixed start {fixed:4.1f} s"
            )
        print(f"ray / local (items/s added): {added['ray'] / added['local']:.2f}")


if __name__ == "__main__":
    main()
