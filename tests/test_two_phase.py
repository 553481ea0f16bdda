"""The two-phase attention (engine/attention/two_phase.py) against the dense multi-item mask (sdpa) in float32 on
mixed packs; its FlashInfer glue on the CPU through tests/flashinfer_stub.py (ragged prefills + merge_state), the
load-time proof catching a wrong ragged kernel, and auto's race at load choosing the faster proven backend."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from score_batch.engine import EngineConfig, SettingError
from score_batch.engine.attention import registry
from score_batch.engine.attention.sdpa import SdpaBackend
from score_batch.engine.attention.two_phase import own_segments, reference_plan, two_phase_layout
from score_batch.engine.model import proof, setup
from score_batch.engine.plan.batching import collate
from score_batch.engine.plan.packing import DELIMITER_SEGMENT, ItemRef, mis_pack, single_pack
from tests.flashinfer_stub import FlashInferStub

CPU = torch.device("cpu")
BOUND = 1e-6  # the float32 two-phase form vs the exact mask, rows that are read


def _pack(rng, query_len: int, item_lens) -> object:
    items = [rng.integers(0, 100, n).tolist() for n in item_lens]
    return mis_pack(list(range(query_len)), items, [ItemRef(0, i) for i in range(len(items))], 99)


def _difference(batch, heads=(2, 1), head_dim=8, seed=0) -> float:
    """Largest |two-phase − mask| over the batch's non-delimiter rows: float32 inputs and arithmetic against the
    dense mask (sdpa) in float64 on the same inputs, GQA. (Against the float32 mask the two differ by up to
    ~1.7e-6 on a 3,000-token query, the float32 mask's own rounding there reaching ~1.2e-6.)"""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, h, batch.num_tokens, head_dim, generator=generator) for h in (*heads, heads[1]))
    got = reference_plan(batch, CPU).attend(q, k, v, head_dim**-0.5, None)
    mask = SdpaBackend(CPU).plan(batch, CPU)
    exact = mask.attend(q.double(), k.double(), v.double(), head_dim**-0.5, None)
    rows = torch.from_numpy(batch.segments != DELIMITER_SEGMENT)
    return (got.double() - exact)[:, rows].abs().max().item()


def test_segments_tile_the_rows_query_items_and_delimiters():
    # query 3, D, item 2 + D, empty item's D, item 1 + D; then a plain sequence of 4
    batch = collate([mis_pack([1, 2, 3], [[5, 6], [], [7]], [ItemRef(0, i) for i in range(3)], 9),
                     single_pack([1, 2, 3, 4], ItemRef(1, 0))])  # fmt: skip
    assert own_segments(batch.segments, batch.cu_seqlens).tolist() == [0, 3, 4, 7, 8, 10, 14]
    layout = two_phase_layout(batch)
    assert layout.cross_qo_indptr.tolist() == [0, 3, 10, 14]  # query rows, the rest, the plain sequence
    assert layout.cross_kv_indptr.tolist() == [0, 1, 4, 5]  # a dummy key, the query's 3, a dummy key
    assert layout.cross_kv_index.tolist() == [0, 0, 1, 2, 10]
    assert layout.merged_rows.tolist() == [False] * 3 + [True] * 7 + [False] * 4


def test_extremes_equal_the_mask_in_float32():
    rng = np.random.default_rng(1)
    batch = collate(
        [_pack(rng, 3000, [1, 17, 4]), _pack(rng, 1, rng.integers(1, 6, 200)), _pack(rng, 2, [500])]
    )
    assert _difference(batch) <= BOUND


@pytest.mark.parametrize("seed", [0, 1])
def test_random_mixed_packs_equal_the_mask_in_float32(seed):
    """Several packs per batch: queries of 1–400 tokens, items of 0–60, 1–40 items, a plain sequence."""
    rng = np.random.default_rng(seed)
    packs = [
        _pack(rng, int(rng.integers(1, 400)), rng.integers(0, 60, int(rng.integers(1, 40)))) for _ in range(3)
    ]
    packs.append(single_pack(rng.integers(0, 100, int(rng.integers(1, 50))).tolist(), ItemRef(9, 0)))
    assert _difference(collate(packs), heads=(4, 2), seed=seed) <= BOUND


def test_cached_packs_are_refused():
    from score_batch.engine.plan.packing import cached_mis_pack

    with pytest.raises(ValueError, match="QueryCache"):
        two_phase_layout(collate([cached_mis_pack(3, [[1]], [ItemRef(0, 0)], 9, key=0)]))


@pytest.fixture
def stub(monkeypatch) -> FlashInferStub:
    return FlashInferStub().install(monkeypatch)


def test_flashinfer_glue_is_proven_and_a_wrong_ragged_kernel_is_caught(stub):
    assert proof.prove_attention("flashinfer-two-phase", CPU, torch.bfloat16, head_dim=32) is None
    assert {"batch_prefill_ragged", "cascade"} <= set(stub.built)
    stub.wrong.add("ragged")
    cause = proof.prove_attention("flashinfer-two-phase", CPU, torch.bfloat16, head_dim=32)
    assert cause is not None and cause.startswith(
        "flashinfer-two-phase attention differs from float32 sdpa's"
    )


def _cuda_like(model_dir, backend: str):
    _, resolved = setup.load_planner(model_dir, EngineConfig(device="cpu", dtype="bfloat16", backend="sdpa"))
    return dataclasses.replace(resolved, backend=backend)


def test_an_explicit_two_phase_backend_that_fails_its_proof_exits_2(stub, qwen3_causal):
    stub.wrong.add("ragged")
    config = EngineConfig(device="cpu", backend="flashinfer-two-phase")
    with pytest.raises(SettingError, match="failed its check on cpu at load: flashinfer-two-phase attention"):
        setup.prove_setup(_cuda_like(qwen3_causal, "flashinfer-two-phase"), config)


def test_auto_keeps_the_mask_path_and_races_only_listed_rivals(stub, qwen3_causal, monkeypatch):
    resolved = _cuda_like(qwen3_causal, "flashinfer")
    assert registry.AUTO_RIVALS["flashinfer"] == ()  # today: the mask path, until a GPU measures otherwise
    assert registry.BACKEND_CLASSES["flashinfer-two-phase"].capabilities.auto_devices == frozenset()
    monkeypatch.setattr(registry, "AUTO_RIVALS", {"flashinfer": ("flashinfer-two-phase",)})
    monkeypatch.setattr(registry, "import_failure", lambda module: None)
    monkeypatch.setattr(setup, "why_not", lambda name, need, import_error: None)  # the CPU stands in for CUDA
    times = {"flashinfer": 2e-3, "flashinfer-two-phase": 1e-3}
    monkeypatch.setattr(proof, "faster", lambda names, *a: (min(names, key=times.get), times))
    assert setup._raced("flashinfer", resolved, EngineConfig(device="cpu")) == "flashinfer-two-phase"
    # the load's proof keeps the faster: a CUDA setup (its kernels' proofs stood in for)
    on_cuda = dataclasses.replace(resolved, device=torch.device("cuda"))
    prove_attention = proof.prove_attention
    monkeypatch.setattr(proof, "prove_attention", lambda *args, **kwargs: None)
    proven = setup.prove_setup(on_cuda, EngineConfig(device="cpu"))
    assert (
        proven.backend == "flashinfer-two-phase" and proven.fallbacks == () and not proven.limits.cache_query
    )
    monkeypatch.setattr(proof, "prove_attention", prove_attention)
    stub.wrong.add("ragged")  # a rival that fails its proof is not raced
    assert setup._raced("flashinfer", resolved, EngineConfig(device="cpu")) == "flashinfer"
