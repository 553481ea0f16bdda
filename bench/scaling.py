"""Scaling curves: plain HF pairs vs score-batch MIS as items per query, query length and item length grow,
plus a sweep of --max-batch-tokens. Writes PNG plots to docs/ and the figures to bench/results/scaling.json.

    python bench/scaling.py [--threads 2] [--device cpu|cuda] [--sweeps items query-len item-len batch-tokens]

Model: the random Qwen3 CausalLM of bench/common.py (4 layers, hidden 256), fp32; text workloads.
Every score-batch time is the best of --repeats runs; plain HF (seconds per point) runs once.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch
from common import (
    LABELS,
    Shape,
    best_of,
    build_bench_model,
    hf_pairs,
    machine,
    max_abs_diff,
    text_workload,
    timed,
)
from transformers import AutoModelForCausalLM, AutoTokenizer

from score_batch.engine import EngineConfig, Scorer, ScoringConfig

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = {
    # name: (x label, x values, shape of a point)
    "items": ("items per query", [1, 2, 5, 10, 20, 50, 100, 200], lambda x: Shape(2, x, 200, 30)),
    "query-len": (
        "query length (tokens)",
        [50, 100, 200, 500, 1000, 2000, 4000],
        lambda x: Shape(1, 20, x, 30),
    ),
    "item-len": ("item length (tokens)", [5, 10, 20, 50, 100, 200, 500], lambda x: Shape(2, 20, 200, x)),
}
BATCH_TOKENS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]


def scorer_for(model_dir: Path, device: str, max_batch_tokens: int | None = None) -> Scorer:
    """The default score-batch engine (MIS, auto backend) in fp32."""
    config = EngineConfig(
        device=device,
        dtype="float32",
        max_batch_tokens=max_batch_tokens,
        scoring=ScoringConfig(label_tokens=LABELS),
    )
    return Scorer.from_pretrained(model_dir, config)


def run_sweep(name, model, tokenizer, scorer, label_ids, repeats) -> list[dict]:
    """One point per x value: both methods on the same groups."""
    _, values, shape_of = SWEEPS[name]
    points = []
    for x in values:
        groups = text_workload(tokenizer, shape_of(x), seed=x)
        items = sum(len(g.items) for g in groups)
        (reference, hf_tokens), hf_seconds = timed(hf_pairs, model, tokenizer, groups, "causal", label_ids)
        plan = scorer.plan(groups)
        results, mis_seconds = best_of(repeats, scorer.run, plan)
        ratio = plan.stats.pairwise_tokens / plan.stats.packed_tokens
        point = dict(
            x=x,
            items=items,
            hf_seconds=hf_seconds,
            mis_seconds=mis_seconds,
            hf_items_per_s=items / hf_seconds,
            mis_items_per_s=items / mis_seconds,
            speedup=hf_seconds / mis_seconds,
            token_ratio=ratio,
            of_token_ratio=hf_seconds / mis_seconds / ratio,
            max_abs_diff=max_abs_diff(results, reference),
        )
        points.append(point)
        print(
            f"{name:9} x={x:5}  items={items:4}  HF {hf_seconds:7.2f}s {point['hf_items_per_s']:8.1f}/s  "
            f"MIS {mis_seconds:6.2f}s {point['mis_items_per_s']:8.1f}/s  speedup {point['speedup']:5.2f}x  "
            f"token ratio {ratio:5.2f}x ({point['of_token_ratio']:.2f} of it)  diff {point['max_abs_diff']:.1e}",
            flush=True,
        )
    return points


def run_batch_tokens(model_dir, tokenizer, device, repeats) -> list[dict]:
    """items/s of MIS on the recommendation shape for each --max-batch-tokens."""
    groups = text_workload(tokenizer, Shape(16, 30, 200, 30), seed=1)
    items = sum(len(g.items) for g in groups)
    points = []
    for budget in BATCH_TOKENS:
        scorer = scorer_for(model_dir, device, budget)
        plan = scorer.plan(groups)
        scorer.run(plan)  # warm-up at this budget
        _, seconds = best_of(repeats, scorer.run, plan)
        points.append(
            dict(
                x=budget,
                items=items,
                batches=len(plan.batches),
                mis_seconds=seconds,
                mis_items_per_s=items / seconds,
            )
        )
        print(
            f"batch-tokens {budget:6}  batches {len(plan.batches):3}  {items / seconds:8.1f} items/s",
            flush=True,
        )
    return points


def plot(name: str, points: list[dict], where: str, out: Path) -> None:
    """Two panels: items/s and total seconds against the sweep's x, both methods."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p["x"] for p in points]
    fig, (rate, total) = plt.subplots(1, 2, figsize=(10, 3.8))
    if name == "batch-tokens":
        rate.plot(xs, [p["mis_items_per_s"] for p in points], "o-", label="score-batch MIS")
        total.plot(xs, [p["mis_seconds"] for p in points], "o-", label="score-batch MIS")
        label = "--max-batch-tokens"
    else:
        label = SWEEPS[name][0]
        for key, text in (("hf", "plain HF, padded pairs"), ("mis", "score-batch MIS")):
            rate.plot(xs, [p[f"{key}_items_per_s"] for p in points], "o-", label=text)
            total.plot(xs, [p[f"{key}_seconds"] for p in points], "o-", label=text)
    rate.set_xscale("log")  # the rate panel spans decades; total time stays linear to show its growth
    for axis, ylabel in ((rate, "items / s"), (total, "total seconds")):
        axis.set_xlabel(label)
        axis.set_ylabel(ylabel)
        axis.grid(True, alpha=0.3)
        axis.legend()
    rate.set_yscale("log")
    fig.suptitle(f"{label} — {where}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--sweeps", nargs="+", default=[*SWEEPS, "batch-tokens"], choices=[*SWEEPS, "batch-tokens"]
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument("--replot", type=Path, help="redraw the plots from a saved results JSON, run nothing")
    args = parser.parse_args()
    if args.replot:
        saved = json.loads(args.replot.read_text())
        for name, points in saved["sweeps"].items():
            plot(name, points, saved["machine"], args.out / f"scaling_{name}.png")
        return
    torch.set_num_threads(args.threads)
    where = machine()
    print(where)
    results = {"machine": where, "sweeps": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_bench_model(Path(tmp), "causal")
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        label_ids = [tokenizer.encode(t, add_special_tokens=False)[0] for t in LABELS]
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="sdpa"
        )
        model = model.to(args.device).eval()
        scorer = scorer_for(model_dir, args.device)
        warm = text_workload(tokenizer, Shape(1, 4, 50, 10))
        hf_pairs(model, tokenizer, warm, "causal", label_ids)
        scorer.score(warm)
        for name in args.sweeps:
            if name == "batch-tokens":
                points = run_batch_tokens(model_dir, tokenizer, args.device, args.repeats)
            else:
                points = run_sweep(name, model, tokenizer, scorer, label_ids, args.repeats)
            results["sweeps"][name] = points
            plot(name, points, where, args.out / f"scaling_{name}.png")
    out = ROOT / "bench" / "results" / f"scaling_{args.device}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(
        f"wrote {out} and docs/scaling_*.png; max abs diff over all points "
        f"{max((p.get('max_abs_diff', 0.0) for v in results['sweeps'].values() for p in v), default=0.0):.1e}"
    )


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
