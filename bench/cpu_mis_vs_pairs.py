"""Engine (MIS packing) vs a plain HF loop over padded (query+item) pairs, same model and data, one run.

    python bench/cpu_mis_vs_pairs.py [--queries 8] [--threads 2]

Recommendation-shaped workload: queries of ~200 tokens, 20–50 items of ~30 tokens; a random Qwen3
CausalLM with hidden 256 and 4 layers. Prints items/s for both, the speedup, the packed/unpacked token
ratio (the arithmetic limit of MIS) and the max abs score difference.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from engine import EngineConfig, Group, Scorer, ScoringConfig
from engine.tiny_models import build_model, build_tokenizer


def workload(rng: random.Random, vocab: int, queries: int) -> list[Group]:
    """Token-id groups: query ~200 tokens, 20–50 items of ~30 tokens."""
    return [
        Group(
            [rng.randrange(10, vocab) for _ in range(rng.randint(180, 220))],
            [
                [rng.randrange(10, vocab) for _ in range(rng.randint(25, 35))]
                for _ in range(rng.randint(20, 50))
            ],
        )
        for _ in range(queries)
    ]


def hf_pairs(model, groups: list[Group], labels: list[int], batch_size: int = 32) -> list[np.ndarray]:
    """What a careful user writes: pairs sorted by length, right-padded batches, logits at the last real token."""
    pairs = [
        (g, i, group.query + item) for g, group in enumerate(groups) for i, item in enumerate(group.items)
    ]
    pairs.sort(key=lambda p: len(p[2]))
    out = [np.zeros((len(g.items), len(labels)), np.float32) for g in groups]
    with torch.inference_mode():
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start : start + batch_size]
            width = max(len(p[2]) for p in chunk)
            ids = torch.zeros((len(chunk), width), dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, (_, _, seq) in enumerate(chunk):
                ids[row, : len(seq)] = torch.tensor(seq)
                mask[row, : len(seq)] = 1
            hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
            last = hidden[torch.arange(len(chunk)), mask.sum(1) - 1]
            probs = torch.log_softmax(model.lm_head(last).float(), -1)[:, labels].exp()
            for row, (g, i, _) in enumerate(chunk):
                out[g][i] = probs[row].numpy()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backend", default="sdpa")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as model_dir:
        tokenizer = build_tokenizer(model_dir)
        vocab = len(tokenizer)
        build_model(
            model_dir,
            "qwen3",
            "causal",
            vocab,
            hidden_size=256,
            intermediate_size=768,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=32,
        )
        groups = workload(random.Random(0), vocab, args.queries)
        labels = [5, 7]
        items = sum(len(g.items) for g in groups)
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
        scorer = Scorer.from_pretrained(
            model_dir,
            EngineConfig(
                device="cpu", backend=args.backend, scoring=ScoringConfig(label_token_ids=tuple(labels))
            ),
        )
        plan = scorer.plan(groups)
        hf_pairs(model, groups[:1], labels)  # warm-up
        scorer.score(groups[:1])
        t0 = time.perf_counter()
        reference = hf_pairs(model, groups, labels)
        t_hf = time.perf_counter() - t0
        t0 = time.perf_counter()
        results = scorer.run(plan)
        t_mis = time.perf_counter() - t0
    diff = max(float(np.abs(r.scores - ref).max()) for r, ref in zip(results, reference))
    token_ratio = plan.stats.pairwise_tokens / plan.stats.packed_tokens
    speedup = t_hf / t_mis
    print(
        f"workload: {len(groups)} queries, {items} items, {plan.stats.pairwise_tokens} pairwise tokens, "
        f"{plan.stats.packed_tokens} packed tokens (ratio {token_ratio:.2f}x), {args.threads} threads"
    )
    print(f"plain HF padded pairs : {items / t_hf:8.1f} items/s  ({t_hf:.2f}s)")
    print(f"score-batch MIS ({args.backend}) : {items / t_mis:8.1f} items/s  ({t_mis:.2f}s)")
    print(
        f"speedup {speedup:.2f}x = {speedup / token_ratio:.2f} of the token ratio; max abs score diff {diff:.2e}"
    )


if __name__ == "__main__":
    main()
