"""score-batch vs what users would run instead, same model and same data, in one run.

    python bench/compare.py [--queries 8] [--items 30] [--threads 2] [--device cpu|cuda] [--dtype D] [--head-dim 128]
                            [--kinds causal classifier]

For a random Qwen3 (4 layers, hidden 256) as CausalLM (label probabilities of " no"/" yes") and as
SequenceClassification (2 logits), on text groups of the recommendation shape (queries ≈200 tokens,
items ≈30 tokens): plain HF over length-sorted padded (query+item) pairs; sentence-transformers
`CrossEncoder.predict` (classifier only, when installed: `pip install -e .[bench]`); score-batch with
`single` and `mis` packing on each attention backend of the device (CPU: sdpa, split). Prints items/s, tokens run, speedup
over plain HF, the packed/pairwise token ratio and the max abs score difference against plain HF.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from common import (
    BENCH_MODEL,
    LABELS,
    Shape,
    best_of,
    build_bench_model,
    hf_pairs,
    machine,
    max_abs_diff,
    text_workload,
)
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from score_batch.choices import DTYPES
from score_batch.engine import EngineConfig, Scorer, ScoringConfig

REPEATS = 3  # every method's time is the best of this many runs


def cross_encoder_row(model_dir: Path, tokenizer, groups, reference, items: int, device: str):
    """CrossEncoder.predict over the same pairs (batch 32, its own padding), or why it cannot run."""
    try:
        from sentence_transformers import CrossEncoder
    except ImportError:
        return (
            "CrossEncoder",
            None,
            None,
            None,
            "sentence-transformers not installed (pip install -e .[bench])",
        )
    pairs = [(g.query, item) for g in groups for item in g.items]
    encoder = CrossEncoder(str(model_dir), device=device)
    encoder.predict(pairs[:8], activation_fn=torch.nn.Identity())  # warm-up
    scores, seconds = best_of(
        REPEATS,
        lambda: encoder.predict(
            pairs, batch_size=32, activation_fn=torch.nn.Identity(), convert_to_numpy=True
        ),
    )
    lengths = [len(tokenizer(q, i)["input_ids"]) for q, i in pairs]
    tokens = sum(max(lengths[s : s + 32]) * len(lengths[s : s + 32]) for s in range(0, len(lengths), 32))
    flat_ref = np.concatenate([r for r in reference if r.size])
    return ("CrossEncoder", items / seconds, tokens, float(np.abs(scores - flat_ref).max()), "")


def compare(kind: str, shape: Shape, device: str, dtype: str, head_dim: int, backends: list[str]) -> None:
    """Print one table for one model kind."""
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_bench_model(Path(tmp), kind, head_dim=head_dim)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        groups = text_workload(tokenizer, shape)
        items = sum(len(g.items) for g in groups)
        label_ids = [tokenizer.encode(t, add_special_tokens=False)[0] for t in LABELS]
        auto = AutoModelForCausalLM if kind == "causal" else AutoModelForSequenceClassification
        model = (
            auto.from_pretrained(model_dir, dtype=getattr(torch, dtype), attn_implementation="sdpa")
            .to(device)
            .eval()
        )
        hf_pairs(model, tokenizer, groups[:1], kind, label_ids)  # warm-up
        (reference, hf_tokens), hf_seconds = best_of(
            REPEATS, hf_pairs, model, tokenizer, groups, kind, label_ids
        )
        rows = [("plain HF, padded pairs", items / hf_seconds, hf_tokens, 0.0, "the baseline")]
        if kind == "classifier":
            rows.append(cross_encoder_row(model_dir, tokenizer, groups, reference, items, device))
        else:
            rows.append(
                ("CrossEncoder", None, None, None, "n/a: it scores *ForSequenceClassification heads only")
            )
        pairwise = None
        for packing in ("single", "mis"):
            for backend in backends:
                scoring = ScoringConfig(packing=packing, label_tokens=LABELS if kind == "causal" else ())
                scorer = Scorer.from_pretrained(
                    model_dir, EngineConfig(device=device, dtype=dtype, backend=backend, scoring=scoring)
                )
                scorer.score(groups[:1])  # warm-up
                plan = scorer.plan(groups)
                results, seconds = best_of(REPEATS, scorer.run, plan)
                pairwise = plan.stats.pairwise_tokens
                note = f"token ratio {pairwise / plan.stats.packed_tokens:.2f}x" if packing == "mis" else ""
                rows.append(
                    (
                        f"score-batch {packing} ({backend})",
                        items / seconds,
                        plan.stats.packed_tokens,
                        max_abs_diff(results, reference),
                        note,
                    )
                )
    print(f"\n{kind}: {len(groups)} queries, {items} items, {pairwise} pairwise tokens (unpadded)")
    print(f"{'method':34} {'items/s':>9} {'tokens run':>11} {'vs HF':>7} {'max |diff|':>10}  note")
    hf_rate = rows[0][1]
    for name, rate, tokens, diff, note in rows:
        if rate is None:
            print(f"{name:34} {'—':>9} {'—':>11} {'—':>7} {'—':>10}  {note}")
            continue
        print(f"{name:34} {rate:9.1f} {tokens:11d} {rate / hf_rate:6.2f}x {diff:10.1e}  {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=8)
    parser.add_argument("--items", type=int, default=30, help="items per query")
    parser.add_argument("--query-tokens", type=int, default=200)
    parser.add_argument("--item-tokens", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument(
        "--dtype",
        default=None,
        choices=[d for d in DTYPES[1:] if not d.startswith("fp8")],
        help="default: float32 on cpu, bfloat16 on cuda",
    )
    parser.add_argument("--head-dim", type=int, default=BENCH_MODEL["head_dim"], help="128 for flashinfer")
    parser.add_argument(
        "--kinds", nargs="+", default=["causal", "classifier"], choices=("causal", "classifier")
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # Uncompiled flex on the CPU materializes the whole ragged batch's [tokens, tokens] scores: a GPU path.
    backends = ["sdpa", "split"] if args.device == "cpu" else ["sdpa", "flex", "flashinfer"]
    dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    print(machine(), dtype)
    shape = Shape(args.queries, args.items, args.query_tokens, args.item_tokens)
    for kind in args.kinds:
        compare(kind, shape, args.device, dtype, args.head_dim, backends)


if __name__ == "__main__":
    main()
