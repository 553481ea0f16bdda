"""The native decoder layers' kernels on CUDA: FlashInferOps equal TorchOps (RMSNorm, fused add + RMSNorm,
RoPE in place from the float32 cos/sin cache, SiLU·mul), and native layers with either ops score as fp32
plain HF."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.need import need_gpu

pytestmark = pytest.mark.gpu
need_gpu("flashinfer")


from tests.gpu.common import BF16_VS_FP32, CUDA, MODEL, hf_reference, max_diff, scorer, token_groups  # noqa: E402

BF16_OPS = dict(rtol=2e-2, atol=2e-2)  # two bf16 roundings of the same float32 arithmetic


@pytest.fixture(scope="module")
def ops():
    from score_batch.engine.native.ops import make_ops

    return make_ops("torch", CUDA), make_ops("flashinfer", CUDA)


@pytest.fixture(scope="module")
def model_dir(zoo):
    return zoo.get("qwen3", "causal", **MODEL)


def test_flashinfer_norms_equal_torch_norms(ops):
    reference, fused = ops
    torch.manual_seed(0)
    x, residual = torch.randn(2, 333, 1024, device=CUDA, dtype=torch.bfloat16).unbind(0)  # [tokens, hidden]
    weight = torch.rand(1024, device=CUDA, dtype=torch.bfloat16) + 0.5
    torch.testing.assert_close(
        fused.rms_norm(x.clone(), weight, 1e-6), reference.rms_norm(x, weight, 1e-6), **BF16_OPS
    )
    got = fused.add_rms_norm(x.clone(), residual.clone(), weight, 1e-6)  # in place on its inputs
    want = reference.add_rms_norm(x.clone(), residual.clone(), weight, 1e-6)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **BF16_OPS)
    heads = x[:, :256].reshape(333, 2, 128)  # q/k norms: rows of strided heads
    torch.testing.assert_close(
        fused.rms_norm(heads, weight[:128], 1e-6), reference.rms_norm(heads, weight[:128], 1e-6), **BF16_OPS
    )


def test_flashinfer_rope_and_silu_mul_equal_torch(ops):
    reference, fused = ops
    torch.manual_seed(1)
    positions = torch.cat([torch.arange(300), torch.arange(299, 340), torch.arange(299, 320)]).to(
        CUDA
    )  # restarts
    tokens, d = positions.shape[0], 128
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=CUDA, dtype=torch.float32) / d))
    angles = torch.arange(512, device=CUDA, dtype=torch.float32)[:, None] * inv_freq  # [positions, d / 2]
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)  # [positions, d] float32: cos half, sin half
    qkv = torch.randn(tokens, (16 + 2 * 8) * d, device=CUDA, dtype=torch.bfloat16)  # strided q and k views
    results = []
    for kernel in (reference, fused):
        q, k, _ = qkv.clone().split([16 * d, 8 * d, 8 * d], dim=-1)
        kernel.rope(kernel.rope_tables(positions, cos_sin, q.dtype), q, k, d)
        results.append((q, k))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, **BF16_OPS)
    gate_up = torch.randn(tokens, 2 * 3072, device=CUDA, dtype=torch.bfloat16)
    torch.testing.assert_close(fused.silu_mul(gate_up), reference.silu_mul(gate_up), **BF16_OPS)


def test_flashinfer_qk_norms_and_rope_in_place_equal_torch_and_leave_views(ops):
    """The q/k norms written in place into the QKV output, then RoPE: equal to TorchOps, and q, k stay views of
    the QKV output with v's strides (what FlashInfer's paged run needs of K and V: no copy before attention)."""
    reference, fused = ops
    torch.manual_seed(2)
    tokens, d = 777, 128
    positions = torch.arange(tokens, device=CUDA) % 500
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=CUDA, dtype=torch.float32) / d))
    angles = torch.arange(512, device=CUDA, dtype=torch.float32)[:, None] * inv_freq
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)  # [positions, d] float32
    qkv = torch.randn(tokens, (16 + 2 * 8) * d, device=CUDA, dtype=torch.bfloat16)
    weights = torch.rand(2, d, device=CUDA, dtype=torch.bfloat16) + 0.5
    results = []
    for kernel in (reference, fused):
        buffer = qkv.clone()
        q, k, v = buffer.split([16 * d, 8 * d, 8 * d], dim=-1)
        tables = kernel.rope_tables(positions, cos_sin, q.dtype)
        q2, k2 = kernel.qk_norm_rope(tables, q, k, (weights[0], weights[1], 1e-6), d)
        results.append((q2, k2))
        if kernel is fused:
            assert q2.data_ptr() == buffer.data_ptr() and k2.stride() == v.stride()  # views, in place
    import importlib.util

    if importlib.util.find_spec("triton") is not None:  # torch's CUDA wheels bring it: one fused launch
        assert fused._fused is not None and fused._fused.fusable(q, k, d)
    exact = _qk_norm_rope_fp32(qkv, weights, positions, cos_sin, d)
    for a, b, e in zip(*results, exact):
        # The fused kernel rounds once, from float32: within one bf16 step of the float32 result. TorchOps
        # rounds as transformers does, after the norm, the cos/sin and each product (2026-11-28, H200: 2 of 1.6M
        # elements 0.025 from the fused ones): within four roundings of the largest normed value.
        assert ((b.float() - e).abs() <= e.abs() * 2**-7 + 1e-6).all()
        torch.testing.assert_close(a.float(), e, rtol=0, atol=4 * 2**-8 * float(e.abs().max()))


def _qk_norm_rope_fp32(qkv, weights, positions, cos_sin, d):
    """The q/k per-head RMSNorms and neox RoPE in float32 from the bf16 QKV output: (q, k) [tokens, heads * d]."""
    tokens, half = qkv.shape[0], d // 2
    table = cos_sin[positions][:, None]  # [tokens, 1, d]
    cos, sin = table[..., :half], table[..., half:]
    out = []
    for x, w in ((qkv[:, : 16 * d], weights[0]), (qkv[:, 16 * d : 24 * d], weights[1])):
        heads = x.float().view(tokens, -1, d)  # [tokens, heads, d]
        normed = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
        first, second = normed[..., :half], normed[..., half:]
        out.append(torch.cat([first * cos - second * sin, second * cos + first * sin], -1).view(tokens, -1))
    return out


@pytest.mark.parametrize("kind", ["torch", "flashinfer"])
def test_native_layers_score_as_fp32_plain_hf(model_dir, kind):
    groups = token_groups(9, groups=3, query=(100, 300), items=5, item=(1, 130))
    run = scorer(
        model_dir, "flashinfer", layers="native", ops=kind
    )  # a refusal fails: both must run on a GPU
    assert run.setup.layers == "native" and run.setup.ops == kind
    assert max_diff(run.score(groups), hf_reference(model_dir, groups)) <= BF16_VS_FP32
