"""The two-phase attention on CUDA (FlashInfer's ragged prefills + merge_state, engine/attention/flashinfer_two_phase.py):
equal to float32 sdpa within the bf16 bound on mixed packs, and timed against the mask path at the goal shape."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.gpu.need import need_gpu

pytestmark = pytest.mark.gpu
need_gpu("flashinfer")

from score_batch.engine.attention.registry import make_backend  # noqa: E402
from score_batch.engine.attention.sdpa import SdpaBackend  # noqa: E402
from score_batch.engine.model import proof  # noqa: E402
from score_batch.engine.plan.batching import collate  # noqa: E402
from score_batch.engine.plan.packing import DELIMITER_SEGMENT, ItemRef, mis_pack, single_pack  # noqa: E402

CUDA = torch.device("cuda")
BF16_TOLERANCE = (
    3e-2  # bf16 attention outputs of unit-variance inputs vs the fp32 reference (test_flashinfer.py)
)


def _mixed_batch(seed: int):
    rng = np.random.default_rng(seed)
    packs = []
    for query_len, item_lens in [
        (3000, [1, 40, 7]),
        (1, rng.integers(1, 6, 200)),
        (1500, [40] * 100),
        (2, [500]),
    ]:
        items = [rng.integers(0, 100, n).tolist() for n in item_lens]
        packs.append(mis_pack(list(range(query_len)), items, [ItemRef(0, i) for i in range(len(items))], 99))
    packs.append(single_pack(list(range(37)), ItemRef(1, 0)))
    return collate(packs)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_two_phase_equals_float32_sdpa_within_the_bf16_bound(head_dim):
    batch = _mixed_batch(head_dim)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, h, batch.num_tokens, head_dim, generator=generator).to(CUDA, torch.bfloat16)
        for h in (16, 8, 8)
    )
    got = make_backend("flashinfer-two-phase", CUDA).plan(batch, CUDA).attend(q, k, v, head_dim**-0.5, None)
    want = SdpaBackend(CUDA).plan(batch, CUDA).attend(q.float(), k.float(), v.float(), head_dim**-0.5, None)
    rows = torch.from_numpy(batch.segments != DELIMITER_SEGMENT).to(CUDA)
    assert (got.float() - want)[:, rows].abs().max().item() <= BF16_TOLERANCE


def test_both_forms_are_proven_and_timed_at_the_goal_shape():
    for name in ("flashinfer", "flashinfer-two-phase"):
        assert proof.prove_attention(name, CUDA, torch.bfloat16, head_dim=128) is None
    chosen, seconds = proof.faster(["flashinfer", "flashinfer-two-phase"], CUDA, torch.bfloat16, 128)
    print(f"one layer's attention at the goal shape: {seconds} → {chosen}")  # the figure docs/gpu need
    assert chosen in seconds and all(s > 0 for s in seconds.values())
