"""EngineConfig.compile on the CPU: eager vs compiled layers, same model, same data, in one run.

    python bench/compile_cpu.py [--queries 8] [--items 30] [--query-tokens 200] [--item-tokens 30] [--threads 2]
                                [--backend split] [--repeats 3]

On the bench model (random Qwen3, 4 layers, hidden 256, GQA 8/4 heads of 32), fp32, MIS packing: the first
compiled call's time (compilation), then items/s of eager and compiled, each the best of --repeats runs taken
alternately (so load from elsewhere on the machine hits both alike), their ratio, the number of compiled graphs
and the max |diff| between the two. The workload runs as batches of several token counts.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import LABELS, Shape, build_bench_model, machine, text_workload
from torch._dynamo.utils import counters

from score_batch.engine import EngineConfig, Scorer, ScoringConfig


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queries", type=int, default=8)
    parser.add_argument("--items", type=int, default=30, help="items per query")
    parser.add_argument("--query-tokens", type=int, default=200)
    parser.add_argument("--item-tokens", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backend", default="auto", help="attention backend (auto: split on CPU)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = Shape(args.queries, args.items, args.query_tokens, args.item_tokens)
    scoring = ScoringConfig(label_tokens=LABELS)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_bench_model(Path(tmp), "causal")
        eager = Scorer.load(model_dir, EngineConfig(device="cpu", backend=args.backend, scoring=scoring))
        compiled = Scorer.load(
            model_dir, EngineConfig(device="cpu", backend=args.backend, compile=True, scoring=scoring)
        )
        groups = text_workload(eager.tokenizer, shape)
        items = sum(len(g.items) for g in groups)
        plan = eager.plan(groups)
        batch_tokens = [b.num_tokens for b in plan.batches]
        before = counters["stats"]["unique_graphs"]
        start = time.perf_counter()
        got = compiled.score(groups)  # compiles
        first_call = time.perf_counter() - start
        want = eager.score(groups)  # warm-up
        best = {"eager": float("inf"), "compiled": float("inf")}
        for _ in range(args.repeats):
            for name, scorer in (("eager", eager), ("compiled", compiled)):
                start = time.perf_counter()
                scorer.score(groups)
                best[name] = min(best[name], time.perf_counter() - start)
        graphs = counters["stats"]["unique_graphs"] - before
        diff = max(float(np.abs(g.scores - w.scores).max()) for g, w in zip(got, want))
    result = {
        "machine": machine(),
        "backend": eager.setup.backend,
        "workload": f"{shape.queries} queries x {shape.items} items, ~{shape.query_tokens}+{shape.item_tokens} tokens",
        "batches_tokens": batch_tokens,
        "compiled_modules": len(compiled.compiled),
        "compiled_graphs": graphs,
        "first_compiled_call_s": round(first_call, 2),
        "eager_items_per_s": round(items / best["eager"], 1),
        "compiled_items_per_s": round(items / best["compiled"], 1),
        "speedup": round(best["eager"] / best["compiled"], 3),
        "max_abs_diff": diff,
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
