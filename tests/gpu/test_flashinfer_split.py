"""FlashInfer FA2's split-KV path on CUDA: each test checks that the plan really split (PrefillPlanInfo's
split_kv flag), then that the merged scores equal the unsplit run and the fp32 reference.

Why these batches (FlashInfer 0.6.6, include/flashinfer/attention/scheduler.cuh): a fixed split size needs
a float workspace of num_qo_heads × (query tiles × KV chunks) × 128 × head_dim × 4 bytes ("batch_prefill_tmp_v"),
so a 512-token split is forced on a batch of under 2k tokens (≈70 MiB of our 256 MiB; 128-token splits of
a 35k-token batch need ≈23 GiB and plan() refuses them). FlashInfer's own choice splits only when at most
2 × SMs / kv_heads work tiles (33 on an H100 with 8 KV heads) can hold two KV chunks per query tile: one
≈900-token pack (≤ 15 tiles of 128 packed rows) does; the goal-shape batch (553 tiles) never does, so its
check runs unforced in test_flashinfer.py."""

from __future__ import annotations

import pytest

from tests.gpu.need import need_gpu

pytestmark = pytest.mark.gpu
need_gpu("flashinfer")

from score_batch.engine.attention.flashinfer import FlashInferBackend, SplitKv  # noqa: E402
from tests.gpu.common import (  # noqa: E402
    BF16_VS_FP32,
    COMPILED_VS_EAGER,
    CUDA,
    MODEL,
    max_diff,
    scorer,
    token_groups,
)

SPLIT_KV_INDEX = 14  # PrefillPlanInfo::ToVector()'s last entry, split_kv (scheduler.cuh)


@pytest.fixture(scope="module")
def model_dir(zoo):
    return zoo.get("qwen3", "causal", **MODEL)


def _run_with(run, plan, split_kv: SplitKv):
    """(results, whether FlashInfer's plan split the KV) of one plan under split-KV settings."""
    backend = FlashInferBackend(CUDA, split_kv)
    run._runner.backend = backend  # Scorer.backend is read-only
    results = run.run(plan)
    info = [int(x) for x in backend._wrapper._plan_info]
    assert len(info) == SPLIT_KV_INDEX + 1, info  # the layout read from FlashInfer 0.6.6
    return results, bool(info[SPLIT_KV_INDEX])


def _check(model_dir, groups, split_kv: SplitKv, max_tokens: int):
    run = scorer(model_dir, "flashinfer")
    plan = run.plan(groups)
    assert len(plan.batches) == 1 and plan.batches[0].num_tokens <= max_tokens
    split, did_split = _run_with(run, plan, split_kv)
    assert did_split, f"{split_kv} did not split the KV of a {plan.batches[0].num_tokens}-token batch"
    whole, whole_split = _run_with(run, plan, SplitKv(disable=True))
    assert not whole_split
    assert max_diff(split, whole) <= COMPILED_VS_EAGER  # merged partial softmaxes = one pass
    assert max_diff(split, scorer(model_dir, "sdpa", dtype="float32").score(groups)) <= BF16_VS_FP32


def test_forced_512_token_splits_on_a_small_mixed_batch(model_dir):
    # A ≈600-token query (its own rows span two 512-token chunks) with 8 items, and two short groups.
    groups = token_groups(6, groups=1, query=(550, 650), items=8, item=(20, 50))
    groups += token_groups(7, groups=2, query=(100, 200), items=4, item=(1, 50))
    _check(model_dir, groups, SplitKv(fixed_size=512), max_tokens=2048)


def test_flashinfer_auto_split_on_one_short_pack(model_dir):
    groups = token_groups(8, groups=1, query=(560, 600), items=8, item=(20, 40))  # one 729..929-token pack
    _check(model_dir, groups, SplitKv(), max_tokens=1024)
