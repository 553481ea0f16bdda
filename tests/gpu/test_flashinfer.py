"""FlashInfer backend on CUDA: equal to the sdpa reference and to flex; items isolated; auto is dtype-aware."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from tests.gpu.need import need_gpu

pytestmark = pytest.mark.gpu
need_gpu("flashinfer")

from score_batch.engine import EngineConfig, Group, Scorer, ScoringConfig  # noqa: E402
from score_batch.engine.attention.flashinfer import FlashInferBackend  # noqa: E402
from score_batch.engine.attention.flex import FlexBackend  # noqa: E402
from score_batch.engine.attention.sdpa import SdpaBackend  # noqa: E402
from score_batch.engine.batching import collate  # noqa: E402
from score_batch.engine.packing import ItemRef, mis_pack, single_pack  # noqa: E402

from tests.gpu.common import BF16_VS_FP32  # noqa: E402

CUDA = torch.device("cuda")
GROUPS = [
    Group("I pledge allegiance", ["", " to", " the flag of", " to the United States of America"]),
    Group("Tokyo is a city in", [" Japan", " the country", " yes", " no"]),
]
BF16_TOLERANCE = 3e-2  # bf16 attention outputs of unit-variance inputs vs the fp32 reference


def _scorer(model_dir, backend, dtype="bfloat16"):
    cfg = ScoringConfig(label_tokens=(" to", " the"), apply_softmax=True, pooled_hidden_states=True)
    return Scorer.from_pretrained(
        model_dir, EngineConfig(device="cuda", dtype=dtype, backend=backend, scoring=cfg)
    )


@pytest.fixture(scope="module")
def model_dir(zoo):
    return zoo.get(
        "qwen3", "causal", head_dim=128, num_attention_heads=16, num_key_value_heads=8, hidden_size=256
    )


def _mixed_batch(seed: int = 0):
    """Packs of different lengths in one batch: queries over 128 tokens, items over 64, single-item packs."""
    rng = random.Random(seed)
    packs = []
    for k in range(4):
        items = [[rng.randrange(1, 500) for _ in range(rng.choice([1, 17, 70, 130]))] for _ in range(3 + k)]
        query = [rng.randrange(1, 500) for _ in range(rng.choice([5, 150, 300]))]
        packs.append(mis_pack(query, items, [ItemRef(k, i) for i in range(len(items))], 9999))
        packs.append(single_pack([rng.randrange(1, 500) for _ in range(40 + k)], ItemRef(10 + k, 0)))
    return collate(packs)


def _attend(backend, batch, q, k, v):
    return backend.plan(batch, CUDA).attend(q, k, v, None, None)  # [1, tokens, heads, head_dim]


def test_flashinfer_attention_matches_fp32_reference_and_flex_on_mixed_packs():
    batch = _mixed_batch()
    n = batch.num_tokens
    torch.manual_seed(0)
    q = torch.randn(1, 16, n, 128, device=CUDA)  # [1, q_heads, tokens, head_dim]
    k, v = torch.randn(2, 1, 8, n, 128, device=CUDA).unbind(0)  # [1, kv_heads, tokens, head_dim]
    reference = _attend(SdpaBackend(CUDA), batch, q, k, v)
    q16, k16, v16 = (x.bfloat16() for x in (q, k, v))
    fast = _attend(FlashInferBackend(CUDA), batch, q16, k16, v16)
    flex = _attend(FlexBackend(CUDA), batch, q16, k16, v16)
    rows = torch.from_numpy(batch.segments != -2).to(CUDA)  # delimiter rows are never read
    assert (fast.float() - reference)[:, rows].abs().max() <= BF16_TOLERANCE
    assert (fast.float() - flex.float())[:, rows].abs().max() <= 1e-2  # same bf16 inputs, two kernels


def test_flashinfer_scores_match_sdpa(model_dir):
    reference = _scorer(model_dir, "sdpa", dtype="float32").score(GROUPS)
    fast = _scorer(model_dir, "flashinfer").score(GROUPS)
    for a, b in zip(reference, fast):
        assert np.abs(a.scores - b.scores).max() <= BF16_VS_FP32  # bf16 noise on the two-label softmax
        assert np.abs(a.pooled - b.pooled).max() <= 1e-1


def test_flashinfer_items_are_isolated(model_dir):
    scorer = _scorer(model_dir, "flashinfer")
    query = list(range(5, 205))  # 200 query tokens; items over 64 tokens; same lengths, so the same layout
    base = scorer.score([Group(query, [[7] * 70, [8] * 90, [9] * 3])])[0]
    changed = scorer.score([Group(query, [[11] * 70, [8] * 90, [9] * 3])])[0]
    assert np.abs(base.scores[0] - changed.scores[0]).max() > 0  # the changed item's own score moves
    assert np.abs(base.scores[1:] - changed.scores[1:]).max() <= 1e-6  # the others do not see it


def test_auto_on_cuda_is_dtype_aware(model_dir):
    assert _scorer(model_dir, "auto").setup.backend == "flashinfer"
    fp32 = _scorer(model_dir, "auto", dtype="float32")
    assert fp32.setup.backend == "flex"
    reference = _scorer(model_dir, "sdpa", dtype="float32").score(GROUPS)
    for a, b in zip(reference, fp32.score(GROUPS)):
        assert np.abs(a.scores - b.scores).max() <= 1e-4
