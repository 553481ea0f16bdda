"""A stand-in for the `flashinfer` package on the CPU, for the load-time kernel checks (engine/model/proof.py).

Its kernels keep FlashInfer 0.6.6's contracts (16-bit inputs only, last dimension contiguous, RMSNorm of 2-D rows
or 3-D heads read through their strides, a float32 cos/sin cache, the paged prefill's multi-item rule of
engine/attention/flashinfer_plan.kernel_mask) and compute them in torch. Every kernel first asks `build(module)`
for its JIT module, which a test replaces to fail as FlashInfer's does without nvcc; `wrong` names kernels that
compute a wrong result instead.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import torch

from score_batch.engine.attention.flashinfer_plan import kernel_mask
from score_batch.engine.attention.two_phase import merge_lse, ragged_attention

NO_NVCC = (
    "Ninja build failed. Ninja output:\n[1/3] nvcc -c norm.cu\nFAILED: norm.cuda.o\n"
    "RuntimeError: Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't exist"
)


class FlashInferStub:
    """The fake package's state: the build hook, the kernels made wrong, and each norm call's input layout."""

    def __init__(self) -> None:
        # "rmsnorm" (3-D heads read as if contiguous), "silu_and_mul" (10% off), "prefill" (no multi-item mask),
        # "ragged" (the ragged prefill never causal)
        self.wrong: set[str] = set()
        self.norm_inputs: list[tuple] = []  # (data_ptr, shape, strides) of every rmsnorm input
        self.built: list[str] = []

    def build(self, module: str) -> None:
        """FlashInfer's JIT build of a module at its first call (tests replace it to fail)."""
        self.built.append(module)

    def install(self, monkeypatch) -> FlashInferStub:
        """Put the fake package in sys.modules for the test (monkeypatch undoes it)."""
        package = types.ModuleType("flashinfer")
        package.__version__ = "0.6.6-stub"
        package.norm = types.SimpleNamespace(rmsnorm=self.rmsnorm, fused_add_rmsnorm=self.fused_add_rmsnorm)
        package.rope = types.SimpleNamespace(apply_rope_with_cos_sin_cache_inplace=self.rope)
        package.activation = types.SimpleNamespace(silu_and_mul=self.silu_and_mul)
        stub = self

        class Wrapper(_PagedPrefill):
            def __init__(self, workspace, kv_layout="NHD", backend="fa2"):
                super().__init__(stub)

        class Ragged(_RaggedPrefill):
            def __init__(self, workspace, kv_layout="NHD", backend="auto"):
                super().__init__(stub)

        package.BatchPrefillWithPagedKVCacheWrapper = Wrapper
        package.BatchPrefillWithRaggedKVCacheWrapper = Ragged
        package.merge_state_in_place = self.merge_state_in_place
        monkeypatch.setitem(sys.modules, "flashinfer", package)
        for name in ("norm", "rope", "activation"):
            monkeypatch.setitem(sys.modules, f"flashinfer.{name}", getattr(package, name))
        return self

    def rmsnorm(self, input, weight, eps=1e-6, out=None, enable_pdl=None):
        self.build("norm")
        _check_16bit(input)
        assert input.dim() in (2, 3) and input.stride(-1) == 1, (
            "rmsnorm takes 2-D or 3-D, last dim contiguous"
        )
        self.norm_inputs.append((input.data_ptr(), tuple(input.shape), input.stride()))
        if "rmsnorm" in self.wrong and input.dim() == 3:  # a layout bug: heads read as if contiguous
            input = torch.as_strided(
                input, input.shape, torch.empty(input.shape).stride(), input.storage_offset()
            )
        result = _rms(input.float(), weight.float(), eps).to(input.dtype)
        if out is None:
            return result
        assert out.shape == input.shape and out.stride(-1) == 1, "out: the input's shape, last dim contiguous"
        return out.copy_(
            result
        )  # through out's strides (FlashInfer's QK RMSNorm writes them), in place or not

    def fused_add_rmsnorm(self, input, residual, weight, eps=1e-6, enable_pdl=None):
        self.build("norm")
        _check_16bit(input)
        residual += input
        input.copy_(_rms(residual.float(), weight.float(), eps))

    def rope(self, positions, query, key, head_size, cos_sin_cache, is_neox=True):
        self.build("rope")
        assert cos_sin_cache.dtype == torch.float32 and is_neox
        table = cos_sin_cache[positions]  # [tokens, head_size]
        half = head_size // 2
        cos, sin = table[:, None, :half], table[:, None, half:]
        for x in (query, key):
            heads = x.view(x.shape[0], -1, head_size)  # a view: rows may be strided
            first, second = heads[..., :half].float(), heads[..., half:].float()
            heads.copy_(torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1))

    def merge_state_in_place(self, v, s, v_other, s_other, mask=None):
        self.build("cascade")
        _check_16bit(v)
        assert s.dtype == s_other.dtype == torch.float32 and v.is_contiguous() and v_other.is_contiguous()
        rows = torch.ones(v.shape[0], dtype=torch.bool) if mask is None else mask.bool()
        merge_lse(v, s, v_other, s_other, rows)

    def silu_and_mul(self, input, out=None, enable_pdl=None):
        self.build("activation")
        _check_16bit(input)
        gate, up = input.float().chunk(2, dim=-1)
        result = torch.nn.functional.silu(gate) * up * (1.1 if "silu_and_mul" in self.wrong else 1.0)
        return result.to(input.dtype)


class _PagedPrefill:
    """BatchPrefillWithPagedKVCacheWrapper: plan() keeps the metadata, run() attends over the gathered pages
    under the multi-item rule (plain causal when the stub's `wrong` holds "prefill"), GQA heads repeated."""

    def __init__(self, stub: FlashInferStub) -> None:
        self.stub = stub

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, sm_scale=None, prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0,
             max_item_len_ptr=None, **kwargs):  # fmt: skip
        self.stub.build("batch_prefill")
        assert page_size == 1 and kwargs["causal"] and kwargs["pos_encoding_mode"] == "NONE"
        self.qo, self.kv = qo_indptr.tolist(), kv_indptr.tolist()
        self.indices = kv_indices.long()
        self.scale = sm_scale if sm_scale is not None else head_dim**-0.5
        multi_item = prefix_len_ptr is not None and "prefill" not in self.stub.wrong
        self.prefix = prefix_len_ptr.long().tolist() if multi_item else None
        self.positions, self.width = token_pos_in_items_ptr, token_pos_in_items_len

    def run(self, q, paged_kv_cache, out=None):
        self.stub.build("batch_prefill")
        _check_16bit(q)
        assert q.stride(-1) == 1, "q: last dim contiguous (FlashInfer reads its token and head strides)"
        k_cache, v_cache = paged_kv_cache
        assert k_cache.stride() == v_cache.stride(), (
            "k/v strides differ (FlashInfer's paged run refuses them)"
        )
        k_pages, v_pages = (t[:, 0] for t in paged_kv_cache)  # [pages, kv_heads, d]
        group = q.shape[1] // k_pages.shape[1]
        out = torch.empty_like(q) if out is None else out
        for i in range(len(self.qo) - 1):
            rows = slice(self.qo[i], self.qo[i + 1])
            pages = self.indices[self.kv[i] : self.kv[i + 1]]
            qo, kv = rows.stop - rows.start, len(pages)
            if self.prefix is None:
                mask = kernel_mask(kv, np.zeros(0, dtype=np.int64), qo, kv)  # plain causal
            else:
                positions = self.positions[i * self.width : (i + 1) * self.width].long().numpy()
                mask = kernel_mask(self.prefix[i], positions, qo, kv)
            k = k_pages[pages].repeat_interleave(group, dim=1).float()  # [kv, heads, d]
            v = v_pages[pages].repeat_interleave(group, dim=1).float()
            scores = torch.einsum("qhd,khd->hqk", q[rows].float(), k) * self.scale
            scores = scores.masked_fill(~torch.from_numpy(mask)[None], float("-inf"))
            out[rows] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).to(out.dtype)
        return out


class _RaggedPrefill:
    """BatchPrefillWithRaggedKVCacheWrapper: plan() keeps the indptrs (host tensors), run() attends each request's
    rows over its keys (causal aligned bottom-right; "ragged" in `wrong`: never causal) with the LSE."""

    def __init__(self, stub: FlashInferStub) -> None:
        self.stub = stub

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, causal=False,
             pos_encoding_mode="NONE", sm_scale=None, q_data_type=None, kv_data_type=None):  # fmt: skip
        self.stub.build("batch_prefill_ragged")
        assert (
            qo_indptr.device.type == "cpu" and qo_indptr.dtype == torch.int32 and pos_encoding_mode == "NONE"
        )
        self.qo, self.kv = qo_indptr.numpy(), kv_indptr.numpy()
        self.causal, self.scale = causal and "ragged" not in self.stub.wrong, sm_scale
        self.heads = (num_qo_heads, num_kv_heads, head_dim_qk)

    def run(self, q, k, v, out=None, lse=None, return_lse=False):
        self.stub.build("batch_prefill_ragged")
        _check_16bit(q)
        assert q.stride(-1) == 1 and k.stride() == v.stride(), "last dim contiguous; equal K/V strides"
        assert (q.shape[0], k.shape[0]) == (self.qo[-1], self.kv[-1]) and (*q.shape[1:], k.shape[1]) == (
            self.heads[0],
            self.heads[2],
            self.heads[1],
        ), "q and K/V rows as planned"
        result, row_lse = ragged_attention(q, k, v, self.qo, self.kv, self.causal, self.scale)
        out = result if out is None else out.copy_(result)
        lse = row_lse if lse is None else lse.copy_(row_lse)
        return (out, lse) if return_lse else out


def _check_16bit(x: torch.Tensor) -> None:
    assert x.dtype in (torch.bfloat16, torch.float16), (
        f"FlashInfer's kernels dispatch on 16-bit types, not {x.dtype}"
    )


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
