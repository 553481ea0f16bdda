"""The element-wise kernels of the native decoder layers behind one interface, chosen per device.

`TorchOps` runs everywhere and computes exactly what transformers' Llama/Qwen modules compute (RMSNorm
in float32, the residual added in the model's dtype, RoPE as q·cos + rotate_half(q)·sin with cos/sin
cast to the model's dtype, silu(gate)·up), so fp32 results equal plain transformers'. `FlashInferOps`
runs FlashInfer's fused CUDA kernels (the ones SGLang's layers call): RMSNorm with the residual add
fused in place, RoPE in place from the float32 cos/sin cache, SiLU·mul in one pass.
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

    def rope(
        self,
        positions: torch.Tensor,  # [tokens] int64
        q: torch.Tensor,  # [tokens, heads * head_dim], rows may be strided
        k: torch.Tensor,  # [tokens, kv_heads * head_dim]
        cos_sin: torch.Tensor,  # [max_position + 1, head_dim] float32: cos half, sin half
        head_dim: int,
    ) -> None:
        """Rotate q and k in place (neox layout: the two halves of each head are rotated together)."""
        ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of gate_up [tokens, 2 * intermediate] → [tokens, intermediate]."""
        ...


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

    def rope(self, positions, q, k, cos_sin, head_dim):
        half = head_dim // 2
        table = cos_sin[positions].to(q.dtype)  # [tokens, head_dim]
        cos, sin = table[:, None, :half], table[:, None, half:]  # [tokens, 1, half]
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


class FlashInferOps:
    """FlashInfer's norm / rope / activation kernels (CUDA, 16-bit and float32 activations)."""

    name = "flashinfer"

    def __init__(self) -> None:
        import flashinfer.activation
        import flashinfer.norm
        import flashinfer.rope

        self._norm = flashinfer.norm
        self._rope = flashinfer.rope
        self._activation = flashinfer.activation

    def rms_norm(self, x, weight, eps):
        rows = x.reshape(-1, x.shape[-1])  # [rows, features]; a copy only for strided q/k heads
        return self._norm.rmsnorm(rows, weight, eps).view(x.shape)

    def add_rms_norm(self, x, residual, weight, eps):
        self._norm.fused_add_rmsnorm(x, residual, weight, eps)  # residual += x; x = rmsnorm(residual)
        return x, residual

    def rope(self, positions, q, k, cos_sin, head_dim):
        self._rope.apply_rope_with_cos_sin_cache_inplace(positions, q, k, head_dim, cos_sin, is_neox=True)

    def silu_mul(self, gate_up):
        return self._activation.silu_and_mul(gate_up)


OPS_CLASSES: dict[str, type] = {"torch": TorchOps, "flashinfer": FlashInferOps}


def make_ops(name: str, device: torch.device | None = None) -> Ops:
    """The ops of a resolved name ('torch' or 'flashinfer'); neither keeps per-device state."""
    return OPS_CLASSES[name]()
