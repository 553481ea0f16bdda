"""A long query whose items need several packs: the query computed once per group against recomputed per pack.

    python bench/long_query.py [--query-tokens 3000] [--items 300] [--item-tokens 20] [--repeats 3]

The bench classifier (common.BENCH_MODEL: a 4-layer, 256-wide Qwen3) scores one query of about
--query-tokens tokens with --items items. Three engines score the same ready plan's groups, in
alternating rounds (best round each): `small` packs at --max-pack-tokens/--max-batch-tokens 4096 with
the query computed once (its later packs read the first pack's per-layer K/V), `small, recomputed`
the same packs with every pack recomputing the query (PlanLimits.cache_query off: today's cost before
the query cache), and `large` one 16,384-token pack. Printed: seconds, tokens run, packs, the ratio to
`large` (goal: within 1.3×), and the largest score difference to `large`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import Shape, build_bench_model, machine, text_workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from score_batch.engine import EngineConfig, Scorer  # noqa: E402


def engine(model_dir: Path, pack_tokens: int, cache_query: bool) -> Scorer:
    """The bench classifier on the CPU at one pack/batch budget; cache_query False recomputes the query per pack."""
    scorer = Scorer.load(
        model_dir,
        EngineConfig(device="cpu", max_pack_tokens=pack_tokens, max_batch_tokens=pack_tokens),
    )
    limits = dataclasses.replace(
        scorer.planner.limits, cache_query=cache_query and scorer.planner.limits.cache_query
    )
    scorer.planner = dataclasses.replace(scorer.planner, limits=limits)
    return scorer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--query-tokens", type=int, default=3000)
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--item-tokens", type=int, default=20)
    parser.add_argument("--small", type=int, default=4096)
    parser.add_argument("--large", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_bench_model(Path(tmp), "classifier")
        engines = {
            "small": engine(model_dir, args.small, True),
            "small, recomputed": engine(model_dir, args.small, False),
            "large": engine(model_dir, args.large, True),
        }
        groups = text_workload(
            engines["large"].tokenizer, Shape(1, args.items, args.query_tokens, args.item_tokens)
        )
        plans = {name: scorer.plan(groups) for name, scorer in engines.items()}
        results = {name: scorer.run(plans[name]) for name, scorer in engines.items()}  # warm-up
        best = dict.fromkeys(engines, float("inf"))
        for _ in range(args.repeats):
            for name, scorer in engines.items():
                start = time.perf_counter()
                scorer.run(plans[name])
                best[name] = min(best[name], time.perf_counter() - start)
    print(machine())
    stats = plans["large"].stats
    print(f"one query of {len(plans['large'].tokenized[0].query_ids)} tokens, {stats.items} items")
    reference = results["large"][0].scores
    for name in engines:
        s = plans[name].stats
        cached = sum(p.query_cached for b in plans[name].batches for p in b.packs)
        diff = float(np.abs(results[name][0].scores - reference).max())
        print(
            f"{name:20s} {best[name]:7.3f} s  {s.packed_tokens:6d} tokens  {s.packs} packs ({cached} cached)"
            f"  {best[name] / best['large']:5.2f}x large  max |diff| {diff:.1e}"
        )


if __name__ == "__main__":
    main()
