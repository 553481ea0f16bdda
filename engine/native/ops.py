"""The element-wise kernels of the native decoder layers behind one interface, chosen per device.

`TorchOps` runs everywhere and computes exactly what transformers' Llama/Qwen modules compute (RMSNorm
in float32, the residual added in the model's dtype, RoPE as q·cos + rotate_half(q)·sin with cos/sin
cast to the model's dtype, silu(gate)·up), so fp32 results equal plain transformers'. `FlashInferOps`
runs FlashInfer's fused CUDA kernels (the ones SGLang's layers call): RMSNorm with the residual add
fused in place, RoPE in place from the float32 cache, SiLU·mul in one pass, and the q/k norms written in
place into the QKV projection's output, so q, k and v stay views of it and the attention copies none of them.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

OPS_MODULE = "flashinfer"  # what FlashInferOps imports


class Ops(Protocol):
    """RMSNorm (+ residual), RoPE in place, SiLU·mul over [tokens, features] tensors."""

    name: str

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm of every row of x [..., features] times weight [features]."""
        ...

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(rms_norm(residual + x) * weight, residual + x) of [tokens, hidden] rows; may reuse x and residual."""
        ...

    def rope_tables(self, positions: torch.Tensor, cos_sin: torch.Tensor, dtype: torch.dtype) -> object:
        """What rope() reads for a batch's positions [tokens] from the float32 cache [max_position + 1, head_dim]
        (cos half, sin half); made once per forward and shared by every layer."""
        ...

    def rope(
        self,
        tables: object,  # rope_tables(positions, cos_sin, dtype)
        q: torch.Tensor,  # [tokens, heads * head_dim], rows may be strided
        k: torch.Tensor,  # [tokens, kv_heads * head_dim]
        head_dim: int,
    ) -> None:
        """Rotate q and k in place (neox layout: the two halves of each head are rotated together)."""
        ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of gate_up [tokens, 2 * intermediate] → [tokens, intermediate]."""
        ...

    def qk_norm_rope(
        self,
        tables: object,  # rope_tables(positions, cos_sin, dtype)
        q: torch.Tensor,  # [tokens, heads * head_dim], rows may be strided (a view of the QKV output)
        k: torch.Tensor,  # [tokens, kv_heads * head_dim]
        norms: tuple | None,  # (q_weight [head_dim], k_weight [head_dim], eps) of per-head RMSNorms, or None
        head_dim: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-head q/k RMSNorms (when given), then RoPE: (q, k), the given views rotated in place, or
        new tensors where the norms do not write in place."""
        ...


def _qk_norm_rope(ops, tables, q, k, norms, head_dim):
    """qk_norm_rope from rms_norm and rope: the norms' outputs are new tensors, rotated in place."""
    if norms is not None:
        q_weight, k_weight, eps = norms
        tokens = q.shape[0]
        q = ops.rms_norm(q.reshape(tokens, -1, head_dim), q_weight, eps).view(tokens, -1)
        k = ops.rms_norm(k.reshape(tokens, -1, head_dim), k_weight, eps).view(tokens, -1)
    ops.rope(tables, q, k, head_dim)
    return q, k


class TorchOps:
    """Plain torch, the formulas of transformers' modules (exact against them in float32)."""

    name = "torch"

    def rms_norm(self, x, weight, eps):
        dtype = x.dtype
        hidden = x.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        hidden = hidden * torch.rsqrt(variance + eps)
        return weight * hidden.to(dtype)

    def add_rms_norm(self, x, residual, weight, eps):
        residual = residual + x  # [tokens, hidden] in the model's dtype, as the decoder layer adds it
        return self.rms_norm(residual, weight, eps), residual

    def rope_tables(self, positions, cos_sin, dtype):
        """(cos, sin), each [tokens, 1, head_dim // 2] in the model's dtype, as transformers casts them."""
        table = cos_sin[positions].to(dtype)  # [tokens, head_dim]
        half = table.shape[-1] // 2
        return table[:, None, :half], table[:, None, half:]

    def rope(self, tables, q, k, head_dim):
        half = head_dim // 2
        cos, sin = tables  # [tokens, 1, half]
        for x in (q, k):
            heads = x.view(x.shape[0], -1, head_dim)  # [tokens, heads, head_dim], a view of x
            first, second = heads[..., :half], heads[..., half:]
            rotated_first = first * cos - second * sin
            rotated_second = second * cos + first * sin
            first.copy_(rotated_first)
            second.copy_(rotated_second)

    def silu_mul(self, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def qk_norm_rope(self, tables, q, k, norms, head_dim):
        return _qk_norm_rope(self, tables, q, k, norms, head_dim)


class FlashInferOps:
    """FlashInfer's norm / rope / activation kernels (CUDA, bfloat16 or float16 activations only: the kernels
    dispatch on 16-bit types, and setup refuses other dtypes)."""

    name = "flashinfer"

    def __init__(self) -> None:
        import flashinfer.activation
        import flashinfer.norm
        import flashinfer.rope

        self._norm = flashinfer.norm
        self._rope = flashinfer.rope
        self._activation = flashinfer.activation
        self._fused = _fused_qk()  # the Triton q/k-norm + RoPE kernel, None without triton

    def rms_norm(self, x, weight, eps):
        # [rows, features], or q/k heads [tokens, heads, head_dim]: the kernel reads strided views, no copy
        if x.dim() in (2, 3):
            return self._norm.rmsnorm(x, weight, eps)
        return self._norm.rmsnorm(x.reshape(-1, x.shape[-1]), weight, eps).view(x.shape)

    def add_rms_norm(self, x, residual, weight, eps):
        self._norm.fused_add_rmsnorm(x, residual, weight, eps)  # residual += x; x = rmsnorm(residual)
        return x, residual

    def rope_tables(self, positions, cos_sin, dtype):
        """The positions and the float32 cache themselves: the kernel reads the cache by position."""
        return positions, cos_sin

    def rope(self, tables, q, k, head_dim):
        positions, cos_sin = tables
        self._rope.apply_rope_with_cos_sin_cache_inplace(positions, q, k, head_dim, cos_sin, is_neox=True)

    def silu_mul(self, gate_up):
        return self._activation.silu_and_mul(gate_up)

    def qk_norm_rope(self, tables, q, k, norms, head_dim):
        """One Triton launch where q and k are the QKV output's adjacent views (engine/native/fused_qk.py);
        else each norm written in place over its heads' strided view (FlashInfer's QK RMSNorm reads and writes
        through strides, each element read before it is written), then RoPE in place: three launches (FlashInfer
        0.6.6 has no fused norm + RoPE). Either way no copy: q and k stay views with v's strides."""
        fused = self._fused
        if fused is not None and fused.runs_on(q) and fused.fusable(q, k, head_dim):
            positions, cos_sin = tables
            fused.qk_norm_rope(q, k, positions, cos_sin, norms, head_dim)
            return q, k
        if norms is not None:
            q_weight, k_weight, eps = norms
            for x, weight in ((q, q_weight), (k, k_weight)):
                heads = x.view(x.shape[0], -1, head_dim)  # [tokens, heads, head_dim], a view
                self._norm.rmsnorm(heads, weight, eps, out=heads)
        self.rope(tables, q, k, head_dim)
        return q, k


def _fused_qk():
    """engine/native/fused_qk.py when triton imports, else None (the three-launch path)."""
    try:
        from score_batch.engine.native import fused_qk
    except Exception:  # noqa: BLE001  (no triton, or a broken one: the unfused path)
        return None
    return fused_qk


OPS_CLASSES: dict[str, type] = {"torch": TorchOps, "flashinfer": FlashInferOps}


def make_ops(name: str, device: torch.device | None = None) -> Ops:
    """The ops of a resolved name ('torch' or 'flashinfer'); neither keeps per-device state."""
    return OPS_CLASSES[name]()
