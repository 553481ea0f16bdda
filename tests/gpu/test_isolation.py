"""The sharp isolation check at the goal shape on FlashInfer (FA2, and FA3 once proven): a 1,500-token query with
100 items of 40 tokens in one 5,601-token pack, so query tiles far from the query skip the KV tiles between the
query and their items (FlashInfer's multi-item tile skip); changing one item (next to the query, in the middle,
the last) moves no other item's score or pooled vector beyond 1e-6, and a planted one-key leak fails the check."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu.need import need_gpu

pytestmark = pytest.mark.gpu
need_gpu("flashinfer")

import score_batch.engine.attention.flashinfer as fi  # noqa: E402
from score_batch.engine.attention.flashinfer import FlashInferBackend  # noqa: E402
from tests.gpu.common import CUDA, KERNELS, MODEL, need_kernel  # noqa: E402
from tests.isolation import BOUND, CHANGED, isolation, leak_one_key, scorer  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(zoo):
    return zoo.get("qwen3", "causal", num_hidden_layers=2, **MODEL)  # two: a leak reaches the item's last row


def _run(model_dir, kernel):
    need_kernel(kernel)
    run = scorer(model_dir, "cuda", "bfloat16", "flashinfer")
    run._runner.backend = FlashInferBackend(CUDA, kernel=kernel)  # Scorer.backend is read-only
    return run


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("changed", CHANGED)
def test_changing_one_item_moves_no_other_item_at_the_goal_shape(model_dir, kernel, changed):
    diffs = isolation(_run(model_dir, kernel), changed)
    assert diffs["own"] > 0  # the changed item's own score moves
    assert diffs["scores"] <= BOUND and diffs["pooled"] <= BOUND, diffs


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_planted_one_key_leak_fails_the_check(model_dir, kernel, monkeypatch):
    """The kernel's own rule widened by one key: the first token of item 50 (t = 1) gets t = 3, so it sees the
    delimiter before it and the last token of item 49."""
    changed = 49
    run = _run(model_dir, kernel)  # loaded first: the load's own check runs a small batch without item 49
    planned = fi.build_metadata
    monkeypatch.setattr(fi, "build_metadata", lambda batch: leak_one_key(planned(batch), changed))
    diffs = isolation(run, changed)
    assert diffs["scores"] > BOUND or diffs["pooled"] > BOUND, diffs
    assert np.isfinite(diffs["pooled"])
