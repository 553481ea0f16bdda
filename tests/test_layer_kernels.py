"""Kernels per native decoder layer on the FlashInfer-ops path (bench/layer_kernels.py: the torch profiler on the
CPU, FlashInfer's kernels stood in for by tests/flashinfer_stub.py, which keeps their contracts: K and V strides
equal, last dimension contiguous): the attention call copies none of q, k, v (views of the QKV output)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import layer_kernels  # noqa: E402  (bench/layer_kernels.py)

COPIES = {"aten::clone", "aten::copy_", "aten::_to_copy", "aten::contiguous"}


@pytest.fixture
def stub(monkeypatch):
    from tests import flashinfer_stub

    stub = flashinfer_stub.FlashInferStub()
    for name in ("rmsnorm", "fused_add_rmsnorm", "rope", "silu_and_mul"):
        setattr(stub, name, layer_kernels._kernel(name, getattr(stub, name)))
    run = layer_kernels._kernel("prefill", flashinfer_stub._PagedPrefill.run)
    monkeypatch.setattr(flashinfer_stub._PagedPrefill, "run", run)
    return stub.install(monkeypatch)


def test_the_flashinfer_ops_layer_launches_no_copy(stub, tmp_path):
    """Qwen3's layer: fused add + RMSNorm ×2, QKV / O / gate-up / down GEMMs, the q and k norms in place, RoPE,
    the prefill, SiLU·mul: 11 launches (12 before, with a copy of v; Llama's layers: 9, from 12)."""
    layer = layer_kernels.per_layer("qwen3", "flashinfer", tmp_path)
    assert not set(layer) & COPIES, layer
    expected = {"fused_add_rmsnorm": 2, "linear": 4, "rmsnorm": 2, "rope": 1, "prefill": 1, "silu_and_mul": 1}
    assert Counter({name.split("::")[1]: n for name, n in layer.items()}) == Counter(expected)
