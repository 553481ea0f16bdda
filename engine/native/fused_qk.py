"""One Triton kernel for the per-head q/k RMSNorms and RoPE, in place in the QKV projection's output (CUDA).

FlashInfer 0.6.6 has no fused q/k-norm + RoPE: its path is three launches (q norm, k norm, RoPE), each reading and
writing q and k. This kernel reads each head of q and k once, normalizes it in float32 (times its weight),
rotates it (neox halves, cos/sin from the float32 cache at the token's position) and writes it back once,
rounded once. One program per (token, head); q's heads then k's heads are adjacent in a QKV row, so both are
one strided [tokens, heads + kv_heads, head_dim] view. Imported only where triton is; engine/model/proof.py checks it
against TorchOps at load, so a wrong result falls back instead of scoring.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's interpreter: CPU tensors (tests, counts)


@triton.jit
def _qk_norm_rope(
    qk_ptr,  # first element of q's first head; k's heads follow q's in every row
    q_weight_ptr,
    k_weight_ptr,
    positions_ptr,  # [tokens] int64
    cos_sin_ptr,  # [max_position + 1, head_dim] float32: cos half, sin half
    row_stride,  # elements between two tokens' rows
    q_heads,
    eps,
    HALF: tl.constexpr,  # head_dim // 2, a power of two
    NORM: tl.constexpr,
):
    token = tl.program_id(0)
    head = tl.program_id(1)
    half = tl.arange(0, HALF)
    base = qk_ptr + token.to(tl.int64) * row_stride + head * (2 * HALF)
    first = tl.load(base + half).to(tl.float32)
    second = tl.load(base + HALF + half).to(tl.float32)
    if NORM:
        is_q = head < q_heads
        weight_ptr = tl.where(is_q, q_weight_ptr, k_weight_ptr)
        mean_square = (tl.sum(first * first, axis=0) + tl.sum(second * second, axis=0)) / (2 * HALF)
        scale = 1.0 / tl.sqrt(mean_square + eps)
        first = first * scale * tl.load(weight_ptr + half).to(tl.float32)
        second = second * scale * tl.load(weight_ptr + HALF + half).to(tl.float32)
    position = tl.load(positions_ptr + token)
    table = cos_sin_ptr + position * (2 * HALF)
    cos = tl.load(table + half)
    sin = tl.load(table + HALF + half)
    tl.store(base + half, (first * cos - second * sin).to(qk_ptr.dtype.element_ty))
    tl.store(base + HALF + half, (second * cos + first * sin).to(qk_ptr.dtype.element_ty))


def runs_on(x: torch.Tensor) -> bool:
    """Whether the kernel runs on x's device: CUDA, or any device under Triton's interpreter."""
    return x.is_cuda or INTERPRETED


def fusable(q: torch.Tensor, k: torch.Tensor, head_dim: int) -> bool:
    """Whether q [tokens, heads * head_dim] and k are rows of one buffer with k's heads right after q's (the QKV
    output's views), the last dimension contiguous and head_dim a power of two."""
    return (
        q.dim() == 2
        and q.stride(1) == 1
        and k.stride() == q.stride()
        and k.dtype == q.dtype
        and head_dim & (head_dim - 1) == 0
        and k.data_ptr() == q.data_ptr() + q.shape[1] * q.element_size()
    )


def qk_norm_rope(
    q: torch.Tensor,  # [tokens, heads * head_dim], a view of the QKV output
    k: torch.Tensor,  # [tokens, kv_heads * head_dim], right after q in every row
    positions: torch.Tensor,  # [tokens] int64
    cos_sin: torch.Tensor,  # [max_position + 1, head_dim] float32
    norms: tuple | None,  # (q_weight, k_weight, eps) or None: RoPE alone
    head_dim: int,
) -> None:
    """The q/k RMSNorms (when given) and RoPE, in place, in one launch (fusable(q, k, head_dim) must hold)."""
    tokens = q.shape[0]
    q_heads, kv_heads = q.shape[1] // head_dim, k.shape[1] // head_dim
    q_weight, k_weight, eps = norms if norms is not None else (cos_sin, cos_sin, 0.0)  # unread without NORM
    _qk_norm_rope[(tokens, q_heads + kv_heads)](
        q,
        q_weight,
        k_weight,
        positions,
        cos_sin,
        q.stride(0),
        q_heads,
        float(eps),
        HALF=head_dim // 2,
        NORM=norms is not None,
    )
