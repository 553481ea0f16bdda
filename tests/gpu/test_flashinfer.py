"""FlashInfer backend on CUDA: equal to the sdpa reference on the same packs; items isolated. Skips without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
flashinfer = pytest.importorskip("flashinfer") if torch.cuda.is_available() else None
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from engine import EngineConfig, Group, Scorer, ScoringConfig  # noqa: E402

GROUPS = [
    Group("I pledge allegiance", ["", " to", " the flag of", " to the United States of America"]),
    Group("Tokyo is a city in", [" Japan", " the country", " yes", " no"]),
]


def _scorer(model_dir, backend, dtype="bfloat16"):
    cfg = ScoringConfig(label_tokens=(" to", " the"), pooled_hidden_states=True)
    return Scorer.from_pretrained(
        model_dir, EngineConfig(device="cuda", dtype=dtype, backend=backend, scoring=cfg)
    )


@pytest.fixture(scope="module")
def model_dir(zoo):
    return zoo.get(
        "qwen3", "causal", head_dim=64, num_attention_heads=2, num_key_value_heads=1, hidden_size=128
    )


def test_flashinfer_matches_sdpa(model_dir):
    reference = _scorer(model_dir, "sdpa").score(GROUPS)
    fast = _scorer(model_dir, "flashinfer").score(GROUPS)
    for a, b in zip(reference, fast):
        assert np.abs(a.scores - b.scores).max() <= 2e-2  # bf16 noise on probabilities
        assert np.abs(a.pooled - b.pooled).max() <= 1e-1


def test_flashinfer_items_are_isolated(model_dir):
    scorer = _scorer(model_dir, "flashinfer", dtype="float16")
    base = scorer.score([Group("the capital of", [" Tokyo", " Japan and", " the flag"])])[0]
    changed = scorer.score([Group("the capital of", [" lazy dog over there", " Japan and", " the flag"])])[0]
    assert np.abs(base.scores[1:] - changed.scores[1:]).max() <= 1e-3
