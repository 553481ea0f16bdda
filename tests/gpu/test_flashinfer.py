"""FlashInfer on CUDA, FA2 and FA3: attention and scores equal to the fp32 reference; items isolated; cached
queries (off by default) equal to the inline pack; the goal shape (≈1,500-token queries × 100 items) exact.

The most valuable GPU checks: bench/gpu_check.sh runs this module first."""

from __future__ import annotations

import dataclasses
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
from score_batch.engine.plan.batching import collate  # noqa: E402
from score_batch.engine.plan.packing import ItemRef, mis_pack, single_pack  # noqa: E402
from tests.gpu.common import (  # noqa: E402
    BF16_VS_FP32,
    CUDA,
    KERNELS,
    MODEL,
    SAME_MODEL_SCORES,
    flashinfer_scorer,
    hf_reference,
    max_diff,
    need_kernel,
    scorer,
    token_groups,
)

GROUPS = [
    Group("I pledge allegiance", ["", " to", " the flag of", " to the United States of America"]),
    Group("Tokyo is a city in", [" Japan", " the country", " yes", " no"]),
]
BF16_TOLERANCE = 3e-2  # bf16 attention outputs of unit-variance inputs vs the fp32 reference
SAME_KERNELS = 1e-2  # the same bf16 inputs through two kernels: 1e-2, or one bf16 step of larger values


def _beyond_same_kernels(a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor) -> float:
    """Largest |a - b| over the rows read beyond max(SAME_KERNELS, 2^-7 |b|) per element (one bf16 step is 2^-8
    to 2^-7 of the value: outputs of magnitude 2-4 differ by 0.0156 when one kernel rounds the other way)."""
    a, b = a.float()[:, rows], b.float()[:, rows]
    return float(((a - b).abs() - torch.clamp(b.abs() * 2**-7, min=SAME_KERNELS)).max())


def _scorer(model_dir, backend, dtype="bfloat16"):
    cfg = ScoringConfig(label_tokens=(" to", " the"), apply_softmax=True, pooled_hidden_states=True)
    return Scorer.from_pretrained(
        model_dir, EngineConfig(device="cuda", dtype=dtype, backend=backend, scoring=cfg)
    )


@pytest.fixture(scope="module")
def model_dir(zoo):
    return zoo.get("qwen3", "causal", **MODEL)


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


def _attend(backend, batch, q, k, v, cache=None):
    plan = backend.plan(batch, CUDA) if cache is None else backend.plan(batch, CUDA, cache)
    return plan.attend(q, k, v, None, None)  # [1, tokens, heads, head_dim]


@pytest.mark.parametrize("kernel", KERNELS)
def test_attention_matches_fp32_reference_and_flex_on_mixed_packs(kernel):
    need_kernel(kernel)
    batch = _mixed_batch()
    n = batch.num_tokens
    torch.manual_seed(0)
    q = torch.randn(1, 16, n, 128, device=CUDA)  # [1, q_heads, tokens, head_dim]
    k, v = torch.randn(2, 1, 8, n, 128, device=CUDA).unbind(0)  # [1, kv_heads, tokens, head_dim]
    reference = _attend(SdpaBackend(CUDA), batch, q, k, v)
    q16, k16, v16 = (x.bfloat16() for x in (q, k, v))
    fast = _attend(FlashInferBackend(CUDA, kernel=kernel), batch, q16, k16, v16)
    flex = _attend(FlexBackend(CUDA), batch, q16, k16, v16)
    rows = torch.from_numpy(batch.segments != -2).to(CUDA)  # delimiter rows are never read
    assert (fast.float() - reference)[:, rows].abs().max() <= BF16_TOLERANCE
    assert _beyond_same_kernels(fast, flex, rows) <= 0


def test_flashinfer_scores_match_sdpa(model_dir):
    reference = _scorer(model_dir, "sdpa", dtype="float32").score(GROUPS)
    fast = _scorer(model_dir, "flashinfer").score(GROUPS)
    for a, b in zip(reference, fast):
        assert np.abs(a.scores - b.scores).max() <= BF16_VS_FP32  # bf16 noise on the two-label softmax
        assert np.abs(a.pooled - b.pooled).max() <= 1e-1


def test_fa3_scores_match_sdpa_and_fa2(model_dir):
    reference = scorer(model_dir, "sdpa", dtype="float32").score(GROUPS)
    fa3 = flashinfer_scorer(model_dir, "fa3").score(GROUPS)
    assert max_diff(fa3, reference) <= BF16_VS_FP32
    assert max_diff(fa3, flashinfer_scorer(model_dir, "fa2").score(GROUPS)) <= SAME_MODEL_SCORES


@pytest.mark.parametrize("kernel", KERNELS)
def test_items_are_isolated(model_dir, kernel):
    run = flashinfer_scorer(model_dir, kernel)
    query = list(range(5, 205))  # 200 query tokens; items over 64 tokens; same lengths, so the same layout
    base = run.score([Group(query, [[7] * 70, [8] * 90, [9] * 3])])[0]
    changed = run.score([Group(query, [[11] * 70, [8] * 90, [9] * 3])])[0]
    assert np.abs(base.scores[0] - changed.scores[0]).max() > 0  # the changed item's own score moves
    assert np.abs(base.scores[1:] - changed.scores[1:]).max() <= 1e-6  # the others do not see it


def test_goal_shape_batch_matches_fp32_without_forced_splits(model_dir):
    """≈6 packs of 1,500-token queries × 100 items of ≈40 tokens plus short groups: one ≈35k-token batch with
    FlashInfer's own split-KV choice, against fp32 sdpa on every item and fp32 plain HF on a sample."""
    groups = token_groups(3, groups=6, query=(1300, 1700), items=100, item=(30, 50))
    groups += token_groups(4, groups=4, query=(5, 60), items=3, item=(1, 200))
    budget = dict(max_batch_tokens=65536, max_pack_tokens=8192)
    run = scorer(model_dir, "flashinfer", **budget)
    plan = run.plan(groups)
    assert len(plan.batches) == 1 and plan.batches[0].num_tokens > 30_000
    got = run.run(plan)
    assert max_diff(got, scorer(model_dir, "sdpa", dtype="float32", **budget).score(groups)) <= BF16_VS_FP32
    sample = [Group(g.query, g.items[:3]) for g in groups[:2]]
    assert max_diff([r.scores[:3] for r in got[:2]], hf_reference(model_dir, sample)) <= BF16_VS_FP32


def _cached_group(seed: int = 0):
    """(storing pack, cached pack, the inline pack of the cached pack's items) of one 300-token query."""
    packing = pytest.importorskip("score_batch.engine.plan.packing")
    if not hasattr(packing, "cached_mis_pack"):
        pytest.skip("engine.plan.packing has no cached packs (the query-once work) in this checkout")
    rng = random.Random(seed)
    query = [rng.randrange(1, 500) for _ in range(300)]
    first = [[rng.randrange(1, 500) for _ in range(n)] for n in (40, 3)]
    items = [[rng.randrange(1, 500) for _ in range(n)] for n in (1, 17, 70, 130, 9)]
    refs = [ItemRef(0, i) for i in range(len(items))]
    storing = packing.mis_pack(query, first, [ItemRef(0, 10), ItemRef(0, 11)], 9999, query_key=0)
    cached = packing.cached_mis_pack(len(query), items, refs, 9999, 0)
    return storing, cached, packing.mis_pack(query, items, refs, 9999)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("same_batch", [True, False], ids=["same-batch", "later-batch"])
def test_cached_query_attention_equals_the_inline_pack(kernel, same_batch):
    """FlashInferBackend(cache_query=True): a cached pack (Q = its own rows, KV = the query's pages + its own)
    attends as the inline pack does, within bf16 of the fp32 reference and of FlashInfer on the inline pack."""
    need_kernel(kernel)
    query_cache = pytest.importorskip("score_batch.engine.attention.query_cache")
    storing, cached, inline = _cached_group()
    q_len = storing.prefix_len
    torch.manual_seed(1)
    s_q, c_q = (
        torch.randn(1, 16, len(storing), 128, device=CUDA),
        torch.randn(1, 16, len(cached), 128, device=CUDA),
    )
    s_k, s_v = torch.randn(2, 1, 8, len(storing), 128, device=CUDA).unbind(0)
    c_k, c_v = torch.randn(2, 1, 8, len(cached), 128, device=CUDA).unbind(0)
    inline_qkv = [torch.cat([s[:, :, :q_len], c], dim=2) for s, c in ((s_q, c_q), (s_k, c_k), (s_v, c_v))]
    reference = _attend(SdpaBackend(CUDA), collate([inline]), *inline_qkv)[:, q_len:]  # [1, len, heads, d]
    bf16 = [x.bfloat16() for x in inline_qkv]
    same_kernel = _attend(FlashInferBackend(CUDA, kernel=kernel), collate([inline]), *bf16)[:, q_len:]
    backend = FlashInferBackend(CUDA, kernel=kernel, cache_query=True)
    if same_batch:
        batch = collate([storing, cached])
        cache = query_cache.QueryCache([batch])
        qkv = [torch.cat([s, c], dim=2).bfloat16() for s, c in ((s_q, c_q), (s_k, c_k), (s_v, c_v))]
        got = _attend(backend, batch, *qkv, cache=cache)[:, len(storing) :]
    else:
        first, second = collate([storing]), collate([cached])
        cache = query_cache.QueryCache([first, second])
        _attend(backend, first, s_q.bfloat16(), s_k.bfloat16(), s_v.bfloat16(), cache=cache)
        cache.release(first)
        got = _attend(backend, second, c_q.bfloat16(), c_k.bfloat16(), c_v.bfloat16(), cache=cache)
    rows = torch.from_numpy(cached.segments != -2).to(CUDA)
    assert (got.float() - reference)[:, rows].abs().max() <= BF16_TOLERANCE
    assert _beyond_same_kernels(got, same_kernel, rows) <= 0


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("batch_tokens", [65536, 1100], ids=["one-batch", "batch-per-pack"])
def test_cached_query_scores_equal_fp32_plain_hf(model_dir, kernel, batch_tokens):
    """The query computed once per group, turned on for FlashInfer (planner and backend): a ≈600-token query
    whose 24 items need several 1,024-token packs scores as fp32 plain HF and as FlashInfer with the query
    inline, its cached packs in the storing pack's batch (pages shared) or in later ones (pages copied)."""
    groups = token_groups(11, groups=1, query=(550, 650), items=24, item=(20, 60))
    engine = dict(max_pack_tokens=1024, max_batch_tokens=batch_tokens)
    inline = flashinfer_scorer(model_dir, kernel, engine).score(groups)
    run = flashinfer_scorer(model_dir, kernel, engine, cache_query=True)
    if not hasattr(run.planner.limits, "cache_query"):
        pytest.skip("this checkout's planner has no cached packs")
    run.planner = dataclasses.replace(
        run.planner, limits=dataclasses.replace(run.planner.limits, cache_query=True)
    )
    plan = run.plan(groups)
    cached = [p for b in plan.batches for p in b.packs if p.query_cached]
    assert cached and (len(plan.batches) == 1) == (batch_tokens == 65536)
    got = run.run(plan)
    assert max_diff(got, inline) <= SAME_MODEL_SCORES
    assert max_diff(got, hf_reference(model_dir, groups)) <= BF16_VS_FP32


def test_auto_on_cuda_is_dtype_aware(model_dir):
    assert _scorer(model_dir, "auto").setup.backend == "flashinfer"
    fp32 = _scorer(model_dir, "auto", dtype="float32")
    assert fp32.setup.backend == "flex"
    reference = _scorer(model_dir, "sdpa", dtype="float32").score(GROUPS)
    for a, b in zip(reference, fp32.score(GROUPS)):
        assert np.abs(a.scores - b.scores).max() <= 1e-4
