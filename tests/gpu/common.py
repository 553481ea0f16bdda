"""Shared pieces of the GPU tests: the model, workloads with token ids, and the plain-HF fp32 reference."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from score_batch.engine import EngineConfig, Group, Scorer, ScoringConfig
from tests.reference import reference_scores, tokenizer

LABELS = (" to", " the")
# Scores are the softmax over the two label tokens (apply_softmax): on the random tiny model they spread over
# 0.01..0.99, while probabilities over the whole vocabulary stay below 4e-4 and no bound on them can fail.
# bf16 end to end vs the fp32 plain-HF reference: 2.2e-2 measured with sdpa on the CPU.
BF16_VS_FP32 = 5e-2
# One bf16 model's scores through two kernel arrangements (compiled or eager, the query inline or its pages
# cached, FA2 or FA3): rounding differences in the activations pass through the layers and the LM head. Measured
# on an H200 (2026-11-28): compiled vs eager flex 0.018, FA2 cached pages vs inline 0.0165; bf16 vs fp32 up to 0.13.
SAME_MODEL_SCORES = 3e-2
COMPILED_VS_EAGER = SAME_MODEL_SCORES
MODEL = dict(head_dim=128, num_attention_heads=16, num_key_value_heads=8, hidden_size=256)
KERNELS = ("fa2", "fa3")  # FlashInferBackend(kernel=...); fa3 runs on Hopper (sm90) only
CUDA = torch.device("cuda")


def scorer(model_dir, backend: str, dtype: str = "bfloat16", compile: bool = False, **engine) -> Scorer:
    """A CUDA scorer of the softmax over the two label tokens."""
    config = EngineConfig(
        device="cuda",
        dtype=dtype,
        backend=backend,
        compile=compile,
        scoring=ScoringConfig(label_tokens=LABELS, apply_softmax=True),
        **engine,
    )
    return Scorer.from_pretrained(model_dir, config)


# Set by bench/gpu_check.sh (the reason) until warmup.json holds FA3's build time and a successful call.
NO_FA3 = "SCORE_BATCH_NO_FA3"


def need_kernel(kernel: str) -> None:
    """Skip an FA3 case off Hopper (FlashInfer builds FA3 for sm90 only) or while no warm-up proved FA3."""
    if kernel == "fa3" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("FlashInfer's FA3 kernels run on Hopper (sm90) only")
    if kernel == "fa3" and os.environ.get(NO_FA3):
        pytest.skip(os.environ[NO_FA3])


def flashinfer_scorer(model_dir, kernel: str = "fa2", engine: dict | None = None, **backend) -> Scorer:
    """A bf16 flashinfer scorer (EngineConfig settings `engine`) whose runner uses FlashInferBackend(kernel=...,
    **backend)."""
    from score_batch.engine.attention.flashinfer import FlashInferBackend

    need_kernel(kernel)
    run = scorer(model_dir, "flashinfer", **(engine or {}))
    if kernel != "fa2" or backend:
        run._runner.backend = FlashInferBackend(CUDA, kernel=kernel, **backend)  # Scorer.backend is read-only
    return run


def token_groups(
    seed: int, groups: int, query: tuple[int, int], items: int, item: tuple[int, int]
) -> list[Group]:
    """Groups of random token ids (5..199) with lengths drawn from the given ranges."""
    rng = random.Random(seed)

    def ids(bounds):
        return [rng.randrange(5, 200) for _ in range(rng.randint(*bounds))]

    return [Group(ids(query), [ids(item) for _ in range(items)]) for _ in range(groups)]


def hf_reference(model_dir, groups: list[Group]) -> list[np.ndarray]:
    """Plain HF fp32 (CPU, eager) scores of every (query + item) sequence, per group [items, labels]."""
    tok = tokenizer(str(model_dir))
    label_ids = [tok.encode(t, add_special_tokens=False)[0] for t in LABELS]
    return [
        np.stack(
            [
                reference_scores(
                    model_dir, "causal", list(g.query) + list(item), label_ids, apply_softmax=True
                )[0]
                for item in g.items
            ]
        )
        for g in groups
    ]


def max_diff(results, reference) -> float:
    """Largest |difference| between the scores of two runs (results, or arrays per group)."""
    pairs = zip(results, reference)
    return max(float(np.abs(getattr(a, "scores", a) - getattr(b, "scores", b)).max()) for a, b in pairs)
